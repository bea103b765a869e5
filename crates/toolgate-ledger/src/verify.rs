//! Checking the audit chains. Each tenant's chain is read inside one read transaction (one
//! snapshot, so concurrent appends cannot look like damage) and walked in `chain_seq` order.
//!
//! Rules, applied to each event in turn; the first failing rule is the chain's problem:
//!
//! 1. Positions run 1, 2, 3, ... A missing position is `Deleted` at that position.
//! 2. The event's hash, recomputed from its stored fields (including its stored `prev_hash`),
//!    equals its stored hash. If not, and the event's content verifies at the position its
//!    `prev_hash` link says it originally held, the event is genuine but was moved: `Reordered`.
//!    Otherwise its content was changed: `Edited`.
//! 3. The event's `prev_hash` equals the hash of the event before it (the genesis hash for
//!    position 1). If it names another event of the chain instead: `Reordered`. If it names no
//!    event, the predecessor is not the event this one was chained to (it was replaced, or
//!    rewritten with a recomputed hash): `Edited` at the predecessor's position.
//! 4. Insertion order (`seq`) grows along the chain. If not, the rows were shuffled:
//!    `Reordered`.
//! 5. After the last event, the chain must end where `audit_heads` says: a head ahead of the
//!    chain means the newest events were removed (`Deleted` at the first missing position); a
//!    chain longer than its head, or a last event whose hash differs from the head's, means
//!    events were added or replaced outside the ledger (`Edited`). Events without a head record
//!    are `Deleted` (the head row, and with it the proof of the chain's length, is gone).
//!
//! Keyed events (`key_id` set) are checked by their MAC under the chain key of their key id
//! when keys are given and that key is loaded; otherwise only rules 1, 3, 4 and 5 apply, and
//! the report counts them as not authenticated. Legacy events (unkeyed hash) are checked by
//! their hash, which anyone who can write the database can recompute: the report counts them,
//! and those no keyed event follows (nothing authenticates them) separately. A legacy event
//! after a keyed one was not written by the ledger: `Edited`.
//!
//! 6. Bindings (`binding.rs`): after a tenant's chain, its `tool_calls`, `policy_decisions`
//!    and `pending_invocations` rows are compared with what its keyed events bound: a bound
//!    field that differs is `Edited` at the binding event, a bound row that is gone `Deleted`
//!    there, a row nothing binds (and no legacy event names) `Edited` at position 0.
//! 7. With a checkpoint: every chain it names must reach the checkpoint's position with the
//!    same hash there. A shorter chain was truncated and its head rewound (`Deleted`); another
//!    event at that position is `Edited`; a chain that is gone is `Deleted` at position 1.
//!
//! The report names the first problem of the first broken chain in chain id order; counts
//! cover every event of every chain. The chains are the tenants' and the system chain
//! (`SYSTEM_CHAIN`, administrative changes that belong to no tenant), verified alike; a chain
//! with neither events nor a head past position 0 (PostgreSQL creates heads with their
//! tenant) is empty and not counted.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Map, Value};
use toolgate_core::AuditKeys;

use crate::binding::{Bound, CallContent, DecisionContent, PendingContent, RowContent};
use crate::chain::{EventFields, GENESIS_HASH, event_hash, event_mac};
use crate::checkpoint::Checkpoint;
use crate::error::LedgerError;
use crate::model::{AuditChain, ChainHead, ChainProblem, ChainProblemKind, VerifyReport};
use crate::rows::{SqlRow, read_error};
use crate::sql::{Dialect, query};
use crate::steps::SqlConn;

/// What verification reads, on one connection of either backend. Each chain is read between
/// `begin_snapshot` and `end_snapshot`, so concurrent appends cannot look like damage.
pub(crate) trait ChainReader {
    async fn tenants(&mut self) -> Result<Vec<String>, LedgerError>;
    async fn begin_snapshot(&mut self) -> Result<(), LedgerError>;
    async fn end_snapshot(&mut self) -> Result<(), LedgerError>;
    async fn head(&mut self, tenant: &str) -> Result<Option<(i64, String)>, LedgerError>;
    async fn page(
        &mut self,
        tenant: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<StoredEvent>, LedgerError>;
    async fn links(&mut self, tenant: &str) -> Result<Vec<(String, String)>, LedgerError>;
    /// Whether any event is keyed.
    async fn any_keyed(&mut self) -> Result<bool, LedgerError>;
    /// The payload of the first keyed record of the legacy events, if any.
    async fn legacy_record(&mut self) -> Result<Option<String>, LedgerError>;
    /// A page of a tenant's calls with their bound columns, in insertion order.
    async fn calls(
        &mut self,
        tenant: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<StoredCall>, LedgerError>;
    /// A tenant's decisions and pending invocations: `(part, id, call id, bound fields)`.
    async fn decisions_and_pending(
        &mut self,
        tenant: &str,
    ) -> Result<Vec<(&'static str, String, String, Map<String, Value>)>, LedgerError>;
}

/// Every backend's connection reads the chains with the same SQL; only the snapshot differs.
impl<C: SqlConn> ChainReader for C {
    async fn tenants(&mut self) -> Result<Vec<String>, LedgerError> {
        query(
            "SELECT tenant FROM audit_heads WHERE chain_seq > 0 \
             UNION SELECT tenant FROM audit_events ORDER BY 1",
        )
        .all(self.db(), |row| row.text("tenant"))
        .await
    }

    async fn begin_snapshot(&mut self) -> Result<(), LedgerError> {
        // SQLite's read transaction is a snapshot already (WAL); PostgreSQL needs the
        // isolation level for one across statements.
        let begin = match C::DIALECT {
            Dialect::Sqlite => "BEGIN",
            Dialect::Postgres => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        };
        query(begin).execute(self.db()).await.map_err(read_error)?;
        Ok(())
    }

    async fn end_snapshot(&mut self) -> Result<(), LedgerError> {
        query("ROLLBACK")
            .execute(self.db())
            .await
            .map_err(read_error)?;
        Ok(())
    }

    async fn head(&mut self, tenant: &str) -> Result<Option<(i64, String)>, LedgerError> {
        let row = query("SELECT chain_seq, hash FROM audit_heads WHERE tenant = $1")
            .bind(tenant)
            .fetch_optional(self.db())
            .await
            .map_err(read_error)?;
        row.map(|row| Ok((row.int("chain_seq")?, row.text("hash")?)))
            .transpose()
    }

    async fn page(
        &mut self,
        tenant: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<StoredEvent>, LedgerError> {
        query(
            "SELECT seq, chain_seq, kind, run, tool_call_id, payload, at, prev_hash, hash, \
             key_id, binding FROM audit_events WHERE tenant = $1 AND chain_seq > $2 \
             ORDER BY chain_seq LIMIT $3",
        )
        .bind(tenant)
        .bind(after)
        .bind(limit)
        .all(self.db(), StoredEvent::from_row)
        .await
    }

    async fn links(&mut self, tenant: &str) -> Result<Vec<(String, String)>, LedgerError> {
        let rows = query("SELECT hash, prev_hash FROM audit_events WHERE tenant = $1")
            .bind(tenant)
            .fetch_all(self.db())
            .await
            .map_err(read_error)?;
        rows.iter()
            .map(|row| Ok((row.text("hash")?, row.text("prev_hash")?)))
            .collect()
    }

    async fn any_keyed(&mut self) -> Result<bool, LedgerError> {
        let row = query(crate::chain::ANY_KEYED)
            .fetch_one(self.db())
            .await
            .map_err(read_error)?;
        Ok(row.int("count")? > 0)
    }

    async fn legacy_record(&mut self) -> Result<Option<String>, LedgerError> {
        query(crate::chain::FIND_LEGACY_RECORD)
            .optional(self.db(), |row| row.text("payload"))
            .await
    }

    async fn calls(
        &mut self,
        tenant: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<StoredCall>, LedgerError> {
        query(
            "SELECT seq, id, status, error_code, error_text, input_redacted, \
             output_redacted, tool, run, args_hash, policy_decision_id, risk_level, \
             attempts FROM tool_calls WHERE tenant = $1 AND seq > $2 \
             ORDER BY seq LIMIT $3",
        )
        .bind(tenant)
        .bind(after)
        .bind(limit)
        .all(self.db(), StoredCall::from_row)
        .await
    }

    async fn decisions_and_pending(
        &mut self,
        tenant: &str,
    ) -> Result<Vec<(&'static str, String, String, Map<String, Value>)>, LedgerError> {
        let mut found = Vec::new();
        let decisions = query(
            "SELECT id, tool_call_id, tool, decision, risk, policy_ids, policy_version \
             FROM policy_decisions WHERE tenant = $1",
        )
        .bind(tenant)
        .fetch_all(self.db())
        .await
        .map_err(read_error)?;
        for row in &decisions {
            let call = row.text("tool_call_id")?;
            let fields = DecisionContent {
                tool_call_id: &call,
                tool: &row.text("tool")?,
                decision: &row.text("decision")?,
                risk: &row.text("risk")?,
                policy_ids: &row.text("policy_ids")?,
                policy_version: row.int("policy_version")?,
            }
            .fields();
            found.push(("decision", row.text("id")?, call, fields));
        }
        let pending = query(
            "SELECT id, tool_call_id, tool, args_hash, origin, decision, policy_version \
             FROM pending_invocations WHERE tenant = $1",
        )
        .bind(tenant)
        .fetch_all(self.db())
        .await
        .map_err(read_error)?;
        for row in &pending {
            let call = row.text("tool_call_id")?;
            let fields = PendingContent {
                tool_call_id: &call,
                tool: &row.text("tool")?,
                args_hash: &row.text("args_hash")?,
                origin: &row.text("origin")?,
                decision: &row.text("decision")?,
                policy_version: row.int("policy_version")?,
            }
            .fields();
            found.push(("pending", row.text("id")?, call, fields));
        }
        Ok(found)
    }
}

/// Events read per query while walking a chain.
const PAGE: i64 = 1000;

/// What verification is given besides the database.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct VerifyWith<'a> {
    /// The keys to check MACs with; `None` checks links, order and bindings only.
    pub(crate) keys: Option<&'a dyn AuditKeys>,
    /// A checkpoint taken earlier, to detect truncation and rewinding against.
    pub(crate) checkpoint: Option<&'a Checkpoint>,
}

pub(crate) async fn verify_chains(
    conn: &mut impl ChainReader,
    with: VerifyWith<'_>,
) -> Result<VerifyReport, LedgerError> {
    let tenants = conn.tenants().await?;
    // Read once, before the chains: the record's own MAC is checked with the system chain.
    let legacy = match conn.legacy_record().await? {
        Some(payload) => match crate::chain::parse_legacy_record(&payload) {
            Some(heads) => Legacy::Recorded(heads),
            None => Legacy::Missing,
        },
        None if with.keys.is_some() || conn.any_keyed().await? => Legacy::Missing,
        None => Legacy::Unchecked,
    };
    let mut report = VerifyReport {
        events_checked: 0,
        chains_checked: 0,
        first_problem: None,
        keyed_events: 0,
        authenticated_events: 0,
        legacy_events: 0,
        unprotected_legacy_events: 0,
        keys_loaded: with.keys.is_some(),
        missing_keys: Vec::new(),
        rows_checked: 0,
        legacy_rows: 0,
        heads: Vec::new(),
        checkpoint_chains: 0,
    };
    let mut missing_keys = BTreeSet::new();
    for tenant in &tenants {
        let expected = with
            .checkpoint
            .and_then(|checkpoint| {
                checkpoint
                    .heads
                    .iter()
                    .find(|head| head.chain.as_str() == tenant)
            })
            .map(|head| (head.chain_seq, head.hash.clone()));
        conn.begin_snapshot().await?;
        let checked = verify_chain(
            conn,
            tenant,
            with.keys,
            &legacy,
            expected.as_ref(),
            &mut report,
            &mut missing_keys,
        )
        .await;
        conn.end_snapshot().await?;
        let problem = checked?;
        report.chains_checked += 1;
        if report.first_problem.is_none() {
            report.first_problem = problem;
        }
    }
    if let Some(checkpoint) = with.checkpoint {
        report.checkpoint_chains = u64::try_from(checkpoint.heads.len()).unwrap_or(u64::MAX);
        let gone = checkpoint
            .heads
            .iter()
            .find(|head| !tenants.iter().any(|tenant| tenant == head.chain.as_str()));
        if let Some(head) = gone
            && report.first_problem.is_none()
        {
            report.first_problem = Some(ChainProblem {
                chain: head.chain.clone(),
                chain_seq: 1,
                kind: ChainProblemKind::Deleted,
                detail: format!(
                    "the checkpoint records {} events on this chain but it has none: its \
                     events and head were removed",
                    head.chain_seq
                ),
            });
        }
    }
    report.missing_keys = missing_keys.into_iter().collect();
    Ok(report)
}

/// Which legacy (unkeyed) events may exist.
enum Legacy {
    /// Those the keyed record names: each chain's up to the recorded position, ending with the
    /// recorded hash.
    Recorded(HashMap<String, (i64, String)>),
    /// None: the ledger has keyed events (or keys were given) but no record of legacy events.
    Missing,
    /// No keys and no keyed event: a ledger written without keys; its legacy events are
    /// counted, not authenticated.
    Unchecked,
}

/// An audit row as stored, uninterpreted: verification works on the exact stored text.
pub(crate) struct StoredEvent {
    seq: i64,
    chain_seq: i64,
    kind: String,
    run: Option<String>,
    tool_call_id: Option<String>,
    payload: String,
    at: i64,
    prev_hash: String,
    hash: String,
    key_id: Option<String>,
    binding: Option<String>,
}

impl StoredEvent {
    fn from_row(row: &impl SqlRow) -> Result<StoredEvent, LedgerError> {
        Ok(StoredEvent {
            seq: row.int("seq")?,
            chain_seq: row.int("chain_seq")?,
            kind: row.text("kind")?,
            run: row.text_opt("run")?,
            tool_call_id: row.text_opt("tool_call_id")?,
            payload: row.text("payload")?,
            at: row.int("at")?,
            prev_hash: row.text("prev_hash")?,
            hash: row.text("hash")?,
            key_id: row.text_opt("key_id")?,
            binding: row.text_opt("binding")?,
        })
    }

    /// The hash (legacy) or MAC (keyed) this event would have at `chain_seq`; `None` for a
    /// keyed event whose key is not at hand.
    fn hash_at(
        &self,
        keys: Option<&dyn AuditKeys>,
        tenant: &str,
        chain_seq: i64,
    ) -> Option<String> {
        match &self.key_id {
            None => Some(event_hash(
                &self.prev_hash,
                &EventFields {
                    tenant,
                    chain_seq,
                    kind: &self.kind,
                    run: self.run.as_deref(),
                    tool_call_id: self.tool_call_id.as_deref(),
                    payload: &self.payload,
                    at: self.at,
                    binding: None,
                },
            )),
            Some(key_id) => {
                let fields = EventFields {
                    tenant,
                    chain_seq,
                    kind: &self.kind,
                    run: self.run.as_deref(),
                    tool_call_id: self.tool_call_id.as_deref(),
                    payload: &self.payload,
                    at: self.at,
                    binding: self.binding.as_deref(),
                };
                event_mac(keys?, key_id, &self.prev_hash, &fields)
            }
        }
    }
}

/// A call row's bound columns as stored.
pub(crate) struct StoredCall {
    seq: i64,
    id: String,
    status: String,
    error_code: Option<String>,
    error_text: Option<String>,
    input: String,
    output: Option<String>,
    tool: String,
    run: String,
    args_hash: String,
    decision_id: Option<String>,
    risk: Option<String>,
    attempts: i64,
}

impl StoredCall {
    fn from_row(row: &impl SqlRow) -> Result<StoredCall, LedgerError> {
        Ok(StoredCall {
            seq: row.int("seq")?,
            id: row.text("id")?,
            status: row.text("status")?,
            error_code: row.text_opt("error_code")?,
            error_text: row.text_opt("error_text")?,
            input: row.text("input_redacted")?,
            output: row.text_opt("output_redacted")?,
            tool: row.text("tool")?,
            run: row.text("run")?,
            args_hash: row.text("args_hash")?,
            decision_id: row.text_opt("policy_decision_id")?,
            risk: row.text_opt("risk_level")?,
            attempts: row.int("attempts")?,
        })
    }

    fn fields(&self) -> Map<String, Value> {
        CallContent {
            status: &self.status,
            error_code: self.error_code.as_deref(),
            error_text: self.error_text.as_deref(),
            input: &self.input,
            output: self.output.as_deref(),
            tool: &self.tool,
            run: &self.run,
            args_hash: &self.args_hash,
            decision_id: self.decision_id.as_deref(),
            risk: self.risk.as_deref(),
            attempts: self.attempts,
        }
        .fields()
    }
}

/// Walks one chain, counting into `report`; returns the chain's first problem.
async fn verify_chain(
    conn: &mut impl ChainReader,
    tenant: &str,
    keys: Option<&dyn AuditKeys>,
    legacy: &Legacy,
    expected: Option<&(i64, String)>,
    report: &mut VerifyReport,
    missing_keys: &mut BTreeSet<String>,
) -> Result<Option<ChainProblem>, LedgerError> {
    let chain = AuditChain::parse(tenant)
        .map_err(|error| LedgerError::Corrupt(format!("audit chain id: {error}")))?;
    let problem = |chain_seq: i64, kind: ChainProblemKind, detail: String| ChainProblem {
        chain: chain.clone(),
        chain_seq,
        kind,
        detail,
    };

    let head = conn.head(tenant).await?;

    let mut links: Option<HashMap<String, String>> = None;
    let mut found: Option<ChainProblem> = None;
    let mut bound = Bound::default();
    let mut last_seq_read = 0;
    let mut prev_hash = GENESIS_HASH.to_owned();
    let mut prev_insert_seq = i64::MIN;
    let mut keyed_seen = false;
    // Legacy events since the last keyed one: no MAC covers them (yet).
    let mut unprotected: u64 = 0;
    let mut at_checkpoint: Option<String> = None;
    loop {
        let rows = conn.page(tenant, last_seq_read, PAGE).await?;
        if rows.is_empty() {
            break;
        }
        for event in rows {
            report.events_checked += 1;
            let expected_seq = last_seq_read + 1;
            last_seq_read = event.chain_seq;
            if expected.is_some_and(|(seq, _)| *seq == event.chain_seq) {
                at_checkpoint = Some(event.hash.clone());
            }
            let after_keyed = keyed_seen;
            match &event.key_id {
                None => {
                    report.legacy_events += 1;
                    if matches!(legacy, Legacy::Unchecked) {
                        unprotected += 1;
                    }
                    if let Some(call) = &event.tool_call_id {
                        bound.legacy_calls.insert(call.clone());
                    }
                }
                Some(_) => {
                    report.keyed_events += 1;
                    keyed_seen = true;
                }
            }
            if found.is_some() {
                continue;
            }
            let at = event.chain_seq;

            if at != expected_seq {
                let missing = if at - expected_seq == 1 {
                    format!("event {expected_seq} is missing")
                } else {
                    format!("events {expected_seq} to {} are missing", at - 1)
                };
                let detail = if expected_seq == 1 {
                    format!("{missing}: the chain starts at event {at}")
                } else {
                    format!(
                        "{missing}: the chain goes from event {} to {at}",
                        expected_seq - 1
                    )
                };
                found = Some(problem(expected_seq, ChainProblemKind::Deleted, detail));
                continue;
            }

            if event.key_id.is_none() && after_keyed {
                found = Some(problem(
                    at,
                    ChainProblemKind::Edited,
                    format!(
                        "event {at} has an unkeyed hash but follows keyed events: the ledger \
                         did not write it (it was added or rewritten without the key)"
                    ),
                ));
                continue;
            }

            if event.key_id.is_none()
                && let Some(detail) = legacy_refused(legacy, tenant, at, &event.hash)
            {
                found = Some(problem(at, ChainProblemKind::Edited, detail));
                continue;
            }

            match event.hash_at(keys, tenant, at) {
                None => {
                    if let (Some(_), Some(key_id)) = (keys, &event.key_id) {
                        missing_keys.insert(key_id.clone());
                    }
                }
                Some(recomputed) if recomputed != event.hash => {
                    let links = load_links(conn, tenant, &mut links).await?;
                    let origin = position_of(links, &event.prev_hash).map(|p| p + 1);
                    found = Some(match origin {
                        Some(origin)
                            if origin != at
                                && event.hash_at(keys, tenant, origin).as_ref()
                                    == Some(&event.hash) =>
                        {
                            problem(
                                at,
                                ChainProblemKind::Reordered,
                                format!(
                                    "event {at} is intact but belongs at position {origin}: \
                                     events were moved"
                                ),
                            )
                        }
                        _ => problem(
                            at,
                            ChainProblemKind::Edited,
                            format!(
                                "event {at} does not match its {}: its content was changed",
                                if event.key_id.is_some() {
                                    "MAC"
                                } else {
                                    "hash"
                                }
                            ),
                        ),
                    });
                    continue;
                }
                Some(_) => {
                    if event.key_id.is_some() {
                        report.authenticated_events += 1;
                    }
                }
            }

            if event.prev_hash != prev_hash {
                let links = load_links(conn, tenant, &mut links).await?;
                found = Some(match position_of(links, &event.prev_hash) {
                    Some(position) => problem(
                        at,
                        ChainProblemKind::Reordered,
                        format!(
                            "event {at} was chained after event {position}, not after event {}",
                            at - 1
                        ),
                    ),
                    None if at == 1 => problem(
                        1,
                        ChainProblemKind::Edited,
                        "event 1 does not start from the genesis hash: it was replaced".into(),
                    ),
                    None => problem(
                        at - 1,
                        ChainProblemKind::Edited,
                        format!(
                            "event {} is not the event that event {at} was chained to: it was \
                             replaced or rewritten with a recomputed hash",
                            at - 1
                        ),
                    ),
                });
                continue;
            }

            if event.seq <= prev_insert_seq {
                found = Some(problem(
                    at,
                    ChainProblemKind::Reordered,
                    format!(
                        "event {at} is stored before event {} (insertion order {} <= {}): \
                         rows were shuffled",
                        at - 1,
                        event.seq,
                        prev_insert_seq
                    ),
                ));
                continue;
            }

            match (&event.key_id, &event.binding) {
                (Some(_), Some(binding)) => {
                    if let Err(detail) = bound.fold(at, binding) {
                        found = Some(problem(at, ChainProblemKind::Edited, detail));
                        continue;
                    }
                }
                (None, Some(_)) => {
                    found = Some(problem(
                        at,
                        ChainProblemKind::Edited,
                        format!(
                            "event {at} has an unkeyed hash but binds call content, which the \
                             ledger never writes: it was rewritten"
                        ),
                    ));
                    continue;
                }
                (_, None) => {}
            }
            prev_hash = event.hash;
            prev_insert_seq = event.seq;
        }
    }
    report.unprotected_legacy_events += unprotected;
    let last = last_seq_read;
    if let Legacy::Recorded(heads) = legacy
        && found.is_none()
        && let Some((legacy_seq, _)) = heads.get(tenant)
        && *legacy_seq > last
    {
        found = Some(problem(
            last + 1,
            ChainProblemKind::Deleted,
            format!(
                "the chain had {legacy_seq} events when its keyed chain began but ends at \
                 {last}: events were removed"
            ),
        ));
    }
    if found.is_none()
        && let Some((seq, hash)) = expected
    {
        if last < *seq {
            found = Some(problem(
                last + 1,
                ChainProblemKind::Deleted,
                format!(
                    "the checkpoint records {seq} events but the chain ends at {last}: the \
                     newest events were removed and the head rewound"
                ),
            ));
        } else if at_checkpoint.as_ref() != Some(hash) {
            found = Some(problem(
                *seq,
                ChainProblemKind::Edited,
                format!(
                    "event {seq} is not the event the checkpoint recorded there: the chain was \
                     rewritten"
                ),
            ));
        }
    }

    if found.is_none() {
        found = match head {
            None if last > 0 => Some(problem(
                last + 1,
                ChainProblemKind::Deleted,
                format!(
                    "the chain has {last} events but no head record: removal of its newest \
                     events cannot be ruled out"
                ),
            )),
            None => None,
            Some((head_seq, _)) if head_seq > last => Some(problem(
                last + 1,
                ChainProblemKind::Deleted,
                format!(
                    "the head records {head_seq} events but the chain ends at {last}: the \
                     newest events were removed"
                ),
            )),
            Some((head_seq, _)) if head_seq < last => Some(problem(
                head_seq + 1,
                ChainProblemKind::Edited,
                format!(
                    "events {} to {last} are beyond the head ({head_seq}): they were added \
                     outside the ledger or the head was rolled back",
                    head_seq + 1
                ),
            )),
            Some((_, head_hash)) if head_hash != prev_hash => Some(problem(
                last,
                ChainProblemKind::Edited,
                format!(
                    "event {last} is not the event the head records: it was replaced or \
                     rewritten with a recomputed hash"
                ),
            )),
            Some(_) => None,
        };
    }

    let rows = check_rows(conn, tenant, &mut bound, report).await?;
    if found.is_none()
        && let Some((at, kind, detail)) = rows
    {
        found = Some(problem(at, kind, detail));
    }
    if found.is_none() && last > 0 {
        report.heads.push(ChainHead {
            chain: chain.clone(),
            chain_seq: last,
            hash: prev_hash,
        });
    }
    Ok(found)
}

/// Why the legacy event at `at` of `chain`, with `hash`, cannot be genuine; `None` if it can.
fn legacy_refused(legacy: &Legacy, chain: &str, at: i64, hash: &str) -> Option<String> {
    match legacy {
        Legacy::Unchecked => None,
        Legacy::Missing => Some(format!(
            "event {at} has an unkeyed hash, but no authenticated record says the ledger held \
             legacy events when its keyed chain began: it was rewritten without the key (or \
             written without keys)"
        )),
        Legacy::Recorded(heads) => match heads.get(chain) {
            None => Some(format!(
                "event {at} has an unkeyed hash, but its chain had no events when the keyed \
                 chain began: it was rewritten without the key"
            )),
            Some((legacy_seq, _)) if at > *legacy_seq => Some(format!(
                "event {at} has an unkeyed hash, but only the first {legacy_seq} events of its \
                 chain predate the keyed chain: it was rewritten without the key"
            )),
            Some((legacy_seq, legacy_hash)) if at == *legacy_seq && hash != legacy_hash => {
                Some(format!(
                    "event {at} is not the legacy event recorded when the keyed chain began: \
                     legacy events were rewritten"
                ))
            }
            Some(_) => None,
        },
    }
}

/// Compares a tenant's call, decision and pending rows with what its chain bound; the first
/// mismatch, if any.
async fn check_rows(
    conn: &mut impl ChainReader,
    tenant: &str,
    bound: &mut Bound,
    report: &mut VerifyReport,
) -> Result<Option<(i64, ChainProblemKind, String)>, LedgerError> {
    let mut first: Option<(i64, ChainProblemKind, String)> = None;
    let mut after = 0;
    loop {
        let calls = conn.calls(tenant, after, PAGE).await?;
        let Some(last) = calls.last() else {
            break;
        };
        after = last.seq;
        for call in calls {
            report.rows_checked += 1;
            match bound.check("call", &call.id, &call.id, &call.fields()) {
                Ok(true) => {}
                Ok(false) => report.legacy_rows += 1,
                Err((at, detail)) => {
                    first.get_or_insert((at, ChainProblemKind::Edited, detail));
                }
            }
        }
    }
    for (part, id, call, fields) in conn.decisions_and_pending(tenant).await? {
        report.rows_checked += 1;
        match bound.check(part, &id, &call, &fields) {
            Ok(true) => {}
            Ok(false) => report.legacy_rows += 1,
            Err((at, detail)) => {
                first.get_or_insert((at, ChainProblemKind::Edited, detail));
            }
        }
    }
    if first.is_none()
        && let Some((at, detail)) = bound.missing()
    {
        first = Some((at, ChainProblemKind::Deleted, detail));
    }
    Ok(first)
}

/// Every event's hash and the hash it names as its predecessor; loaded once, only when a
/// problem needs diagnosing.
async fn load_links<'m>(
    conn: &mut impl ChainReader,
    tenant: &str,
    links: &'m mut Option<HashMap<String, String>>,
) -> Result<&'m HashMap<String, String>, LedgerError> {
    if links.is_none() {
        let rows = conn.links(tenant).await?;
        *links = Some(rows.into_iter().collect());
    }
    Ok(links.get_or_insert_with(HashMap::new))
}

/// The original position of the event whose hash is `hash`, found by following `prev_hash`
/// links back to the genesis hash (which is position 0). `None` when a link is broken or loops.
fn position_of(links: &HashMap<String, String>, hash: &str) -> Option<i64> {
    let mut current = hash;
    let mut steps: i64 = 0;
    let limit = i64::try_from(links.len()).unwrap_or(i64::MAX);
    while current != GENESIS_HASH {
        current = links.get(current)?;
        steps += 1;
        if steps > limit {
            return None;
        }
    }
    Some(steps)
}
