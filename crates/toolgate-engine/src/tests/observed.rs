//! The engine's observer: told how each call ended, how long each connector ran and how each
//! cache lookup went, in order, without changing any outcome.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use toolgate_core::{Decision, ToolCallStatus};

use super::harness;
use super::ledgers::{self, Backend, ledger_test};
use crate::{CacheKind, CallReport, EngineObserver};

/// What one call's report said.
#[derive(Debug, Clone, PartialEq)]
struct Ended {
    tool: String,
    status: Option<ToolCallStatus>,
    decision: Option<Decision>,
    connector: Duration,
    total: Duration,
}

#[derive(Debug, Default)]
struct Recorder {
    calls: Mutex<Vec<Ended>>,
    connectors: Mutex<Vec<String>>,
    lookups: Mutex<Vec<(CacheKind, bool)>>,
}

impl EngineObserver for Recorder {
    fn call_finished(&self, report: &CallReport<'_>) {
        self.calls.lock().unwrap().push(Ended {
            tool: report.requested_tool.to_owned(),
            status: report.status,
            decision: report.decision,
            connector: report.connector,
            total: report.total,
        });
    }

    fn connector_finished(&self, tool: &str, _elapsed: Duration) {
        self.connectors.lock().unwrap().push(tool.to_owned());
    }

    fn cache_lookup(&self, cache: CacheKind, hit: bool) {
        self.lookups.lock().unwrap().push((cache, hit));
    }
}

async fn the_observer_hears_every_call_connector_and_cache_lookup(backend: Backend) {
    let mut h = harness(&backend).await;
    let recorder = Arc::new(Recorder::default());
    h.engine = h
        .engine
        .with_observer(Arc::clone(&recorder) as Arc<dyn EngineObserver>);
    let run = h.run(None).await;
    let cases = [
        (
            "testkit.echo",
            r#"{"message": "hi"}"#,
            ToolCallStatus::Succeeded,
        ),
        (
            "testkit__echo",
            r#"{"message": "hi"}"#,
            ToolCallStatus::Succeeded,
        ),
        (
            "testkit.fail",
            r#"{"code": "VENDOR_ERROR"}"#,
            ToolCallStatus::Failed,
        ),
        ("testkit.echo", r#"{"message": 1}"#, ToolCallStatus::Failed),
    ];
    let mut outcomes = Vec::new();
    for (tool, arguments, status) in cases {
        let outcome = h.call(&run, tool, arguments).await;
        assert_eq!(outcome.status, status, "{tool}: {outcome:?}");
        outcomes.push(outcome);
    }
    let unknown_run = h
        .engine
        .execute(h.request(
            &toolgate_core::RunId::new("run_missing").unwrap(),
            "testkit.noop",
            "{}",
        ))
        .await;
    assert!(unknown_run.is_err());

    let calls = recorder.calls.lock().unwrap().clone();
    let seen: Vec<(&str, Option<ToolCallStatus>, Option<Decision>)> = calls
        .iter()
        .map(|c| (c.tool.as_str(), c.status, c.decision))
        .collect();
    let allowed = Some(Decision::Allow);
    assert_eq!(
        seen,
        [
            ("testkit.echo", Some(ToolCallStatus::Succeeded), allowed),
            ("testkit__echo", Some(ToolCallStatus::Succeeded), allowed),
            ("testkit.fail", Some(ToolCallStatus::Failed), allowed),
            ("testkit.echo", Some(ToolCallStatus::Failed), None),
            ("testkit.noop", None, None),
        ]
    );
    for (ended, outcome) in calls.iter().zip(&outcomes) {
        assert_eq!(ended.connector, outcome.duration, "{ended:?}");
        assert!(ended.total >= ended.connector, "{ended:?}");
    }
    // The connector ran for the three calls that reached it, under the catalogue's name.
    assert_eq!(
        *recorder.connectors.lock().unwrap(),
        ["testkit.echo", "testkit.echo", "testkit.fail"]
    );
    // Every call looked its run up; after the first, the cache had it.
    let lookups = recorder.lookups.lock().unwrap().clone();
    let runs: Vec<bool> = lookups
        .iter()
        .filter(|(cache, _)| *cache == CacheKind::Runs)
        .map(|(_, hit)| *hit)
        .collect();
    assert_eq!(runs.len(), 5, "{lookups:?}");
    assert!(runs[1..4].iter().all(|hit| *hit), "{lookups:?}");
    assert!(!runs[4], "the missing run is a miss: {lookups:?}");
    assert!(
        lookups.iter().any(|(cache, _)| *cache == CacheKind::Flags),
        "{lookups:?}"
    );
}
ledger_test!(the_observer_hears_every_call_connector_and_cache_lookup);
