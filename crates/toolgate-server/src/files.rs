//! Files that hold secrets (the key file, token files): written private (0600) and refused
//! when the group or others can access them.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;

/// Refuses a file holding secrets (`what`: "key file", "admin token file", ...) when the group
/// or others have any access to it, naming the command that fixes it, as ssh refuses a
/// private key others can read. A missing file is not refused here.
pub fn refuse_shared_file(path: &Path, what: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(error)
                .with_context(|| format!("cannot read the permissions of {}", path.display()));
        }
    };
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "the {what} {} has mode {mode:04o}, so other users can read it: run `chmod 600 {}`, then try again",
            path.display(),
            path.display()
        );
    }
    Ok(())
}

/// Writes `contents` to `path`, created or truncated, readable and writable by the user only
/// (a file that existed is made private too), and syncs it.
pub fn write_private_file(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A pre-existing file keeps its mode on open; make sure it is private.
    use std::os::unix::fs::PermissionsExt as _;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}
