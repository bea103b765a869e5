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
//! The report names the first problem of the first broken chain in chain id order; counts
//! cover every event of every chain. The chains are the tenants' and the system chain
//! (`SYSTEM_CHAIN`, administrative changes that belong to no tenant), verified alike; a chain
//! with neither events nor a head past position 0 (PostgreSQL creates heads with their
//! tenant) is empty and not counted.

use std::collections::HashMap;

use crate::chain::{GENESIS_HASH, event_hash};
use crate::error::LedgerError;
use crate::model::{AuditChain, ChainProblem, ChainProblemKind, VerifyReport};
use crate::rows::{SqlRow, read_error};
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;

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
}

/// Implements [`ChainReader`] for a connection type; the SQL is the same on both backends.
macro_rules! chain_reader {
    ($conn:ty, $begin:literal) => {
        impl ChainReader for $conn {
            async fn tenants(&mut self) -> Result<Vec<String>, LedgerError> {
                sqlx::query_scalar(
                    "SELECT tenant FROM audit_heads WHERE chain_seq > 0 \
                     UNION SELECT tenant FROM audit_events ORDER BY 1",
                )
                .fetch_all(&mut *self)
                .await
                .map_err(read_error)
            }

            async fn begin_snapshot(&mut self) -> Result<(), LedgerError> {
                sqlx::query($begin)
                    .execute(&mut *self)
                    .await
                    .map_err(read_error)?;
                Ok(())
            }

            async fn end_snapshot(&mut self) -> Result<(), LedgerError> {
                sqlx::query("ROLLBACK")
                    .execute(&mut *self)
                    .await
                    .map_err(read_error)?;
                Ok(())
            }

            async fn head(&mut self, tenant: &str) -> Result<Option<(i64, String)>, LedgerError> {
                sqlx::query_as("SELECT chain_seq, hash FROM audit_heads WHERE tenant = $1")
                    .bind(tenant.to_owned())
                    .fetch_optional(&mut *self)
                    .await
                    .map_err(read_error)
            }

            async fn page(
                &mut self,
                tenant: &str,
                after: i64,
                limit: i64,
            ) -> Result<Vec<StoredEvent>, LedgerError> {
                let rows = sqlx::query(
                    "SELECT seq, chain_seq, kind, run, tool_call_id, payload, at, prev_hash, hash \
                     FROM audit_events WHERE tenant = $1 AND chain_seq > $2 \
                     ORDER BY chain_seq LIMIT $3",
                )
                .bind(tenant.to_owned())
                .bind(after)
                .bind(limit)
                .fetch_all(&mut *self)
                .await
                .map_err(read_error)?;
                rows.iter().map(StoredEvent::from_row).collect()
            }

            async fn links(&mut self, tenant: &str) -> Result<Vec<(String, String)>, LedgerError> {
                sqlx::query_as("SELECT hash, prev_hash FROM audit_events WHERE tenant = $1")
                    .bind(tenant.to_owned())
                    .fetch_all(&mut *self)
                    .await
                    .map_err(read_error)
            }
        }
    };
}

chain_reader!(SqliteConnection, "BEGIN");
chain_reader!(
    PgConnection,
    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
);

/// Events read per query while walking a chain.
const PAGE: i64 = 1000;

pub(crate) async fn verify_chains(
    conn: &mut impl ChainReader,
) -> Result<VerifyReport, LedgerError> {
    let tenants = conn.tenants().await?;
    let mut report = VerifyReport {
        events_checked: 0,
        chains_checked: 0,
        first_problem: None,
    };
    for tenant in tenants {
        conn.begin_snapshot().await?;
        let checked = verify_chain(conn, &tenant).await;
        conn.end_snapshot().await?;
        let (events, problem) = checked?;
        report.events_checked += events;
        report.chains_checked += 1;
        if report.first_problem.is_none() {
            report.first_problem = problem;
        }
    }
    Ok(report)
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
        })
    }

    /// The hash this event would have at `chain_seq`.
    fn hash_at(&self, tenant: &str, chain_seq: i64) -> String {
        event_hash(
            &self.prev_hash,
            tenant,
            chain_seq,
            &self.kind,
            self.run.as_deref(),
            self.tool_call_id.as_deref(),
            &self.payload,
            self.at,
        )
    }
}

/// Walks one chain; returns the events read and the chain's first problem.
async fn verify_chain(
    conn: &mut impl ChainReader,
    tenant: &str,
) -> Result<(u64, Option<ChainProblem>), LedgerError> {
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
    let mut events: u64 = 0;
    let mut last_seq_read = 0;
    let mut prev_hash = GENESIS_HASH.to_owned();
    let mut prev_insert_seq = i64::MIN;
    loop {
        let rows = conn.page(tenant, last_seq_read, PAGE).await?;
        if rows.is_empty() {
            break;
        }
        for event in rows {
            events += 1;
            let expected = last_seq_read + 1;
            last_seq_read = event.chain_seq;
            if found.is_some() {
                continue;
            }
            let at = event.chain_seq;

            if at != expected {
                let missing = if at - expected == 1 {
                    format!("event {expected} is missing")
                } else {
                    format!("events {expected} to {} are missing", at - 1)
                };
                let detail = if expected == 1 {
                    format!("{missing}: the chain starts at event {at}")
                } else {
                    format!(
                        "{missing}: the chain goes from event {} to {at}",
                        expected - 1
                    )
                };
                found = Some(problem(expected, ChainProblemKind::Deleted, detail));
                continue;
            }

            if event.hash_at(tenant, at) != event.hash {
                let links = load_links(conn, tenant, &mut links).await?;
                let origin = position_of(links, &event.prev_hash).map(|p| p + 1);
                found = Some(match origin {
                    Some(origin) if origin != at && event.hash_at(tenant, origin) == event.hash => {
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
                        format!("event {at} does not match its hash: its content was changed"),
                    ),
                });
                continue;
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
            prev_hash = event.hash;
            prev_insert_seq = event.seq;
        }
    }

    if found.is_none() {
        let last = last_seq_read;
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
    Ok((events, found))
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
