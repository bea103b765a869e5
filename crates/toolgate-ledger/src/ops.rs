//! Write operations as the writer task receives them. Callers encode JSON and copy what the
//! writer needs before queueing, so the writer spends its time on SQL, not on serialization.

use tokio::sync::oneshot;
use toolgate_core::{SecretName, TenantId, Timestamp};

use crate::error::LedgerError;
use crate::model::{
    Agent, CredentialRecord, FinishCall, NewAuditEvent, NewCall, PendingInvocation, Permission,
    PolicyDecisionRecord, RecordOutcome, ResolvePending, RunRecord, Tenant, TokenRecord,
    ToolCallRecord,
};
use crate::rows::manifest_json;

/// A message to the writer task.
#[derive(Debug)]
pub(crate) enum Command {
    /// Run this write in the next batch.
    Write(WriteOp),
    /// Finish every write queued so far, stop accepting writes, close the connection, then
    /// answer.
    Close(oneshot::Sender<()>),
}

/// One write and where its answer goes once its batch has committed.
#[derive(Debug)]
pub(crate) struct WriteOp {
    pub(crate) kind: OpKind,
    pub(crate) reply: oneshot::Sender<Result<Reply, LedgerError>>,
}

/// What to write.
#[derive(Debug)]
pub(crate) enum OpKind {
    CreateTenant(Tenant),
    CreateAgent(Agent),
    CreateToken(TokenRecord),
    RevokeToken(String),
    PutPermission(Permission),
    SetFlag {
        tenant: TenantId,
        flag: String,
        enabled: bool,
        at: Timestamp,
    },
    PutPolicySet {
        tenant: TenantId,
        text: String,
        created_by: String,
        at: Timestamp,
    },
    CreateRun {
        run: RunRecord,
        manifest: String,
    },
    RecordCall(Box<PreparedCall>),
    /// `Store::retry_call`: the call row is rewritten only at the observed evaluation.
    RetryCall {
        prepared: Box<PreparedCall>,
        observed_evaluation: i64,
    },
    FinishCall(Box<PreparedFinish>),
    PurgeAnswers {
        now: Timestamp,
        limit: u32,
    },
    AppendEvents(Vec<PreparedEvent>),
    PutCredential(Box<CredentialRecord>),
    ResolvePending(Box<(ResolvePending, Vec<PreparedEvent>)>),
    AddPending(Box<(PreparedPending, Vec<PreparedEvent>)>),
    DeleteCredential {
        tenant: TenantId,
        name: SecretName,
    },
    ReplaceSealed {
        tenant: TenantId,
        name: SecretName,
        expected: String,
        value: String,
        key_id: String,
        at: Timestamp,
    },
}

/// A successful write's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    Done,
    Version(i64),
    Recorded(Box<RecordOutcome>),
    Finished(bool),
    Count(u64),
}

impl Reply {
    pub(crate) fn done(self) -> Result<(), LedgerError> {
        match self {
            Reply::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    pub(crate) fn version(self) -> Result<i64, LedgerError> {
        match self {
            Reply::Version(version) => Ok(version),
            other => Err(unexpected(&other)),
        }
    }

    pub(crate) fn recorded(self) -> Result<RecordOutcome, LedgerError> {
        match self {
            Reply::Recorded(outcome) => Ok(*outcome),
            other => Err(unexpected(&other)),
        }
    }

    pub(crate) fn count(self) -> Result<u64, LedgerError> {
        match self {
            Reply::Count(count) => Ok(count),
            other => Err(unexpected(&other)),
        }
    }

    pub(crate) fn finished(self) -> Result<bool, LedgerError> {
        match self {
            Reply::Finished(finished) => Ok(finished),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(reply: &Reply) -> LedgerError {
    LedgerError::Database(format!("internal: unexpected writer reply {reply:?}"))
}

/// An audit event with its payload already encoded: exactly the text that is hashed and stored.
#[derive(Clone, Debug)]
pub(crate) struct PreparedEvent {
    pub(crate) tenant: String,
    pub(crate) kind: String,
    pub(crate) run: Option<String>,
    pub(crate) tool_call_id: Option<String>,
    pub(crate) payload: String,
    pub(crate) at: i64,
}

impl PreparedEvent {
    pub(crate) fn new(event: NewAuditEvent) -> PreparedEvent {
        PreparedEvent {
            tenant: event.tenant.as_str().to_owned(),
            kind: event.kind,
            run: event.run.map(|run| run.as_str().to_owned()),
            tool_call_id: event.tool_call_id.map(|id| id.as_str().to_owned()),
            payload: event.payload.to_string(),
            at: event.at.0,
        }
    }
}

/// [`NewCall`] with its JSON encoded.
#[derive(Debug)]
pub(crate) struct PreparedCall {
    pub(crate) call: ToolCallRecord,
    pub(crate) input: String,
    pub(crate) output: Option<String>,
    pub(crate) count_against_budget: bool,
    pub(crate) decision: Option<(PolicyDecisionRecord, String)>,
    pub(crate) pending: Option<PreparedPending>,
    pub(crate) events: Vec<PreparedEvent>,
}

/// A pending invocation with its arguments, manifest and timeout encoded.
#[derive(Debug)]
pub(crate) struct PreparedPending {
    pub(crate) record: PendingInvocation,
    pub(crate) arguments: String,
    pub(crate) manifest: String,
    /// `timeout_ms`: NULL for the tool's default.
    pub(crate) timeout_ms: Option<i64>,
}

impl PreparedCall {
    pub(crate) fn new(new: NewCall) -> PreparedCall {
        let NewCall {
            call,
            count_against_budget,
            decision,
            pending,
            events,
        } = new;
        PreparedCall {
            input: call.input_redacted.to_string(),
            output: call.output_redacted.as_ref().map(ToString::to_string),
            call,
            count_against_budget,
            decision: decision.map(|decision| {
                let ids = serde_json::Value::from(decision.policy_ids.clone()).to_string();
                (decision, ids)
            }),
            pending: pending.map(PreparedPending::new),
            events: events.into_iter().map(PreparedEvent::new).collect(),
        }
    }
}

impl PreparedPending {
    pub(crate) fn new(record: PendingInvocation) -> PreparedPending {
        PreparedPending {
            arguments: record.arguments.to_string(),
            manifest: manifest_json(&record.manifest),
            timeout_ms: record.timeout.map(timeout_ms),
            record,
        }
    }
}

/// A timeout as stored: whole milliseconds, at least 1 (the column refuses 0), saturating.
fn timeout_ms(timeout: std::time::Duration) -> i64 {
    i64::try_from(timeout.as_millis())
        .unwrap_or(i64::MAX)
        .max(1)
}

/// [`FinishCall`] with its JSON encoded.
#[derive(Debug)]
pub(crate) struct PreparedFinish {
    pub(crate) finish: FinishCall,
    pub(crate) output: Option<String>,
    pub(crate) answer: Option<String>,
    pub(crate) answer_expires_at: Option<i64>,
    pub(crate) events: Vec<PreparedEvent>,
}

impl PreparedFinish {
    pub(crate) fn new(mut finish: FinishCall) -> PreparedFinish {
        let events = std::mem::take(&mut finish.events)
            .into_iter()
            .map(PreparedEvent::new)
            .collect();
        PreparedFinish {
            output: finish.output_redacted.as_ref().map(ToString::to_string),
            answer: finish.answer.as_ref().map(|answer| answer.sealed.clone()),
            answer_expires_at: finish.answer.as_ref().map(|answer| answer.expires_at.0),
            finish,
            events,
        }
    }
}
