//! The PostgreSQL server the benchmark's second gateway uses: the test suite's
//! (`TOOLGATE_TEST_PG_URL`, default `postgres://postgres@127.0.0.1:5432/test`) when it accepts
//! connections.

use std::net::{TcpStream, ToSocketAddrs as _};
use std::process::{Command, Stdio};
use std::time::Duration;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The URL to benchmark against, when its server accepts TCP connections.
pub(crate) fn url() -> Option<String> {
    let url = std::env::var("TOOLGATE_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    let address = host_port.to_socket_addrs().ok()?.next()?;
    TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
    Some(url)
}

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
