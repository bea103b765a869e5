//! The one-owner lock of a SQLite ledger: an exclusive lock on a file beside the database
//! (`toolgate.db.lock` for `toolgate.db`), taken before anything reads or writes the ledger.
//!
//! Why: the writer caches chain heads, and start-up recovery settles every call found
//! `running` as interrupted. A second process on the same file would do both to calls the first
//! is still running, and the first would then tell its agent something the ledger contradicts.
//!
//! The lock is `flock`-style (std's `File::try_lock`), held on the open file: the kernel drops
//! it when the process exits, however it exits, so a file left behind by `kill -9` never
//! blocks a restart. The file is never deleted (deleting a lock file lets two processes lock
//! two different files of the same name); it only says who holds it, for the refusal message.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::LedgerError;

/// The held lock; released when dropped.
#[derive(Debug)]
pub(super) struct OwnerLock {
    _file: File,
}

/// Where the lock of the ledger at `database` lives: the same name with `.lock` appended.
pub(super) fn lock_path(database: &Path) -> PathBuf {
    let mut name = database.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    database.with_file_name(name)
}

impl OwnerLock {
    /// Takes the lock of the ledger at `database` without waiting, and records this process in
    /// the file. `LedgerError::InUse` naming the holder when another process has it.
    pub(super) fn acquire(database: &Path) -> Result<OwnerLock, LedgerError> {
        let path = lock_path(database);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|error| {
                LedgerError::Database(format!(
                    "could not open the ledger lock file {}: {error}",
                    path.display()
                ))
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = holder(&mut file);
                return Err(LedgerError::InUse(format!(
                    "ledger {} is in use by another toolgate process ({holder}, per {}): a SQLite \
                     ledger has one owner, so stop that process first (several replicas need \
                     PostgreSQL); `toolgate ledger verify` works beside it",
                    database.display(),
                    path.display()
                )));
            }
            Err(TryLockError::Error(error)) => {
                return Err(LedgerError::Database(format!(
                    "could not lock the ledger lock file {}: {error}",
                    path.display()
                )));
            }
        }
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let note = format!(
            "pid {} started at unix time {started}\n",
            std::process::id()
        );
        let written = file
            .set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(note.as_bytes()))
            .and_then(|()| file.sync_data());
        if let Err(error) = written {
            return Err(LedgerError::Database(format!(
                "could not write the ledger lock file {}: {error}",
                path.display()
            )));
        }
        Ok(OwnerLock { _file: file })
    }
}

/// Who the lock file says holds it: what the holder wrote, or that it has not written yet.
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let read = file
        .seek(SeekFrom::Start(0))
        .and_then(|_| file.take(256).read_to_string(&mut text));
    match read {
        Ok(_) if !text.trim().is_empty() => text.trim().to_owned(),
        _ => "holder not recorded yet".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_file_sits_beside_the_database() {
        assert_eq!(
            lock_path(Path::new("/data/toolgate.db")),
            Path::new("/data/toolgate.db.lock")
        );
        assert_eq!(
            lock_path(Path::new("ledger.db")),
            Path::new("ledger.db.lock")
        );
    }

    #[test]
    fn a_second_owner_is_refused_with_the_holder_named_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("toolgate.db");
        let first = OwnerLock::acquire(&database).unwrap();
        let refused = OwnerLock::acquire(&database).unwrap_err();
        let message = refused.to_string();
        assert!(matches!(refused, LedgerError::InUse(_)), "{refused:?}");
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        assert!(message.contains("toolgate.db.lock"), "{message}");
        drop(first);
        let again = OwnerLock::acquire(&database);
        assert!(again.is_ok(), "{again:?}");
    }
}
