//! The disk's floor under light load: what one durable SQLite commit costs on this machine,
//! measured without the gateway.
//!
//! At a light, fixed rate nothing is batched: every ledger write of a call is a commit of its
//! own, with one fsync, and a call commits twice (its `running` row before the connector runs,
//! its terminal row before the answer). This measures the least such a commit can cost here,
//! as the gateway's ledger makes a lone call's commits (on the calling thread, no hand-off to
//! a writer thread and back): one thread owns a connection set up as the ledger's (WAL,
//! `synchronous = FULL`, the same bundled SQLite, through the same VFS), sleeps until a call is
//! due at the bench's rate, and commits the call's two small rows in a table with one index,
//! one after the other, each in a transaction of its own. It sleeps between calls, so the
//! figure includes the wake-up a light load costs, once a call, as the gateway's worker wakes
//! for a request. Its CPU (user and kernel, from `/proc/thread-self/stat`) and context
//! switches are counted over the measured window, per commit.
//!
//! A call's time is taken from when it was due, not from when it started: a call due while an
//! fsync is stalled (this machine's disk has them: 2-24 ms, a few times a second) waits for it,
//! as a gateway's calls arriving meanwhile do. Timed from its own start it would look punctual,
//! and the disk's stalls would vanish from the floor's p99 (the coordinated omission of load
//! testing).

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::bench::load::Latency;
use crate::bench::process::thread_self_cpu;

/// The figures of one measurement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommitFloor {
    /// Commits requested per second.
    pub(crate) rate: u32,
    /// Commits in the measured window.
    pub(crate) commits: u64,
    /// CPU per commit of the committing thread: SQLite, the WAL writes, the fsync, and half its
    /// wake-up at a call's due time.
    pub(crate) cpu: Duration,
    /// Context switches per commit.
    pub(crate) switches: f64,
    /// The commit's wall time (BEGIN to COMMIT returned), median and 99th percentile.
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    /// A call's time, from when it was due to its second commit's end: median and 99th
    /// percentile.
    pub(crate) call_p50: Duration,
    pub(crate) call_p99: Duration,
}

impl CommitFloor {
    /// One line: the commit's CPU, switches and wall time.
    pub(crate) fn summary(&self) -> String {
        format!(
            "{:.1} µs CPU and {:.1} switches per commit; commit p50 {} µs, p99 {} µs ({} commits); a call's 2 commits from when it was due p50 {} µs, p99 {} µs",
            self.cpu.as_secs_f64() * 1e6,
            self.switches,
            self.p50.as_micros(),
            self.p99.as_micros(),
            self.commits,
            self.call_p50.as_micros(),
            self.call_p99.as_micros(),
        )
    }
}

/// A thread's CPU time and context switches so far.
#[derive(Debug, Clone, Copy, Default)]
struct ThreadUse {
    cpu: Duration,
    switches: u64,
}

impl ThreadUse {
    fn now() -> anyhow::Result<ThreadUse> {
        let (cpu, switches) = thread_self_cpu()?;
        Ok(ThreadUse { cpu, switches })
    }

    fn since(self, earlier: ThreadUse) -> ThreadUse {
        ThreadUse {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            switches: self.switches.saturating_sub(earlier.switches),
        }
    }
}

/// The row's text: about the size of a small ledger row's.
const BODY: &str = "{\"tool\":\"testkit.echo\",\"status\":\"running\",\"input_sha256\":\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\",\"run\":\"run_0000000000000000000000000000000\"}";

/// Makes `rate` calls per second, two commits each, for `warmup + duration` in a fresh database
/// under `dir`; the figures are of the last `duration`.
pub(crate) fn measure(
    dir: &Path,
    rate: u32,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<CommitFloor> {
    let path = dir.join("floor.db");
    // A thread of its own, as a gateway's worker is, so the CPU and switches counted are the
    // commits' and the wake-ups', not the bench's.
    thread::Builder::new()
        .name("floor-writer".into())
        .spawn(move || commit_at_rate(&path, rate, warmup, duration))
        .context("cannot start the floor's thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the floor's thread panicked"))?
}

/// The floor's thread: sleeps until a call is due, then commits its two rows one after the
/// other, as a gateway's worker commits a lone call's.
fn commit_at_rate(
    path: &Path,
    rate: u32,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<CommitFloor> {
    let conn = open(path)?;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut next = start;
    let mut n = 0u64;
    let mut before: Option<ThreadUse> = None;
    let mut walls = Vec::new();
    let mut calls = Vec::new();
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if before.is_none() && now >= measure_from {
            before = Some(ThreadUse::now()?);
        }
        if let Some(wait) = next.checked_duration_since(now) {
            thread::sleep(wait);
        }
        let due = next;
        next += interval;
        for _ in 0..2 {
            n += 1;
            let wall = commit(&conn, n)?;
            if before.is_some() {
                walls.push(wall);
            }
        }
        if before.is_some() {
            calls.push(due.elapsed());
        }
    }
    let used = ThreadUse::now()?.since(before.context("the floor's measured window was empty")?);

    let commits = u64::try_from(walls.len()).unwrap_or(u64::MAX).max(1);
    let wall = Latency::of(walls);
    let call = Latency::of(calls);
    Ok(CommitFloor {
        rate,
        commits,
        cpu: used.cpu / u32::try_from(commits).unwrap_or(u32::MAX),
        switches: used.switches as f64 / commits as f64,
        p50: wall.p50,
        p99: wall.p99,
        call_p50: call.p50,
        call_p99: call.p99,
    })
}

/// A connection set up as the ledger's writer sets up its own (`sqlite/direct.rs`), with one
/// table and one index. It checkpoints in its commits, as SQLite does by default, where the
/// ledger has that done beside its writer: the floor's commits touch so few pages that a
/// checkpoint copies a handful.
fn open(path: &Path) -> anyhow::Result<rusqlite::Connection> {
    // Through the VFS the ledger's writer uses (a commit's log frames 16 KiB at a time).
    toolgate_sqlite_vfs::register()?;
    let conn = rusqlite::Connection::open_with_flags_and_vfs(
        path,
        rusqlite::OpenFlags::default(),
        toolgate_sqlite_vfs::NAME,
    )
    .with_context(|| format!("cannot open {}", path.display()))?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; \
         PRAGMA synchronous = FULL; \
         PRAGMA cache_size = -4096; \
         PRAGMA temp_store = MEMORY; \
         PRAGMA wal_autocheckpoint = 8000; \
         PRAGMA secure_delete = ON; \
         CREATE TABLE rows (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, body TEXT NOT NULL) STRICT;",
    )
    .context("cannot set up the floor's database")?;
    Ok(conn)
}

/// One transaction of one row, committed (with its fsync).
fn commit(conn: &rusqlite::Connection, n: u64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    conn.execute_batch("BEGIN IMMEDIATE")?;
    conn.prepare_cached("INSERT INTO rows (key, body) VALUES (?1, ?2)")?
        .execute((format!("tc_{n:032x}"), BODY))?;
    conn.execute_batch("COMMIT")?;
    Ok(started.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_at_the_rate_and_counts_what_they_cost() {
        let dir = tempfile::tempdir().unwrap();
        let floor = measure(
            dir.path(),
            500,
            Duration::from_millis(100),
            Duration::from_millis(400),
        )
        .unwrap();
        // 400 ms at 500 calls/s of 2 commits: never more than about 400 commits (the pacing
        // holds the rate), each a row in the file; fewer when a slow disk falls behind.
        assert!((20..=420).contains(&floor.commits), "{floor:?}");
        let conn = rusqlite::Connection::open(dir.path().join("floor.db")).unwrap();
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM rows", [], |row| row.get(0))
            .unwrap();
        assert!(
            u64::try_from(rows).unwrap() >= floor.commits,
            "{rows} rows, {floor:?}"
        );
        // Each commit's wall time was taken: an fsync'd commit takes time, and a call's two
        // more, at least.
        assert!(floor.p50 > Duration::ZERO, "{floor:?}");
        assert!(floor.call_p50 >= floor.p50, "{floor:?}");
        assert!(floor.call_p99 >= floor.call_p50, "{floor:?}");
        // Both threads slept between commits: at least one switch each per commit.
        assert!(floor.switches >= 1.0, "{floor:?}");
    }

    #[test]
    fn a_database_that_cannot_be_opened_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-directory");
        let error = measure(
            &missing,
            500,
            Duration::from_millis(10),
            Duration::from_millis(10),
        )
        .unwrap_err();
        let text = format!("{error:#}");
        assert!(
            text.contains("cannot open") && text.contains("no-such-directory"),
            "{text}"
        );
    }
}
