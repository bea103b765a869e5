//! The ledger's files are private to the user the gateway runs as: the database is created
//! 0600 before SQLite opens it (SQLite gives its `-wal` and `-shm` files the database's mode),
//! and a database or log that others can read or write is refused, with the command that
//! fixes it, as ssh refuses a private key others can read.

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use crate::error::LedgerError;

/// Creates the database file `path` 0600 when it does not exist, and refuses it, or a
/// `-wal` or `-shm` file beside it, when its mode gives the group or others any access.
pub(super) fn prepare(path: &Path) -> Result<(), LedgerError> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {}
        // Another process may create it between the check and the open: both are fine.
        Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
        Err(error) => {
            return Err(LedgerError::Database(format!(
                "could not create ledger {}: {error}",
                path.display()
            )));
        }
    }
    for file in [
        path.to_path_buf(),
        sibling(path, "-wal"),
        sibling(path, "-shm"),
    ] {
        check_private(&file)?;
    }
    Ok(())
}

/// `path` with `suffix` appended to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Refuses `path` when the group or others have any access to it; a missing file is fine.
fn check_private(path: &Path) -> Result<(), LedgerError> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(LedgerError::Database(format!(
                "could not read the permissions of {}: {error}",
                path.display()
            )));
        }
    };
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(LedgerError::Database(format!(
            "ledger file {} has mode {mode:04o}, so other users can access the ledger: run \
             `chmod 600 {}` (and the same for its -wal and -shm files), then start again",
            path.display(),
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_is_created_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        prepare(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn files_others_can_read_are_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        for (file, mode) in [
            (path.clone(), 0o644),
            (sibling(&path, "-wal"), 0o640),
            (sibling(&path, "-shm"), 0o602),
        ] {
            std::fs::write(&path, b"").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::fs::write(&file, b"").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let error = prepare(&path).unwrap_err().to_string();
            assert!(
                error.contains(&format!("chmod 600 {}", file.display())),
                "{error}"
            );
            assert!(error.contains(&format!("{mode:04o}")), "{error}");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        prepare(&path).unwrap();
    }
}
