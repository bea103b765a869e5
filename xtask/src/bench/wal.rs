//! What the SQLite ledger's commits write, by table and index: read from the gateway's
//! write-ahead log while it runs. Each commit appends one frame per page it changed (a whole
//! page, 4 KiB, however little of it changed), so the frames a commit wrote, named by the
//! B-tree their page belongs to, say what a call costs the disk and where: a table or index
//! whose keys land on a different page for every call writes a page per call, one whose keys
//! arrive in order shares its last page with the whole batch.
//!
//! The log holds the frames since the writer last started it over (it does so once a
//! checkpoint has copied them back, every few thousand frames), so this reads the most recent
//! commits, not all of a phase's. Pages are named from SQLite's `dbstat` table, read on a
//! connection of its own; a page that changed owner since (freed by a split, reused) is
//! named by its owner now.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context as _, bail};

/// The log's header, then each frame's header before its page.
const LOG_HEADER: usize = 32;
const FRAME_HEADER: usize = 24;
/// The two magic numbers of a log (checksums big- or little-endian).
const MAGIC: [u32; 2] = [0x377f_0682, 0x377f_0683];

/// The commits read from a log: how many, their frames, and the frames per B-tree.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Frames {
    pub(crate) commits: usize,
    /// Frames by the B-tree their page belongs to (`?` for a page no B-tree holds now), most
    /// first.
    pub(crate) by_btree: Vec<(String, usize)>,
}

impl Frames {
    /// The frames of all the commits read.
    pub(crate) fn frames(&self) -> usize {
        self.by_btree.iter().map(|(_, frames)| frames).sum()
    }

    /// `frames per commit: name n, ...` for the `top` B-trees writing most.
    pub(crate) fn summary(&self, top: usize) -> String {
        let per_commit = |frames: usize| frames as f64 / self.commits.max(1) as f64;
        let mut text = format!(
            "{:.1} pages per commit over the last {} commits: ",
            per_commit(self.frames()),
            self.commits
        );
        let named: Vec<String> = self
            .by_btree
            .iter()
            .take(top)
            .map(|(name, frames)| format!("{name} {:.1}", per_commit(*frames)))
            .collect();
        text.push_str(&named.join(", "));
        text
    }
}

/// The committed frames of `database`'s log (`database` with `-wal` appended), named.
pub(crate) fn read(database: &Path) -> anyhow::Result<Frames> {
    let mut log_path = database.as_os_str().to_owned();
    log_path.push("-wal");
    let log = std::fs::read(&log_path).with_context(|| {
        format!(
            "cannot read the ledger's log {}",
            Path::new(&log_path).display()
        )
    })?;
    let commits = committed_pages(&log)?;
    let owners = page_owners(database)?;
    let mut by_btree: HashMap<&str, usize> = HashMap::new();
    for pages in &commits {
        for page in pages {
            let owner = owners.get(page).map_or("?", String::as_str);
            *by_btree.entry(owner).or_insert(0) += 1;
        }
    }
    let mut by_btree: Vec<(String, usize)> = by_btree
        .into_iter()
        .map(|(name, frames)| (name.to_owned(), frames))
        .collect();
    by_btree.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(Frames {
        commits: commits.len(),
        by_btree,
    })
}

/// The distinct pages of each complete commit in `log`. A frame belongs to the log's current
/// generation when its salts are the header's; the first that is not ends the log (what
/// follows is an earlier generation's), and frames after the last commit are a transaction
/// not committed yet. A page written twice in one commit counts once.
fn committed_pages(log: &[u8]) -> anyhow::Result<Vec<Vec<u32>>> {
    let word = |bytes: &[u8], at: usize| -> u32 {
        let mut word = [0; 4];
        word.copy_from_slice(&bytes[at..at + 4]);
        u32::from_be_bytes(word)
    };
    if log.len() < LOG_HEADER {
        return Ok(Vec::new());
    }
    if !MAGIC.contains(&word(log, 0)) {
        bail!("not a SQLite write-ahead log (its magic number is wrong)");
    }
    let page_size = usize::try_from(word(log, 8)).context("page size")?;
    if !(512..=65_536).contains(&page_size) || !page_size.is_power_of_two() {
        bail!("the log names page size {page_size}, which SQLite does not use");
    }
    let salts = (word(log, 16), word(log, 20));
    let mut commits = Vec::new();
    let mut pending: Vec<u32> = Vec::new();
    let mut at = LOG_HEADER;
    while at + FRAME_HEADER + page_size <= log.len() {
        let header = &log[at..at + FRAME_HEADER];
        if (word(header, 8), word(header, 12)) != salts {
            break;
        }
        pending.push(word(header, 0));
        // A commit's last frame carries the database's size in pages after it.
        if word(header, 4) != 0 {
            pending.sort_unstable();
            pending.dedup();
            commits.push(std::mem::take(&mut pending));
        }
        at += FRAME_HEADER + page_size;
    }
    Ok(commits)
}

/// Which table or index each page of `database` belongs to now.
fn page_owners(database: &Path) -> anyhow::Result<HashMap<u32, String>> {
    let conn = rusqlite::Connection::open_with_flags(
        database,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("cannot open {} to name its pages", database.display()))?;
    let mut statement = conn
        .prepare("SELECT name, pageno FROM dbstat")
        .context("cannot read the ledger's pages (dbstat)")?;
    let rows = statement
        .query_map([], |row| {
            Ok((row.get::<_, u32>(1)?, row.get::<_, String>(0)?))
        })
        .context("cannot read the ledger's pages (dbstat)")?;
    rows.collect::<Result<HashMap<_, _>, _>>()
        .context("cannot read the ledger's pages (dbstat)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ledger-like database in WAL mode that is never checkpointed: `ordered` gets rows in
    /// key order, `scattered` rows whose indexed key jumps all over its index.
    fn database(dir: &Path) -> (rusqlite::Connection, std::path::PathBuf) {
        let path = dir.join("ledger.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;
             CREATE TABLE ordered (seq INTEGER PRIMARY KEY, body TEXT NOT NULL);
             CREATE TABLE scattered (seq INTEGER PRIMARY KEY, key TEXT NOT NULL);
             CREATE INDEX scattered_key ON scattered (key);",
        )
        .unwrap();
        // Enough rows first that the index has many pages.
        conn.execute_batch("BEGIN").unwrap();
        for n in 0..20_000_u64 {
            conn.execute(
                "INSERT INTO scattered (key) VALUES (?1)",
                [format!("{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15))],
            )
            .unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
        (conn, path)
    }

    #[test]
    fn commits_are_read_from_the_log_and_their_pages_named() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, path) = database(dir.path());
        // Start the log over, so it holds only the commits below.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        for commit in 0..10_u64 {
            conn.execute_batch("BEGIN").unwrap();
            for n in 0..20_u64 {
                let at = (commit * 20 + n + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                conn.execute("INSERT INTO ordered (body) VALUES ('x')", [])
                    .unwrap();
                conn.execute(
                    "INSERT INTO scattered (key) VALUES (?1)",
                    [format!("{at:016x}")],
                )
                .unwrap();
            }
            conn.execute_batch("COMMIT").unwrap();
        }
        let frames = read(&path).unwrap();
        assert_eq!(frames.commits, 10, "{frames:?}");
        let count = |name: &str| {
            frames
                .by_btree
                .iter()
                .find(|(owner, _)| owner == name)
                .map_or(0, |(_, frames)| *frames)
        };
        // Twenty keys in order share a page or two; twenty scattered ones a page each,
        // nearly.
        assert!(count("ordered") <= 20, "{frames:?}");
        assert!(count("scattered_key") >= 150, "{frames:?}");
        assert_eq!(frames.by_btree[0].0, "scattered_key");
        let summary = frames.summary(2);
        let per_commit = format!("{:.1} pages per commit", frames.frames() as f64 / 10.0);
        assert!(summary.starts_with(&per_commit), "{summary}");
        assert!(
            summary.contains("over the last 10 commits: scattered_key "),
            "{summary}"
        );
    }

    /// A log of 512-byte pages: its header with salts `salts`, then each frame as (page,
    /// the database's size after it when it ends a commit, else 0, its salts).
    fn log(salts: (u32, u32), frames: &[(u32, u32, (u32, u32))]) -> Vec<u8> {
        let mut log = Vec::new();
        for word in [MAGIC[0], 3_007_000, 512, 0, salts.0, salts.1, 0, 0] {
            log.extend_from_slice(&word.to_be_bytes());
        }
        for (page, size, (salt1, salt2)) in frames {
            for word in [*page, *size, *salt1, *salt2, 0, 0] {
                log.extend_from_slice(&word.to_be_bytes());
            }
            log.extend_from_slice(&[0; 512]);
        }
        log
    }

    #[test]
    fn only_complete_commits_of_the_current_generation_are_read() {
        let now = (7, 9);
        let before = (1, 2);
        let frames = [
            (3, 0, now),
            (5, 0, now),
            // Page 3 again in the same commit: one page written.
            (3, 12, now),
            (4, 12, now),
            // Not committed yet.
            (8, 0, now),
            // What an earlier generation left past the end of this one.
            (6, 14, before),
            (2, 14, now),
        ];
        let bytes = log(now, &frames);
        assert_eq!(committed_pages(&bytes).unwrap(), [vec![3, 5], vec![4]]);
        // A frame cut short by the end of the file is not read.
        let cut = log(now, &[(3, 10, now), (4, 11, now)]);
        assert_eq!(committed_pages(&cut[..cut.len() - 1]).unwrap(), [vec![3]]);
    }

    #[test]
    fn what_is_not_a_log_is_refused_and_an_empty_one_has_no_commits() {
        assert!(committed_pages(&[0; 8]).unwrap().is_empty());
        let error = committed_pages(&[0xab; 64]).unwrap_err();
        assert!(error.to_string().contains("magic"), "{error}");
        let mut header = Vec::new();
        for word in [0x377f_0682_u32, 3_007_000, 1000, 0, 1, 2, 0, 0] {
            header.extend_from_slice(&word.to_be_bytes());
        }
        let error = committed_pages(&header).unwrap_err();
        assert!(error.to_string().contains("page size 1000"), "{error}");
        let missing = read(Path::new("/nonexistent/ledger.db")).unwrap_err();
        assert!(
            format!("{missing:#}").contains("ledger.db-wal"),
            "{missing:#}"
        );
    }
}
