//! Write operations as the writer task receives them. Callers encode JSON and copy what the
//! writer needs before queueing, so the writer spends its time on SQL, not on serialization.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value, json};
use tokio::sync::oneshot;
use toolgate_core::{SecretName, TenantId, Timestamp};

use crate::binding::Binding;
use crate::error::LedgerError;
use crate::model::{
    Actor, Agent, AuditChain, CredentialKind, CredentialRecord, FinishCall, KeyChange,
    NewAuditEvent, NewCall, PendingArguments, PendingInvocation, Permission, PolicyDecisionRecord,
    RecordOutcome, ResolvePending, RunRecord, Tenant, TokenRecord, ToolCallRecord,
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

/// What to write. Every administrative operation carries its audit event, which the backends
/// append in the same savepoint as the change (after it, so a refused change writes none).
#[derive(Debug)]
pub(crate) enum OpKind {
    CreateTenant(Tenant, AdminEvent),
    CreateAgent(Agent, AdminEvent),
    CreateToken(TokenRecord, AdminEvent),
    /// `tenant` is the token's (read before queueing; a token's tenant never changes), so the
    /// event's chain is known before the batch locks its chain heads.
    RevokeToken {
        id: String,
        tenant: Option<TenantId>,
        event: AdminEvent,
    },
    PutPermission(Permission, AdminEvent),
    SetFlag {
        tenant: TenantId,
        flag: String,
        enabled: bool,
        at: Timestamp,
        event: AdminEvent,
    },
    /// The event gets the version the transaction assigns.
    PutPolicySet {
        tenant: TenantId,
        text: String,
        created_by: String,
        at: Timestamp,
        event: AdminEvent,
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
    PutCredential(Box<(CredentialRecord, AdminEvent)>),
    ResolvePending(Box<(ResolvePending, Vec<PreparedEvent>)>),
    AddPending(Box<(PreparedPending, Vec<PreparedEvent>)>),
    DeleteCredential {
        tenant: TenantId,
        name: SecretName,
        event: AdminEvent,
    },
    /// The event is written only when the value was replaced.
    ReplaceSealed {
        tenant: TenantId,
        name: SecretName,
        expected: String,
        value: String,
        key_id: String,
        at: Timestamp,
        event: AdminEvent,
    },
    /// A change outside the database (the master key ring): only its event is written.
    RecordKeyChange(AdminEvent),
    /// Re-sealed arguments of a row still pending, only if they are still `expected` (`None`:
    /// clear arguments, which are cleared).
    ReplacePendingArguments {
        tenant: TenantId,
        id: String,
        expected: Option<String>,
        sealed: String,
        key_id: String,
    },
    /// Console sessions and client approval links.
    Console(crate::console::ConsoleOp),
}

impl OpKind {
    /// The audit event of an administrative operation (PostgreSQL locks its chain's head).
    #[cfg(feature = "postgres")]
    pub(crate) fn admin_event(&self) -> Option<&AdminEvent> {
        match self {
            OpKind::CreateTenant(_, event)
            | OpKind::CreateAgent(_, event)
            | OpKind::CreateToken(_, event)
            | OpKind::RevokeToken { event, .. }
            | OpKind::PutPermission(_, event)
            | OpKind::SetFlag { event, .. }
            | OpKind::PutPolicySet { event, .. }
            | OpKind::DeleteCredential { event, .. }
            | OpKind::ReplaceSealed { event, .. }
            | OpKind::RecordKeyChange(event) => Some(event),
            OpKind::PutCredential(credential) => Some(&credential.1),
            OpKind::CreateRun { .. }
            | OpKind::RecordCall(_)
            | OpKind::RetryCall { .. }
            | OpKind::PurgeAnswers { .. }
            | OpKind::FinishCall(_)
            | OpKind::AppendEvents(_)
            | OpKind::ResolvePending(_)
            | OpKind::AddPending(_)
            | OpKind::ReplacePendingArguments { .. }
            | OpKind::Console(_) => None,
        }
    }
}

/// The audit event of an administrative change: which chain it joins, its kind, the acting
/// token's id and what changed. Built here, for both backends, from the change itself and
/// only from fields that are not secret: never a credential's value, never a token's secret
/// or hash. Free text an operator typed (names, labels, references) passes through the
/// redactor, like every other audit payload, in case a credential was pasted into it.
///
/// Boxed: every administrative operation carries one, and operations travel by value through
/// the writer's queue.
#[derive(Clone, Debug)]
pub(crate) struct AdminEvent(Box<AdminEventParts>);

#[derive(Clone, Debug)]
struct AdminEventParts {
    /// The chain id: the tenant's, or the system chain's for changes without a tenant.
    chain: String,
    kind: &'static str,
    payload: Map<String, Value>,
    at: i64,
}

impl AdminEvent {
    fn new(chain: &AuditChain, kind: &'static str, actor: &Actor, details: Value) -> AdminEvent {
        let mut payload = Map::new();
        payload.insert("actor".into(), Value::String(actor.token_id.clone()));
        if let Value::Object(details) = details {
            payload.extend(details);
        }
        AdminEvent(Box::new(AdminEventParts {
            chain: chain.as_str().to_owned(),
            kind,
            payload,
            at: actor.at.0,
        }))
    }

    /// The chain id: the tenant's, or the system chain's for changes without a tenant.
    #[cfg(feature = "postgres")]
    pub(crate) fn chain(&self) -> &str {
        &self.0.chain
    }

    pub(crate) fn tenant_created(tenant: &Tenant, actor: &Actor) -> AdminEvent {
        let chain = AuditChain::Tenant(tenant.id.clone());
        let details = json!({ "name": free_text(&tenant.name) });
        AdminEvent::new(&chain, "admin.tenant_created", actor, details)
    }

    pub(crate) fn agent_created(agent: &Agent, actor: &Actor) -> AdminEvent {
        let chain = AuditChain::Tenant(agent.tenant.clone());
        let details = json!({ "agent": agent.id.as_str(), "name": free_text(&agent.name) });
        AdminEvent::new(&chain, "admin.agent_created", actor, details)
    }

    pub(crate) fn token_issued(token: &TokenRecord, actor: &Actor) -> AdminEvent {
        let details = json!({
            "token_id": token.id,
            "role": token.role.as_str(),
            "agent": token.agent.as_ref().map(|agent| agent.as_str()),
            "label": free_text(&token.label),
        });
        let chain = AuditChain::of(token.tenant.as_ref());
        AdminEvent::new(&chain, "admin.token_issued", actor, details)
    }

    pub(crate) fn token_revoked(id: &str, tenant: Option<&TenantId>, actor: &Actor) -> AdminEvent {
        let chain = AuditChain::of(tenant);
        AdminEvent::new(
            &chain,
            "admin.token_revoked",
            actor,
            json!({ "token_id": id }),
        )
    }

    pub(crate) fn grant_set(permission: &Permission, actor: &Actor) -> AdminEvent {
        let details = json!({
            "tool": permission.tool.as_str(),
            "agent": permission.agent.as_ref().map(|agent| agent.as_str()),
            "enabled": permission.enabled,
        });
        let chain = AuditChain::Tenant(permission.tenant.clone());
        AdminEvent::new(&chain, "admin.grant_set", actor, details)
    }

    pub(crate) fn flag_set(tenant: &TenantId, flag: &str, enabled: bool, actor: &Actor) -> Self {
        let chain = AuditChain::Tenant(tenant.clone());
        let details = json!({ "flag": flag, "enabled": enabled });
        AdminEvent::new(&chain, "admin.flag_set", actor, details)
    }

    /// The policy text is not copied into the event (it is kept, versioned, in
    /// `policy_sets`); its SHA-256 ties the event to the exact text.
    pub(crate) fn policy_set(tenant: &TenantId, text: &str, actor: &Actor) -> AdminEvent {
        use sha2::Digest as _;
        let details = json!({
            "sha256": toolgate_core::hex::encode(sha2::Sha256::digest(text.as_bytes())),
            "bytes": text.len(),
        });
        let chain = AuditChain::Tenant(tenant.clone());
        AdminEvent::new(&chain, "admin.policy_set", actor, details)
    }

    /// Names the credential and how it is held; a sealed value's ciphertext is left out, a
    /// reference (`env:NAME`, `file:/path`: where the value is, not the value) is kept.
    pub(crate) fn credential_put(credential: &CredentialRecord, actor: &Actor) -> AdminEvent {
        let details = match credential.kind {
            CredentialKind::Sealed => json!({
                "name": credential.name.as_str(),
                "kind": credential.kind.as_str(),
                "key_id": credential.key_id,
            }),
            CredentialKind::Reference => json!({
                "name": credential.name.as_str(),
                "kind": credential.kind.as_str(),
                "reference": free_text(&credential.value),
            }),
        };
        let chain = AuditChain::Tenant(credential.tenant.clone());
        AdminEvent::new(&chain, "admin.credential_put", actor, details)
    }

    pub(crate) fn credential_deleted(
        tenant: &TenantId,
        name: &SecretName,
        actor: &Actor,
    ) -> AdminEvent {
        let chain = AuditChain::Tenant(tenant.clone());
        let details = json!({ "name": name.as_str() });
        AdminEvent::new(&chain, "admin.credential_deleted", actor, details)
    }

    pub(crate) fn credential_rewrapped(
        tenant: &TenantId,
        name: &SecretName,
        key_id: &str,
        actor: &Actor,
    ) -> AdminEvent {
        let chain = AuditChain::Tenant(tenant.clone());
        let details = json!({ "name": name.as_str(), "key_id": key_id });
        AdminEvent::new(&chain, "admin.credential_rewrapped", actor, details)
    }

    pub(crate) fn key_change(change: &KeyChange, actor: &Actor) -> AdminEvent {
        let (kind, details) = match change {
            KeyChange::Rotated { key_id, previous } => (
                "admin.key_rotated",
                json!({ "key_id": key_id, "previous_key_id": previous }),
            ),
            KeyChange::Rewrapped {
                active_key_id,
                rewrapped,
                skipped,
            } => (
                "admin.keys_rewrapped",
                json!({ "key_id": active_key_id, "rewrapped": rewrapped, "skipped": skipped }),
            ),
            KeyChange::Retired { key_id } => ("admin.key_retired", json!({ "key_id": key_id })),
        };
        AdminEvent::new(&AuditChain::System, kind, actor, details)
    }

    /// The event as written.
    pub(crate) fn prepared(&self) -> PreparedEvent {
        PreparedEvent {
            tenant: self.0.chain.clone(),
            kind: self.0.kind.to_owned(),
            run: None,
            tool_call_id: None,
            payload: Value::Object(self.0.payload.clone()).to_string(),
            at: self.0.at,
            binding: None,
        }
    }

    /// The event as written, with one more detail that only the transaction knows.
    pub(crate) fn prepared_with(&self, key: &str, value: Value) -> PreparedEvent {
        let mut event = self.clone();
        event.0.payload.insert(key.to_owned(), value);
        event.prepared()
    }
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
    /// The recorded content this event binds into the chain (`binding.rs`), if any.
    pub(crate) binding: Option<String>,
}

/// A JSON value's text, exactly as `Value`'s `Display` writes it (the chain hashes this text).
/// `serde_json::to_string` writes into one buffer; `Display` goes through the formatting
/// machinery a piece at a time, growing its string as it goes, at several times the cost on
/// every row of every call.
pub(crate) fn json_text(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value always has a text")
}

impl PreparedEvent {
    pub(crate) fn new(event: NewAuditEvent) -> PreparedEvent {
        PreparedEvent {
            tenant: event.tenant.as_str().to_owned(),
            kind: event.kind,
            run: event.run.map(|run| run.as_str().to_owned()),
            tool_call_id: event.tool_call_id.map(|id| id.as_str().to_owned()),
            payload: json_text(&event.payload),
            at: event.at.0,
            binding: None,
        }
    }

    /// What the chain covers of this event at position `chain_seq`.
    pub(crate) fn fields(&self, chain_seq: i64) -> crate::chain::EventFields<'_> {
        crate::chain::EventFields {
            tenant: &self.tenant,
            chain_seq,
            kind: &self.kind,
            run: self.run.as_deref(),
            tool_call_id: self.tool_call_id.as_deref(),
            payload: &self.payload,
            at: self.at,
            binding: self.binding.as_deref(),
        }
    }

    /// The events of a human decision, the first of its call's carrying the call's new
    /// status.
    pub(crate) fn of_resolution(resolution: &ResolvePending) -> Vec<PreparedEvent> {
        let mut events: Vec<PreparedEvent> = resolution
            .events
            .iter()
            .cloned()
            .map(PreparedEvent::new)
            .collect();
        let call_id = events.iter().find_map(|event| event.tool_call_id.clone());
        if let Some(call_id) = call_id {
            Binding::default()
                .resolution(&call_id, resolution)
                .attach(&mut events, &call_id);
        }
        events
    }

    /// The events of a new pending invocation, binding it.
    pub(crate) fn of_pending(
        pending: &PendingInvocation,
        events: Vec<NewAuditEvent>,
    ) -> Vec<PreparedEvent> {
        let mut events: Vec<PreparedEvent> = events.into_iter().map(PreparedEvent::new).collect();
        Binding::default()
            .pending(pending)
            .attach(&mut events, pending.tool_call_id.as_str());
        events
    }
}

/// Operator-typed text as an audit event keeps it: with anything credential-shaped replaced.
fn free_text(text: &str) -> String {
    toolgate_core::Redactor::new()
        .redact_text(text)
        .into_owned()
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
    /// `arguments`: the clear JSON text, only for rows the engine could not seal.
    pub(crate) arguments: Option<String>,
    /// `arguments_sealed`: the sealed arguments.
    pub(crate) arguments_sealed: Option<String>,
    /// `arguments_key_id`: the key that sealed them.
    pub(crate) arguments_key_id: Option<String>,
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
        let input = json_text(&call.input_redacted);
        let output = call.output_redacted.as_ref().map(json_text);
        let decision = decision.map(|decision| {
            let ids = json_text(&serde_json::Value::from(decision.policy_ids.clone()));
            (decision, ids)
        });
        let mut events: Vec<PreparedEvent> = events.into_iter().map(PreparedEvent::new).collect();
        let mut binding = Binding::default().call(&call, &input, output.as_deref());
        if let Some((decision, ids)) = &decision {
            binding = binding.decision(decision, ids);
        }
        if let Some(pending) = &pending {
            binding = binding.pending(pending);
        }
        binding.attach(&mut events, call.id.as_str());
        PreparedCall {
            input,
            output,
            call,
            count_against_budget,
            decision,
            pending: pending.map(PreparedPending::new),
            events,
        }
    }
}

impl PreparedPending {
    pub(crate) fn new(record: PendingInvocation) -> PreparedPending {
        let (arguments, arguments_sealed, arguments_key_id) = match &record.arguments {
            PendingArguments::Sealed { key_id, sealed } => {
                (None, Some(sealed.clone()), Some(key_id.clone()))
            }
            PendingArguments::Clear(value) => (Some(json_text(value)), None, None),
            PendingArguments::Dropped => (None, None, None),
        };
        PreparedPending {
            arguments,
            arguments_sealed,
            arguments_key_id,
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
        let mut events: Vec<PreparedEvent> = std::mem::take(&mut finish.events)
            .into_iter()
            .map(PreparedEvent::new)
            .collect();
        let output = finish.output_redacted.as_ref().map(json_text);
        Binding::default()
            .finish(&finish, output.as_deref())
            .attach(&mut events, finish.id.as_str());
        PreparedFinish {
            output,
            answer: finish.answer.as_ref().map(|answer| answer.sealed.clone()),
            answer_expires_at: finish.answer.as_ref().map(|answer| answer.expires_at.0),
            finish,
            events,
        }
    }
}

/// What the writer has done since the store was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions committed (each one fsync).
    pub commits: u64,
    /// Write operations answered, successful or not.
    pub ops: u64,
    /// Batches that could not be written all together and were written one operation at a
    /// time instead, each in its own savepoint. PostgreSQL: batches whose hot operations
    /// (calls, finishes, event appends) did not fit its one statement (a repeated
    /// `tool_use_id`, a used-up budget, a missing run, ...). SQLite: batches of several
    /// operations of which one was refused with an error (a missing run, a clashing id, ...);
    /// a repeated `tool_use_id` or a used-up budget is an answer there, not a refusal.
    pub bulk_fallbacks: u64,
    /// PostgreSQL: hot operations that could not be written in one round trip either and were
    /// redone statement by statement. Always 0 on SQLite.
    pub step_by_step: u64,
    /// SQLite: commits of one operation that its caller made itself, on its own thread, as
    /// the writer was idle (counted in `commits` too). Always 0 on PostgreSQL.
    pub inline: u64,
}

/// What the writer task counts, for [`WriterStats`], and who else it tells.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) commits: AtomicU64,
    pub(crate) ops: AtomicU64,
    pub(crate) bulk_fallbacks: AtomicU64,
    pub(crate) step_by_step: AtomicU64,
    pub(crate) inline: AtomicU64,
    /// Told of every batch, once set (by the store's `observe`).
    pub(crate) observer: std::sync::OnceLock<std::sync::Arc<dyn crate::LedgerObserver>>,
}

impl Counters {
    /// Counts a finished batch of `operations` and tells the observer, if there is one.
    pub(crate) fn batch_done(
        &self,
        operations: usize,
        started: std::time::Instant,
        committed: bool,
    ) {
        self.ops.fetch_add(
            u64::try_from(operations).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if let Some(observer) = self.observer.get() {
            observer.batch_committed(operations, started.elapsed(), committed);
        }
    }
}

impl Counters {
    pub(crate) fn stats(&self) -> WriterStats {
        WriterStats {
            commits: self.commits.load(Ordering::Relaxed),
            ops: self.ops.load(Ordering::Relaxed),
            bulk_fallbacks: self.bulk_fallbacks.load(Ordering::Relaxed),
            step_by_step: self.step_by_step.load(Ordering::Relaxed),
            inline: self.inline.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::json_text;

    /// The chains hash the text `json_text` gives, and rows written before it hashed what
    /// `Value`'s `Display` gives: the two must never differ.
    #[test]
    fn json_text_is_the_text_display_gives() {
        let values = [
            json!(null),
            json!({}),
            json!([]),
            json!({"b": 1, "a": [true, false, null], "c": {"d": -0.5, "e": 1e300}}),
            json!("quotes \" backslash \\ slash / controls \u{0}\u{1f}\n\t\r tab"),
            json!("unicode é ✓ 😀 \u{2028}\u{2029} \u{7f}"),
            json!({"key \"with\" quotes\n": "v", "": ""}),
            json!([i64::MIN, i64::MAX, u64::MAX, 0.1, 123_456_789.125]),
        ];
        for value in values {
            assert_eq!(json_text(&value), value.to_string(), "{value:?}");
        }
    }
}
