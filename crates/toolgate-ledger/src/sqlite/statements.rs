//! The write statements of the hot operations, how their parameters are bound, and the
//! multi-statement and multi-row shapes the writer builds from them (SQLite's fast paths). The
//! bulk and one-round-trip paths share these, so both write exactly the same rows; the
//! step-by-step path (`crate::steps`, shared with PostgreSQL) inserts the call row with
//! [`INSERT_CALL`] too.

use std::sync::Arc;

use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr, Sqlite};

use crate::model::PolicyDecisionRecord;
use crate::ops::{PreparedCall, PreparedEvent, PreparedFinish, PreparedPending};
use crate::rows::call_columns;

pub(super) type SqlQuery = Query<'static, Sqlite, SqliteArguments>;

/// Where an appended event goes in its chain; computed by the writer from the chain head.
#[derive(Clone, Debug)]
pub(super) struct ChainLink {
    pub(super) chain_seq: i64,
    pub(super) prev_hash: String,
    /// The master key id whose chain key MAC'd the event; `None` for a legacy hash.
    pub(super) key_id: Option<String>,
    pub(super) hash: String,
}

pub(super) const INSERT_CALL: &str = concat!(
    "INSERT INTO tool_calls (",
    call_columns!(),
    ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
);

/// Counts a call (and its pending invocation) on its run. Unconditional: when the budget is
/// used up, the `runs_budget` CHECK constraint refuses the row.
pub(super) const COUNT_ON_RUN: &str = "UPDATE runs SET calls_used = calls_used + ?, \
     pending_approvals = pending_approvals + ?, \
     status = CASE WHEN ? > 0 THEN 'waiting_approval' ELSE status END \
     WHERE tenant = ? AND id = ?";

pub(super) const INSERT_DECISION: &str = "INSERT INTO policy_decisions (id, tenant, tool_call_id, \
     tool, decision, risk, policy_ids, policy_version, created_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";

pub(super) const INSERT_PENDING: &str = "INSERT INTO pending_invocations (id, tenant, run, \
     tool_call_id, tool, arguments, arguments_sealed, arguments_key_id, args_hash, manifest, \
     policy_version, origin, decision, state, version, expires_at, created_at, timeout_ms, \
     trace_parent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

pub(super) const INSERT_EVENT: &str = "INSERT INTO audit_events (tenant, chain_seq, kind, run, \
     tool_call_id, payload, at, prev_hash, hash, key_id, binding) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// [`INSERT_EVENT`] that inserts only when the previous statement changed exactly one row, so a
/// chain of them after an UPDATE writes all events or none.
pub(super) const INSERT_EVENT_IF_CHANGED: &str = "INSERT INTO audit_events (tenant, chain_seq, \
     kind, run, tool_call_id, payload, at, prev_hash, hash, key_id, binding) \
     SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE changes() = 1";

/// Moves a running call to its terminal status; returns a row only when it did.
pub(super) const FINISH_RUNNING: &str = "UPDATE tool_calls SET status = ?, output_redacted = ?, \
     error_code = ?, error_text = ?, duration_ms = ?, attempts = ?, updated_at = ?, \
     answer_sealed = ?, answer_expires_at = ? WHERE id = ? AND tenant = ? AND status = 'running' RETURNING seq";

pub(super) const UPSERT_HEAD: &str = "INSERT INTO audit_heads (tenant, chain_seq, hash) \
     VALUES (?, ?, ?) ON CONFLICT (tenant) DO UPDATE SET chain_seq = excluded.chain_seq, \
     hash = excluded.hash";

/// [`UPSERT_HEAD`] only when the previous statement changed a row: after a conditional event
/// insert, the head moves only if the event was written.
pub(super) const UPSERT_HEAD_IF_CHANGED: &str = "INSERT INTO audit_heads (tenant, chain_seq, hash) \
     SELECT ?, ?, ? WHERE changes() = 1 ON CONFLICT (tenant) DO UPDATE SET \
     chain_seq = excluded.chain_seq, hash = excluded.hash";

pub(super) fn bind_call(query: SqlQuery, prepared: &PreparedCall) -> SqlQuery {
    let call = &prepared.call;
    query
        .bind(call.id.as_str().to_owned())
        .bind(call.tenant.as_str().to_owned())
        .bind(call.run.as_str().to_owned())
        .bind(call.agent.as_str().to_owned())
        .bind(call.tool.clone())
        .bind(call.action.clone())
        .bind(call.tool_use_id.as_ref().map(|id| id.as_str().to_owned()))
        .bind(call.correlation_id.as_str().to_owned())
        .bind(call.status.as_str())
        .bind(call.args_hash.clone())
        .bind(prepared.input.clone())
        .bind(prepared.output.clone())
        .bind(call.error_code.map(|code| code.as_str()))
        .bind(call.error_text.clone())
        .bind(call.policy_decision_id.clone())
        .bind(call.risk_level.map(|risk| risk.as_str()))
        .bind(call.duration_ms)
        .bind(call.attempts)
        .bind(call.evaluation)
        .bind(call.created_at.0)
        .bind(call.updated_at.0)
}

/// Binds [`COUNT_ON_RUN`].
pub(super) fn bind_count_on_run(query: SqlQuery, prepared: &PreparedCall) -> SqlQuery {
    let pending = i64::from(prepared.pending.is_some());
    query
        .bind(i64::from(prepared.count_against_budget))
        .bind(pending)
        .bind(pending)
        .bind(prepared.call.tenant.as_str().to_owned())
        .bind(prepared.call.run.as_str().to_owned())
}

pub(super) fn bind_decision(
    query: SqlQuery,
    (decision, policy_ids): &(PolicyDecisionRecord, String),
) -> SqlQuery {
    query
        .bind(decision.id.clone())
        .bind(decision.tenant.as_str().to_owned())
        .bind(decision.tool_call_id.as_str().to_owned())
        .bind(decision.tool.as_str().to_owned())
        .bind(decision.decision.as_str())
        .bind(decision.risk.as_str())
        .bind(policy_ids.clone())
        .bind(decision.policy_version)
        .bind(decision.created_at.0)
}

pub(super) fn bind_pending(query: SqlQuery, pending: &PreparedPending) -> SqlQuery {
    let record = &pending.record;
    query
        .bind(record.id.clone())
        .bind(record.tenant.as_str().to_owned())
        .bind(record.run.as_str().to_owned())
        .bind(record.tool_call_id.as_str().to_owned())
        .bind(record.tool.as_str().to_owned())
        .bind(pending.arguments.clone())
        .bind(pending.arguments_sealed.clone())
        .bind(pending.arguments_key_id.clone())
        .bind(record.args_hash.clone())
        .bind(pending.manifest.clone())
        .bind(record.policy_version)
        .bind(record.origin.as_str())
        .bind(record.decision.as_str())
        .bind(record.state.as_str())
        .bind(record.version)
        .bind(record.expires_at.0)
        .bind(record.created_at.0)
        .bind(pending.timeout_ms)
        .bind(record.trace_parent.clone())
}

pub(super) fn bind_event(query: SqlQuery, event: &PreparedEvent, link: &ChainLink) -> SqlQuery {
    query
        .bind(event.tenant.clone())
        .bind(link.chain_seq)
        .bind(event.kind.clone())
        .bind(event.run.clone())
        .bind(event.tool_call_id.clone())
        .bind(event.payload.clone())
        .bind(event.at)
        .bind(link.prev_hash.clone())
        .bind(link.hash.clone())
        .bind(link.key_id.clone())
        // A legacy hash does not cover the binding, so none is stored with it.
        .bind(link.key_id.as_ref().and(event.binding.clone()))
}

pub(super) fn bind_finish(query: SqlQuery, prepared: &PreparedFinish) -> SqlQuery {
    let finish = &prepared.finish;
    query
        .bind(finish.status.as_str())
        .bind(prepared.output.clone())
        .bind(finish.error_code.map(|code| code.as_str()))
        .bind(finish.error_text.clone())
        .bind(finish.duration_ms)
        .bind(finish.attempts)
        .bind(finish.at.0)
        .bind(prepared.answer.clone())
        .bind(prepared.answer_expires_at)
        .bind(finish.id.as_str().to_owned())
        .bind(finish.tenant.as_str().to_owned())
}

/// One row of [`Shape::Rows`] with [`RowKind::FinishRunning`].
pub(super) fn bind_finish_row(query: SqlQuery, prepared: &PreparedFinish) -> SqlQuery {
    let finish = &prepared.finish;
    query
        .bind(finish.id.as_str().to_owned())
        .bind(finish.tenant.as_str().to_owned())
        .bind(finish.status.as_str())
        .bind(prepared.output.clone())
        .bind(finish.error_code.map(|code| code.as_str()))
        .bind(finish.error_text.clone())
        .bind(finish.duration_ms)
        .bind(finish.attempts)
        .bind(finish.at.0)
        .bind(prepared.answer.clone())
        .bind(prepared.answer_expires_at)
}

/// What a batch adds to one run: counted calls and pending invocations.
#[derive(Clone, Debug)]
pub(super) struct RunCount {
    pub(super) tenant: String,
    pub(super) run: String,
    pub(super) calls: i64,
    pub(super) pending: i64,
}

/// One row of [`Shape::Rows`] with [`RowKind::CountOnRuns`].
pub(super) fn bind_run_count_row(query: SqlQuery, count: &RunCount) -> SqlQuery {
    query
        .bind(count.tenant.clone())
        .bind(count.run.clone())
        .bind(count.calls)
        .bind(count.pending)
}

/// The most rows one multi-row statement carries. 256 rows of the widest row (a tool call,
/// 20 parameters) stay far below SQLite's limit of 32766 parameters.
pub(super) const MAX_ROWS: usize = 256;

/// The number of rows of the next multi-row statement for `remaining` rows: the largest power of
/// two that fits, so at most nine shapes (1, 2, 4, ... 256) exist per kind of statement.
pub(super) fn chunk_rows(remaining: usize) -> usize {
    let capped = remaining.clamp(1, MAX_ROWS);
    1 << capped.ilog2()
}

/// A statement that writes many rows at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum RowKind {
    InsertCalls,
    /// Adds counted calls and pending invocations to runs; the `runs_budget` constraint
    /// refuses a run whose budget would be exceeded.
    CountOnRuns,
    InsertDecisions,
    InsertPending,
    InsertEvents,
    /// Finishes the calls that are still running; returns the ids of those it finished.
    FinishRunning,
}

impl RowKind {
    /// The statement up to its VALUES rows, the row placeholder, and what follows the rows.
    fn parts(self) -> (&'static str, &'static str, &'static str) {
        match self {
            RowKind::InsertCalls => (
                concat!("INSERT INTO tool_calls (", call_columns!(), ") VALUES "),
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                "",
            ),
            RowKind::CountOnRuns => (
                "UPDATE runs SET calls_used = runs.calls_used + v.column3, \
                 pending_approvals = runs.pending_approvals + v.column4, \
                 status = CASE WHEN v.column4 > 0 THEN 'waiting_approval' ELSE runs.status END \
                 FROM (VALUES ",
                "(?, ?, ?, ?)",
                ") AS v WHERE runs.tenant = v.column1 AND runs.id = v.column2",
            ),
            RowKind::InsertDecisions => (
                "INSERT INTO policy_decisions (id, tenant, tool_call_id, tool, decision, risk, \
                 policy_ids, policy_version, created_at) VALUES ",
                "(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                "",
            ),
            RowKind::InsertPending => (
                "INSERT INTO pending_invocations (id, tenant, run, tool_call_id, tool, arguments, \
                 arguments_sealed, arguments_key_id, args_hash, manifest, policy_version, origin, \
                 decision, state, version, expires_at, created_at, timeout_ms, trace_parent) VALUES ",
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                "",
            ),
            RowKind::InsertEvents => (
                "INSERT INTO audit_events (tenant, chain_seq, kind, run, tool_call_id, payload, \
                 at, prev_hash, hash, key_id, binding) VALUES ",
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                "",
            ),
            RowKind::FinishRunning => (
                "UPDATE tool_calls SET status = v.column3, output_redacted = v.column4, \
                 error_code = v.column5, error_text = v.column6, duration_ms = v.column7, \
                 attempts = v.column8, updated_at = v.column9, answer_sealed = v.column10, \
                 answer_expires_at = v.column11 FROM (VALUES ",
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ") AS v WHERE tool_calls.id = v.column1 AND tool_calls.tenant = v.column2 \
                 AND tool_calls.status = 'running' RETURNING tool_calls.id",
            ),
        }
    }
}

/// The SQL text the writer sends in one round trip, cached by shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Shape {
    /// `record_call` as one multi-statement round trip.
    Record {
        count_on_run: bool,
        decision: bool,
        pending: bool,
        events: usize,
    },
    /// `finish_call` as one multi-statement round trip.
    Finish { events: usize },
    /// `append_events` as one multi-statement round trip.
    Append { events: usize },
    /// The moved chain heads, then COMMIT.
    Commit { heads: usize },
    /// A batch of one hot operation as a whole transaction in one round trip:
    /// `BEGIN IMMEDIATE`, the operation's shape, its chain heads, `COMMIT`.
    SoloRecord {
        count_on_run: bool,
        decision: bool,
        pending: bool,
        events: usize,
        heads: usize,
    },
    /// As [`Shape::SoloRecord`] for `finish_call`; the heads move only if the call did.
    SoloFinish { events: usize, heads: usize },
    /// As [`Shape::SoloRecord`] for `append_events`.
    SoloAppend { events: usize, heads: usize },
    /// One multi-row statement.
    Rows { kind: RowKind, rows: usize },
}

impl Shape {
    pub(super) fn sql(self) -> SqlStr {
        // Built only from the constant statements of this module; every value is a bound
        // parameter.
        AssertSqlSafe(Arc::<str>::from(self.text())).into_sql_str()
    }

    fn text(self) -> String {
        let solo = |inner: Shape, head: &str, heads: usize| {
            let mut statements = vec!["BEGIN IMMEDIATE".to_owned(), inner.text()];
            statements.extend(std::iter::repeat_n(head.to_owned(), heads));
            statements.push("COMMIT".to_owned());
            statements.join(";\n")
        };
        match self {
            Shape::SoloRecord {
                count_on_run,
                decision,
                pending,
                events,
                heads,
            } => {
                let inner = Shape::Record {
                    count_on_run,
                    decision,
                    pending,
                    events,
                };
                solo(inner, UPSERT_HEAD, heads)
            }
            Shape::SoloFinish { events, heads } => {
                solo(Shape::Finish { events }, UPSERT_HEAD_IF_CHANGED, heads)
            }
            Shape::SoloAppend { events, heads } => {
                solo(Shape::Append { events }, UPSERT_HEAD, heads)
            }
            Shape::Record {
                count_on_run,
                decision,
                pending,
                events,
            } => {
                let mut statements = vec!["SAVEPOINT op", INSERT_CALL];
                if count_on_run {
                    statements.push(COUNT_ON_RUN);
                }
                if decision {
                    statements.push(INSERT_DECISION);
                }
                if pending {
                    statements.push(INSERT_PENDING);
                }
                statements.extend(std::iter::repeat_n(INSERT_EVENT, events));
                statements.push("RELEASE op");
                statements.join(";\n")
            }
            Shape::Finish { events } => {
                let mut statements = vec!["SAVEPOINT op", FINISH_RUNNING];
                statements.extend(std::iter::repeat_n(INSERT_EVENT_IF_CHANGED, events));
                statements.push("RELEASE op");
                statements.join(";\n")
            }
            Shape::Append { events } => {
                let mut statements = vec!["SAVEPOINT op"];
                statements.extend(std::iter::repeat_n(INSERT_EVENT, events));
                statements.push("RELEASE op");
                statements.join(";\n")
            }
            Shape::Commit { heads } => {
                let mut statements = vec![UPSERT_HEAD; heads];
                statements.push("COMMIT");
                statements.join(";\n")
            }
            Shape::Rows { kind, rows } => {
                let (head, row, tail) = kind.parts();
                format!("{head}{}{tail}", vec![row; rows].join(", "))
            }
        }
    }
}
