//! Cleaning up after the benchmark's gateway on PostgreSQL (whose server is the test suite's,
//! found by `crate::pg::running_server_url`).

use std::process::{Command, Stdio};

/// Drops the benchmark's schema with `psql`; says so when it cannot.
pub(crate) fn drop_schema(url: &str, schema: &str) {
    let dropped = Command::new("psql")
        .args([
            url,
            "-q",
            "-c",
            &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !dropped {
        println!("  note: could not drop schema {schema} (no psql?); drop it by hand");
    }
}
