//! Writing a batch's hot operations together, with one multi-row statement per table (split
//! into at most nine chunks of 1 to 256 rows), inside one savepoint:
//!
//! 1. one UPDATE ... FROM (VALUES ...) finishes every call that is still running and returns
//!    their ids, which answers each `finish_call`;
//! 2. every audit event gets its chain position and hash, in batch order, from the cached heads;
//! 3. one INSERT adds every new call, one UPDATE counts them (and their pending invocations) on
//!    their runs, one INSERT each adds the decisions and pending invocations, and one INSERT
//!    appends every event.
//!
//! This assumes every call is new, within its run's budget, and names a run that exists. When a
//! statement refuses (a unique, foreign key or `runs_budget` violation), everything is rolled
//! back to the savepoint and the writer handles the operations one by one, which finds the one
//! that was refused and answers it precisely.

use std::collections::{BTreeMap, HashMap, HashSet};

use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::error::LedgerError;
use crate::model::{PolicyDecisionRecord, RecordOutcome};
use crate::ops::{PreparedCall, PreparedEvent, PreparedFinish, PreparedPending, Reply};
use crate::rows::{Fail, SqlFailure, read_failure};
use crate::sqlite::statements::{
    ChainLink, RowKind, RunCount, Shape, SqlQuery, bind_call, bind_decision, bind_event,
    bind_finish_row, bind_pending, bind_run_count_row, chunk_rows,
};
use crate::sqlite::writer::Writer;
use crate::steps::Head;

/// A hot operation of the batch.
#[derive(Clone, Copy, Debug)]
pub(super) enum Hot<'a> {
    Record(&'a PreparedCall),
    Finish(&'a PreparedFinish),
    Append(&'a [PreparedEvent]),
}

impl Writer {
    /// Writes every operation; the answers are in the order of `ops`. `None` when a statement
    /// refused and everything was rolled back (the caller then runs them one by one).
    /// `savepoint_open` says the `bulk` savepoint was opened already, with BEGIN.
    pub(super) async fn bulk(
        &mut self,
        ops: &[Hot<'_>],
        savepoint_open: bool,
    ) -> Result<Option<Vec<Reply>>, Fail> {
        if !savepoint_open {
            self.control("SAVEPOINT bulk").await?;
        }
        match self.write_bulk(ops).await {
            Ok((replies, heads)) => {
                // The savepoint stays open: COMMIT releases it, and a round trip is saved.
                self.advance(heads);
                Ok(Some(replies))
            }
            Err(Fail::Op(_)) => {
                self.control("ROLLBACK TO bulk; RELEASE bulk").await?;
                Ok(None)
            }
            Err(fatal) => Err(fatal),
        }
    }

    /// The statements of the bulk write; returns the answers and the chain heads after it.
    async fn write_bulk(
        &mut self,
        ops: &[Hot<'_>],
    ) -> Result<(Vec<Reply>, HashMap<String, Head>), Fail> {
        let finishes: Vec<&PreparedFinish> = ops
            .iter()
            .filter_map(|op| match op {
                Hot::Finish(prepared) => Some(*prepared),
                _ => None,
            })
            .collect();
        let finished_rows = self
            .write_rows(RowKind::FinishRunning, &finishes, |query, finish| {
                bind_finish_row(query, finish)
            })
            .await?;
        let finished: HashSet<String> = finished_rows
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()
            .map_err(read_failure)?;

        // Chain the events of every operation in batch order; a finish that found its call no
        // longer running writes none.
        let mut heads: HashMap<String, Head> = HashMap::new();
        let mut events: Vec<(&PreparedEvent, ChainLink)> = Vec::new();
        let mut replies = Vec::with_capacity(ops.len());
        for op in ops {
            let (op_events, reply): (&[PreparedEvent], Reply) = match op {
                Hot::Record(prepared) => (
                    &prepared.events,
                    Reply::Recorded(Box::new(RecordOutcome::Recorded)),
                ),
                Hot::Finish(prepared) => {
                    let done = finished.contains(prepared.finish.id.as_str());
                    let op_events: &[PreparedEvent] = if done { &prepared.events } else { &[] };
                    (op_events, Reply::Finished(done))
                }
                Hot::Append(op_events) => (op_events, Reply::Done),
            };
            for event in op_events {
                let link = self.next_link(&mut heads, event).await?;
                events.push((event, link));
            }
            replies.push(reply);
        }

        let records: Vec<&PreparedCall> = ops
            .iter()
            .filter_map(|op| match op {
                Hot::Record(prepared) => Some(*prepared),
                _ => None,
            })
            .collect();
        self.write_rows(RowKind::InsertCalls, &records, |query, prepared| {
            bind_call(query, prepared)
        })
        .await?;
        let counts = run_counts(&records);
        self.write_rows(RowKind::CountOnRuns, &counts, bind_run_count_row)
            .await?;
        let decisions: Vec<&(PolicyDecisionRecord, String)> = records
            .iter()
            .filter_map(|prepared| prepared.decision.as_ref())
            .collect();
        self.write_rows(RowKind::InsertDecisions, &decisions, |query, decision| {
            bind_decision(query, decision)
        })
        .await?;
        let pending: Vec<&PreparedPending> = records
            .iter()
            .filter_map(|prepared| prepared.pending.as_ref())
            .collect();
        self.write_rows(RowKind::InsertPending, &pending, |query, pending| {
            bind_pending(query, pending)
        })
        .await?;
        self.write_rows(RowKind::InsertEvents, &events, |query, (event, link)| {
            bind_event(query, event, link)
        })
        .await?;
        Ok((replies, heads))
    }

    /// Writes `items` with multi-row statements of `kind`; returns the rows they return.
    async fn write_rows<T>(
        &mut self,
        kind: RowKind,
        items: &[T],
        bind: impl Fn(SqlQuery, &T) -> SqlQuery,
    ) -> Result<Vec<SqliteRow>, Fail> {
        let mut returned = Vec::new();
        let mut rest = items;
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(chunk_rows(rest.len()));
            let shape = Shape::Rows {
                kind,
                rows: chunk.len(),
            };
            let mut query = sqlx::query(self.shape(shape));
            for item in chunk {
                query = bind(query, item);
            }
            let rows =
                query.fetch_all(&mut self.conn).await.map_err(
                    |error| match SqlFailure::classify(&error) {
                        SqlFailure::Fatal(message) => Fail::Fatal(LedgerError::Database(message)),
                        // Refused: the caller rolls back and goes one by one.
                        _ => Fail::Op(LedgerError::Database(error.to_string())),
                    },
                )?;
            returned.extend(rows);
            rest = tail;
        }
        Ok(returned)
    }
}

/// What the calls add to each run, one entry per run (ordered, so the statement text and the
/// row order are the same for the same batch).
fn run_counts(records: &[&PreparedCall]) -> Vec<RunCount> {
    let mut counts: BTreeMap<(&str, &str), (i64, i64)> = BTreeMap::new();
    for prepared in records {
        let calls = i64::from(prepared.count_against_budget);
        let pending = i64::from(prepared.pending.is_some());
        if calls + pending == 0 {
            continue;
        }
        let key = (prepared.call.tenant.as_str(), prepared.call.run.as_str());
        let entry = counts.entry(key).or_default();
        entry.0 += calls;
        entry.1 += pending;
    }
    counts
        .into_iter()
        .map(|((tenant, run), (calls, pending))| RunCount {
            tenant: tenant.to_owned(),
            run: run.to_owned(),
            calls,
            pending,
        })
        .collect()
}
