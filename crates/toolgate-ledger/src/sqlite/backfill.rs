//! Copying the write-ahead log into the database (SQLite's checkpoint, its "backfill") off the
//! writer's path.
//!
//! SQLite's automatic checkpoint runs inside the COMMIT that takes the log past its threshold:
//! the writer reads every page the log holds, writes it into the database file and fsyncs that
//! file before it answers the batch's callers, and every write queued meanwhile waits. At 1,000
//! calls/s that happened about twice a second, each time some 360 page reads and 360 page
//! writes plus an fsync of 1.5 ms (the log's own fsyncs: p50 0.17 ms); in the closed loop, with
//! thousands of pages per checkpoint, it was a tenth of the writer's time.
//!
//! Here a thread of its own, with a connection of its own, does the copying: the writer asks
//! for a pass once the log holds [`THRESHOLD`] frames ([`LIGHT_THRESHOLD`] at light load), and
//! the pass (a `PASSIVE` checkpoint, which never blocks or waits for the writer) copies what
//! was committed before it started.
//! When it is done the writer copies, itself, what was committed while it ran (a few frames,
//! whose fsync is a small one), so the whole log is in the database and the writer's next
//! transaction starts the log over from its beginning. Without that catch-up a busy writer
//! would never find the log wholly copied and the log would grow without end; with it the log
//! stays near [`THRESHOLD`] frames. Should a pass not come back (its thread gone, or a reader
//! holding old frames), the writer checkpoints by itself at [`LIMIT`] frames, as SQLite's
//! automatic checkpoint did.
//!
//! How long the log is reaches the writer through SQLite's write-ahead-log hook, called at every
//! commit on the thread that commits (the writer thread, or a caller committing inline); the
//! hook is a plain function (it can carry no state), so it leaves the count in a thread-local
//! of that thread, read right after the commit under the same lock.

use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::thread::JoinHandle;

use rusqlite::hooks::Wal;
use rusqlite::{Connection, OpenFlags};
use tracing::warn;

/// The log's length, in frames (pages), at which the writer asks for a pass under load: 32 MiB
/// of 4 KiB pages. (SQLite's default is 1,000; 8,000 measured 20-30% more calls/s in the
/// closed loop, and 1,000 12% fewer than 8,000 side by side.)
pub(super) const THRESHOLD: i32 = 8000;

/// The same at light load, while commits carry about one write each: SQLite's default. A pass
/// ends with an fsync of the database file that carries everything it copied, and the log's own
/// fsyncs wait behind it: at 1,000 calls/s, passes of 8,000 frames gave the gateway an added
/// p99 of 2.4-8.5 ms where passes of 1,000 gave 1.6-2.2 ms (six runs each, alternated).
pub(super) const LIGHT_THRESHOLD: i32 = 1000;

/// Below this average of writes per commit the load is light (inline commits and batches of
/// one; under load a batch holds dozens).
const LIGHT_LOAD: f32 = 1.5;

/// The log's length at which the writer checkpoints by itself, a pass or not.
pub(super) const LIMIT: i32 = 4 * THRESHOLD;

thread_local! {
    /// Frames in the log after the last commit on this thread's write connection.
    static LOG_FRAMES: Cell<i32> = const { Cell::new(0) };
}

/// The write connection's hook (see the module's documentation).
fn record_log_frames(_: &Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    LOG_FRAMES.set(frames);
    Ok(())
}

/// Makes `conn`'s commits report the log's length to [`log_frames`] instead of checkpointing
/// by themselves (the hook replaces SQLite's automatic checkpoint).
pub(super) fn watch_log(conn: &Connection) {
    conn.wal_hook(Some(record_log_frames));
}

/// Frames in the log after the last commit on this thread.
pub(super) fn log_frames() -> i32 {
    LOG_FRAMES.get()
}

/// The background pass's thread, as the writer sees it.
pub(super) struct Backfill {
    ask: Option<SyncSender<()>>,
    /// Set by the thread when a pass has finished, cleared by the writer as it catches up.
    done: Arc<AtomicBool>,
    /// A pass was asked for and the writer has not caught up after it yet.
    asked: bool,
    thread: Option<JoinHandle<()>>,
    /// [`LIGHT_THRESHOLD`], [`THRESHOLD`] and [`LIMIT`] (smaller in tests).
    light_threshold: i32,
    threshold: i32,
    limit: i32,
    /// Writes per commit, a moving average over the last commits (about sixteen).
    writes: f32,
}

/// What the writer is to do after a commit, the log being `frames` long.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Nothing.
    Wait,
    /// Copy the rest of the log itself: a pass has finished, or the log is too long.
    CatchUp,
}

impl Backfill {
    /// Starts the thread, with its own connection to the ledger at `path`. `None` (after a
    /// warning) if it cannot start: the writer then checkpoints by itself.
    pub(super) fn start(path: &Path) -> Option<Backfill> {
        Backfill::start_with(path, LIGHT_THRESHOLD, THRESHOLD, LIMIT)
    }

    fn start_with(
        path: &Path,
        light_threshold: i32,
        threshold: i32,
        limit: i32,
    ) -> Option<Backfill> {
        let conn = match Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .and_then(|conn| {
            // The copy's fsync, as the writer's own: the database file is synced before the
            // pass counts as done.
            conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 0;")?;
            Ok(conn)
        }) {
            Ok(conn) => conn,
            Err(error) => {
                warn!(%error, "the ledger's checkpoint thread cannot open the ledger; the writer checkpoints by itself");
                return None;
            }
        };
        let (ask, asked) = mpsc::sync_channel::<()>(1);
        let done = Arc::new(AtomicBool::new(false));
        let finished = Arc::clone(&done);
        let thread = std::thread::Builder::new()
            .name("ledger-backfill".to_owned())
            .spawn(move || {
                while asked.recv().is_ok() {
                    if let Err(error) =
                        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    {
                        warn!(%error, "copying the write-ahead log into the ledger failed");
                    }
                    finished.store(true, Ordering::Release);
                }
                if let Err((_, error)) = conn.close() {
                    warn!(%error, "closing the ledger's checkpoint connection failed");
                }
            });
        match thread {
            Ok(thread) => Some(Backfill {
                ask: Some(ask),
                done,
                asked: false,
                thread: Some(thread),
                light_threshold,
                threshold,
                limit,
                writes: 1.0,
            }),
            Err(error) => {
                warn!(%error, "cannot start the ledger's checkpoint thread; the writer checkpoints by itself");
                None
            }
        }
    }

    /// After a commit of `writes` writes that left the log `frames` long: asks for a pass if
    /// one is due (at [`LIGHT_THRESHOLD`] at light load, [`THRESHOLD`] under load), and says
    /// whether the writer is to catch up now.
    pub(super) fn after_commit(&mut self, frames: i32, writes: usize) -> Next {
        self.writes += (writes as f32 - self.writes) / 16.0;
        let threshold = if self.writes < LIGHT_LOAD {
            self.light_threshold
        } else {
            self.threshold
        };
        if self.asked {
            if self.done.swap(false, Ordering::Acquire) || frames >= self.limit {
                self.asked = false;
                return Next::CatchUp;
            }
            return Next::Wait;
        }
        if frames >= threshold {
            match self.ask.as_ref().map(|ask| ask.try_send(())) {
                // A full channel holds a request already.
                Some(Ok(()) | Err(TrySendError::Full(()))) => self.asked = true,
                Some(Err(TrySendError::Disconnected(()))) | None => return Next::CatchUp,
            }
        }
        Next::Wait
    }

    /// Stops the thread once its pass (if any) is done, so the writer's last checkpoint finds
    /// no other one running.
    pub(super) fn stop(&mut self) {
        drop(self.ask.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            warn!("the ledger's checkpoint thread panicked");
        }
    }
}

impl Drop for Backfill {
    fn drop(&mut self) {
        self.stop();
    }
}

/// After a commit that left the log `frames` long, with the pass's thread or without it (the
/// writer then checkpoints by itself at [`THRESHOLD`]).
pub(super) fn next(backfill: Option<&mut Backfill>, frames: i32, writes: usize) -> Next {
    match backfill {
        Some(backfill) => backfill.after_commit(frames, writes),
        None if frames >= THRESHOLD => Next::CatchUp,
        None => Next::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer committing without pause (no fsync, so commits take microseconds and a pass
    /// never finds a moment without one) still sees its log start over again and again, the
    /// copying done beside it, and every row is in the database.
    #[test]
    fn a_busy_writer_keeps_its_log_short() {
        const THRESHOLD: i32 = 64;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let writer = Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF; \
                 CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL);",
            )
            .unwrap();
        watch_log(&writer);
        let mut backfill = Backfill::start_with(&path, THRESHOLD, THRESHOLD, i32::MAX).unwrap();
        let (mut commits, mut longest, mut restarts, mut last) = (0_i64, 0, 0, 0);
        let started = std::time::Instant::now();
        // Until the log has started over five times: each row takes about half a page, so
        // without the catch-up it would only grow. (Bounded in time, not in commits: on a
        // loaded machine the pass's thread may wait long for a core.)
        while restarts < 5 && started.elapsed() < std::time::Duration::from_secs(60) {
            writer
                .execute(
                    "INSERT INTO t (id, body) VALUES (?1, ?2)",
                    rusqlite::params![commits, "x".repeat(1500)],
                )
                .unwrap();
            commits += 1;
            let frames = log_frames();
            longest = longest.max(frames);
            if frames < last {
                restarts += 1;
            }
            last = frames;
            if backfill.after_commit(frames, 1) == Next::CatchUp {
                writer
                    .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    .unwrap();
            }
        }
        backfill.stop();
        assert!(
            restarts >= 5,
            "the log started over {restarts} times in {commits} commits, {longest} frames at most"
        );
        let copied: i64 = Connection::open(&path)
            .unwrap()
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(copied, commits);
    }

    /// An empty database in WAL mode in a temporary directory (kept while the guard lives).
    fn wal_ledger() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("PRAGMA journal_mode = WAL;")
            .unwrap();
        (dir, path)
    }

    /// At light load (commits of one write) a pass is asked for at the light threshold; under
    /// load (batches of dozens) only at the full one; and back at light load, at the light one
    /// again.
    #[test]
    fn the_threshold_follows_the_load() {
        let (_dir, path) = wal_ledger();
        let mut backfill = Backfill::start_with(&path, 10, 100, 1000).unwrap();
        assert_eq!(backfill.after_commit(9, 1), Next::Wait);
        assert!(!backfill.asked);
        assert_eq!(backfill.after_commit(10, 1), Next::Wait);
        assert!(
            backfill.asked,
            "a light commit past the light threshold asks"
        );

        let mut backfill = Backfill::start_with(&path, 10, 100, 1000).unwrap();
        for frames in 1..=99 {
            assert_eq!(backfill.after_commit(frames, 40), Next::Wait);
        }
        assert!(
            !backfill.asked,
            "under load, 99 frames are below the threshold"
        );
        assert_eq!(backfill.after_commit(100, 40), Next::Wait);
        assert!(backfill.asked);

        let mut backfill = Backfill::start_with(&path, 10, 100, 1000).unwrap();
        for _ in 0..20 {
            backfill.after_commit(1, 40);
        }
        // Light commits bring the average down within a few dozen.
        let light_after = (1..=100)
            .find(|_| {
                backfill.after_commit(50, 1);
                backfill.asked
            })
            .expect("back at light load, a pass is asked for");
        assert!(light_after > 1, "not at once after a loaded stretch");
    }

    /// Without the thread the writer checkpoints by itself at the threshold; with it, only
    /// after a pass or past the limit.
    #[test]
    fn the_writer_catches_up_after_a_pass_or_past_the_limit() {
        assert_eq!(next(None, THRESHOLD - 1, 1), Next::Wait);
        assert_eq!(next(None, THRESHOLD, 1), Next::CatchUp);
        let (_dir, path) = wal_ledger();
        let mut backfill = Backfill::start_with(&path, 10, 10, 100).unwrap();
        assert_eq!(
            backfill.after_commit(9, 1),
            Next::Wait,
            "below the threshold"
        );
        assert_eq!(
            backfill.after_commit(10, 1),
            Next::Wait,
            "a pass is asked for"
        );
        // The pass finishes (nothing to copy); the writer catches up once.
        let waited = std::time::Instant::now();
        while !backfill.done.load(Ordering::Acquire) {
            assert!(
                waited.elapsed() < std::time::Duration::from_secs(10),
                "no pass"
            );
            std::thread::yield_now();
        }
        assert_eq!(backfill.after_commit(11, 1), Next::CatchUp);
        assert_eq!(
            backfill.after_commit(1, 1),
            Next::Wait,
            "the log started over"
        );
        // A pass that does not come back: the writer catches up at the limit.
        backfill.stop();
        assert_eq!(
            backfill.after_commit(10, 1),
            Next::CatchUp,
            "no thread to ask"
        );
        backfill.asked = true;
        assert_eq!(backfill.after_commit(99, 1), Next::Wait);
        assert_eq!(backfill.after_commit(100, 1), Next::CatchUp);
    }
}
