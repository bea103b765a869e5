//! The benchmark's gateway on PostgreSQL (whose server is the test suite's, found by
//! `crate::pg::running_server_url`): what the server wrote for it, and cleaning up after it.
//! Both through `psql`, which comes with the server.

use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

/// What the PostgreSQL server wrote for the benchmark's calls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Storage {
    /// The calls recorded (rows of `tool_calls`).
    pub(crate) calls: u64,
    /// Write-ahead log written by the whole server meanwhile (nothing else writes during the
    /// benchmark).
    pub(crate) wal_bytes: u64,
    /// Updates of `tool_calls` rows (a call's finish, mostly).
    pub(crate) call_updates: u64,
    /// Of those, the HOT ones: rewritten in place, no index entry added.
    pub(crate) hot_call_updates: u64,
    /// The schema's tables with their indexes and TOAST, on disk at the end.
    pub(crate) disk_bytes: u64,
}

impl Storage {
    pub(crate) fn wal_per_call(&self) -> f64 {
        if self.calls == 0 {
            return f64::NAN;
        }
        as_f64(self.wal_bytes) / as_f64(self.calls)
    }

    pub(crate) fn disk_per_call(&self) -> f64 {
        if self.calls == 0 {
            return f64::NAN;
        }
        as_f64(self.disk_bytes) / as_f64(self.calls)
    }

    /// The share of `tool_calls` updates that were HOT, 0 to 1.
    pub(crate) fn hot_share(&self) -> f64 {
        if self.call_updates == 0 {
            return f64::NAN;
        }
        as_f64(self.hot_call_updates) / as_f64(self.call_updates)
    }

    pub(crate) fn summary(&self) -> String {
        format!(
            "PostgreSQL server: {:.1} KiB of WAL per call ({} calls), {:.1} KiB on disk per call (tables, indexes); tool_calls updates {}, {:.1}% HOT",
            self.wal_per_call() / 1024.0,
            self.calls,
            self.disk_per_call() / 1024.0,
            self.call_updates,
            self.hot_share() * 100.0
        )
    }
}

#[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
fn as_f64(value: u64) -> f64 {
    value as f64
}

/// Runs one query with `psql`, its rows unaligned (`|` between columns); `None` when `psql`
/// is missing or the query fails.
fn psql(url: &str, sql: &str) -> Option<String> {
    let output = Command::new("psql")
        .args([url, "-q", "-A", "-t", "-X", "-c", sql])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The server's write-ahead log position now (`pg_current_wal_lsn`).
pub(crate) fn wal_position(url: &str) -> Option<String> {
    psql(url, "SELECT pg_current_wal_lsn()").filter(|lsn| lsn.contains('/'))
}

/// What the server wrote since `since` (a [`wal_position`]) for the calls in `schema`. Call
/// after the gateway exited: a server process reports its table statistics when its
/// connection ends, so this waits (up to 5 s) until the update count stops moving.
pub(crate) fn storage(url: &str, schema: &str, since: &str) -> Option<Storage> {
    // The schema is the benchmark's own name and `since` came from the server: no quoting
    // beyond the literal's is needed, and neither can hold a quote.
    if !schema
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        || since.contains('\'')
    {
        return None;
    }
    let sql = format!(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{since}')::bigint, \
         (SELECT count(*) FROM {schema}.tool_calls), \
         COALESCE(s.n_tup_upd, 0), COALESCE(s.n_tup_hot_upd, 0), \
         (SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class AS c \
         JOIN pg_namespace AS n ON n.oid = c.relnamespace \
         WHERE n.nspname = '{schema}' AND c.relkind = 'r') \
         FROM (SELECT 1) AS one LEFT JOIN pg_stat_user_tables AS s \
         ON s.schemaname = '{schema}' AND s.relname = 'tool_calls'"
    );
    let mut last: Option<Storage> = None;
    for _ in 0..20 {
        let now = parse_storage(&psql(url, &sql)?)?;
        if let Some(before) = last
            && before.call_updates == now.call_updates
            && now.call_updates > 0
        {
            return Some(now);
        }
        last = Some(now);
        thread::sleep(Duration::from_millis(250));
    }
    last
}

/// `wal|calls|updates|hot|disk` as `psql -A -t` prints it.
fn parse_storage(line: &str) -> Option<Storage> {
    let mut fields = line
        .split('|')
        .map(|field| field.trim().parse::<u64>().ok());
    let storage = Storage {
        wal_bytes: fields.next()??,
        calls: fields.next()??,
        call_updates: fields.next()??,
        hot_call_updates: fields.next()??,
        disk_bytes: fields.next()??,
    };
    fields.next().is_none().then_some(storage)
}

/// Drops the benchmark's schema with `psql`; says so when it cannot.
pub(crate) fn drop_schema(url: &str, schema: &str) {
    let dropped = psql(url, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).is_some();
    if !dropped {
        println!("  note: could not drop schema {schema} (no psql?); drop it by hand");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storage_line_is_read_whole_or_not_at_all() {
        let storage = parse_storage("3145728|1024|1000|990|1048576").unwrap();
        assert_eq!(storage.wal_bytes, 3_145_728);
        assert_eq!(storage.calls, 1024);
        assert!((storage.wal_per_call() - 3072.0).abs() < 1e-9);
        assert!((storage.disk_per_call() - 1024.0).abs() < 1e-9);
        assert!((storage.hot_share() - 0.99).abs() < 1e-9);
        assert!(storage.summary().contains("3.0 KiB of WAL per call"));
        assert!(storage.summary().contains("1.0 KiB on disk per call"));
        assert!(storage.summary().contains("99.0% HOT"));
        assert!(parse_storage("3145728|1024|1000|990").is_none());
        assert!(parse_storage("3145728|1024|1000|990|1|2").is_none());
        assert!(parse_storage("-1|1024|1000|990|1").is_none());
        assert!(parse_storage("").is_none());
    }

    #[test]
    fn nothing_recorded_reads_as_not_a_number() {
        let empty = Storage {
            calls: 0,
            wal_bytes: 10,
            call_updates: 0,
            hot_call_updates: 0,
            disk_bytes: 8192,
        };
        assert!(empty.wal_per_call().is_nan());
        assert!(empty.disk_per_call().is_nan());
        assert!(empty.hot_share().is_nan());
    }

    #[test]
    fn storage_is_measured_on_the_servers_own_counters() {
        let Some(url) = crate::pg::running_server_url() else {
            eprintln!("skipped: no PostgreSQL server");
            return;
        };
        let Some(since) = wal_position(&url) else {
            eprintln!("skipped: no psql");
            return;
        };
        let schema = format!("toolgate_bench_storage_{}", std::process::id());
        let setup = format!(
            "CREATE SCHEMA {schema}; \
             CREATE TABLE {schema}.tool_calls (id int PRIMARY KEY, status text); \
             INSERT INTO {schema}.tool_calls SELECT g, 'running' FROM generate_series(1, 100) g; \
             UPDATE {schema}.tool_calls SET status = 'done'"
        );
        assert!(psql(&url, &setup).is_some());
        let storage = storage(&url, &schema, &since);
        drop_schema(&url, &schema);
        let storage = storage.unwrap();
        assert_eq!(storage.calls, 100);
        assert_eq!(storage.call_updates, 100);
        assert!(storage.wal_bytes > 0);
        // At least the table's one page and its primary key's two.
        assert!(storage.disk_bytes >= 3 * 8192, "{storage:?}");
    }
}
