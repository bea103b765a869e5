//! The gateway's own account of its ledger writes, read from its Prometheus endpoint: how many
//! commits the calls of a phase cost and how many writes each commit carried. On SQLite every
//! commit is one fsync of the write-ahead log (`synchronous=FULL`), so commits per call are
//! the WAL fsyncs per call; checkpoints add a few more, amortised over thousands of calls.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The batch-size histogram's upper bounds, as the gateway exports them (`le`), then `+Inf`.
/// A scrape whose buckets differ is refused rather than misread.
const BATCH_BOUNDS: &[u32] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

/// Cumulative ledger and call counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LedgerCounters {
    /// Tool calls counted (`toolgate_tool_calls_total`, every label).
    pub(crate) calls: u64,
    /// Batches committed (`toolgate_ledger_batch_operations_count`).
    pub(crate) commits: u64,
    /// Writes in them (`toolgate_ledger_batch_operations_sum`).
    pub(crate) operations: f64,
    /// Cumulative batch counts per bound of [`BATCH_BOUNDS`], then `+Inf`.
    pub(crate) buckets: Vec<u64>,
}

/// What one phase's calls cost the ledger: the difference of two scrapes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LedgerWrites {
    pub(crate) calls: u64,
    pub(crate) commits: u64,
    pub(crate) operations: f64,
    /// Batches per size range: `(lower, upper, count)`, upper `None` past the last bound.
    pub(crate) sizes: Vec<(u64, Option<u64>, u64)>,
}

impl LedgerWrites {
    /// Commits (SQLite: WAL fsyncs) per tool call.
    pub(crate) fn commits_per_call(&self) -> f64 {
        ratio(self.commits as f64, self.calls as f64)
    }

    /// Writes per commit, on average.
    pub(crate) fn mean_batch(&self) -> f64 {
        ratio(self.operations, self.commits as f64)
    }

    /// The size ranges that held any batch, as `1: 40%, 2: 31%, 3-4: 20%, ...`.
    pub(crate) fn distribution(&self) -> String {
        let parts: Vec<String> = self
            .sizes
            .iter()
            .filter(|(_, _, count)| *count > 0)
            .map(|(lower, upper, count)| {
                let share = 100.0 * ratio(*count as f64, self.commits as f64);
                match upper {
                    Some(upper) if upper == lower => format!("{lower}: {share:.0}%"),
                    Some(upper) => format!("{lower}-{upper}: {share:.0}%"),
                    None => format!("{lower}+: {share:.0}%"),
                }
            })
            .collect();
        if parts.is_empty() {
            "no batches".to_owned()
        } else {
            parts.join(", ")
        }
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "calls": self.calls,
            "commits": self.commits,
            "commits_per_call": self.commits_per_call(),
            "mean_operations_per_commit": self.mean_batch(),
            "batch_sizes": self
                .sizes
                .iter()
                .map(|(lower, upper, count)| serde_json::json!({
                    "from": lower,
                    "to": upper,
                    "batches": count,
                }))
                .collect::<Vec<_>>(),
        })
    }
}

impl LedgerCounters {
    /// What happened between `self` (earlier) and `later`.
    pub(crate) fn until(&self, later: &LedgerCounters) -> LedgerWrites {
        let per_bucket = |counters: &LedgerCounters| -> Vec<u64> {
            let mut previous = 0;
            counters
                .buckets
                .iter()
                .map(|&cumulative| {
                    let own = cumulative.saturating_sub(previous);
                    previous = cumulative;
                    own
                })
                .collect()
        };
        let before = per_bucket(self);
        let after = per_bucket(later);
        let mut lower = 1;
        let sizes = after
            .iter()
            .enumerate()
            .map(|(index, &count)| {
                let upper = BATCH_BOUNDS.get(index).map(|&bound| u64::from(bound));
                let range = (
                    lower,
                    upper,
                    count - before.get(index).copied().unwrap_or(0),
                );
                lower = upper.map_or(lower, |upper| upper + 1);
                range
            })
            .collect();
        LedgerWrites {
            calls: later.calls.saturating_sub(self.calls),
            commits: later.commits.saturating_sub(self.commits),
            operations: (later.operations - self.operations).max(0.0),
            sizes,
        }
    }
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        0.0
    }
}

/// Reads the counters from `url` (`http://127.0.0.1:PORT/metrics`).
pub(crate) fn scrape(url: &str) -> anyhow::Result<LedgerCounters> {
    let text = get(url)?;
    parse(&text).with_context(|| format!("the metrics at {url}"))
}

/// One HTTP/1.1 GET on loopback, the connection closed after the answer.
fn get(url: &str) -> anyhow::Result<String> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("not an http URL: {url}"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = TcpStream::connect(authority)
        .with_context(|| format!("cannot connect to the metrics endpoint {authority}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let request = format!("GET /{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .context("cannot read the metrics")?;
    let response = String::from_utf8(response).context("the metrics are not UTF-8")?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("the metrics answer has no header end")?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        bail!("the metrics endpoint answered `{status}`");
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        bail!("the metrics endpoint answered in chunks, which this reader does not decode");
    }
    Ok(body.to_owned())
}

/// Reads the counters out of a text exposition.
fn parse(text: &str) -> anyhow::Result<LedgerCounters> {
    let mut counters = LedgerCounters::default();
    let mut bounds = Vec::new();
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let number = || -> anyhow::Result<f64> {
            value
                .parse::<f64>()
                .with_context(|| format!("`{line}` has no number"))
        };
        // Counters and bucket counts are whole numbers in the exposition.
        let count = || -> anyhow::Result<u64> {
            value
                .parse::<u64>()
                .with_context(|| format!("`{line}` has no whole count"))
        };
        if series.starts_with("toolgate_tool_calls_total{") {
            counters.calls += count()?;
        } else if series == "toolgate_ledger_batch_operations_count" {
            counters.commits = count()?;
        } else if series == "toolgate_ledger_batch_operations_sum" {
            counters.operations = number()?;
        } else if let Some(labels) = series.strip_prefix("toolgate_ledger_batch_operations_bucket{")
        {
            let bound = labels
                .strip_prefix("le=\"")
                .and_then(|rest| rest.strip_suffix("\"}"))
                .with_context(|| format!("`{line}` has no `le` label"))?;
            bounds.push(bound.to_owned());
            counters.buckets.push(count()?);
        }
    }
    let expected = BATCH_BOUNDS.len() + 1;
    let matches = bounds.len() == expected
        && bounds.last().map(String::as_str) == Some("+Inf")
        && bounds
            .iter()
            .zip(BATCH_BOUNDS)
            .all(|(bound, &expected)| bound.parse::<f64>().ok() == Some(f64::from(expected)));
    if !matches {
        bail!(
            "toolgate_ledger_batch_operations has the buckets {bounds:?}, not the {BATCH_BOUNDS:?} and +Inf this report reads"
        );
    }
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(calls: u64, buckets: [u64; 11], sum: f64) -> String {
        let mut text = String::from(
            "# HELP toolgate_tool_calls Tool calls.\n# TYPE toolgate_tool_calls counter\n",
        );
        text.push_str(&format!(
            "toolgate_tool_calls_total{{tool=\"testkit.noop\",status=\"succeeded\",decision=\"allow\"}} {}\n",
            calls - 1
        ));
        text.push_str(
            "toolgate_tool_calls_total{tool=\"testkit.noop\",status=\"blocked\",decision=\"block\"} 1\n",
        );
        text.push_str("# TYPE toolgate_ledger_batch_operations histogram\n");
        text.push_str(&format!("toolgate_ledger_batch_operations_sum {sum}\n"));
        text.push_str(&format!(
            "toolgate_ledger_batch_operations_count {}\n",
            buckets[10]
        ));
        for (index, count) in buckets.iter().enumerate() {
            let le = BATCH_BOUNDS
                .get(index)
                .map_or("+Inf".to_owned(), |b| format!("{:?}", f64::from(*b)));
            text.push_str(&format!(
                "toolgate_ledger_batch_operations_bucket{{le=\"{le}\"}} {count}\n"
            ));
        }
        text.push_str("# EOF\n");
        text
    }

    #[test]
    fn two_scrapes_give_commits_per_call_and_the_batch_sizes_between_them() {
        let before = parse(&exposition(10, [2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], 9.0)).unwrap();
        let after = parse(&exposition(
            110,
            [12, 24, 44, 54, 54, 54, 54, 54, 54, 54, 54],
            209.0,
        ))
        .unwrap();
        let writes = before.until(&after);
        assert_eq!(writes.calls, 100);
        assert_eq!(writes.commits, 50);
        assert!((writes.commits_per_call() - 0.5).abs() < 1e-9);
        assert!((writes.mean_batch() - 4.0).abs() < 1e-9);
        assert_eq!(
            writes.sizes[..4],
            [
                (1, Some(1), 10),
                (2, Some(2), 10),
                (3, Some(4), 20),
                (5, Some(8), 10)
            ]
        );
        assert_eq!(writes.sizes.last(), Some(&(513, None, 0)));
        assert_eq!(writes.distribution(), "1: 20%, 2: 20%, 3-4: 40%, 5-8: 20%");
    }

    #[test]
    fn buckets_other_than_the_known_ones_are_refused() {
        let text = exposition(3, [1; 11], 1.0).replace("le=\"4.0\"", "le=\"5.0\"");
        let error = parse(&text).unwrap_err().to_string();
        assert!(error.contains("buckets"), "{error}");
        let missing = parse("toolgate_tool_calls_total{tool=\"x\"} 1\n").unwrap_err();
        assert!(missing.to_string().contains("buckets"), "{missing}");
    }

    #[test]
    fn a_scrape_over_a_real_socket_reads_the_body() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let body = exposition(5, [1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3], 6.0);
        let served = body.clone();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let read = stream.read(&mut chunk).unwrap();
                assert!(read > 0, "the request ended early");
                request.extend_from_slice(&chunk[..read]);
            }
            assert!(request.starts_with(b"GET /metrics HTTP/1.1\r\n"));
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{served}",
                served.len()
            )
            .unwrap();
        });
        let counters = scrape(&format!("http://{address}/metrics")).unwrap();
        server.join().unwrap();
        assert_eq!(counters, parse(&body).unwrap());
        assert_eq!(counters.calls, 5);
        assert_eq!(counters.commits, 3);
    }
}
