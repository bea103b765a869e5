//! What the engine reports as it works, for whoever keeps metrics: a narrow hook with no-op
//! defaults, so the engine holds no metric state and a library user needs nothing.

use std::fmt;
use std::time::Duration;

use toolgate_core::{Decision, ToolCallStatus};

/// One `Engine::execute`, as it ended.
#[derive(Clone, Copy, Debug)]
pub struct CallReport<'a> {
    /// The tool as the agent named it (`family.action` or `family__action`), unchecked: it may
    /// name no registered tool, so an observer must bound it before using it as a label.
    pub requested_tool: &'a str,
    /// How the call ended; `None` when the request could not be served at all (a malformed
    /// id, an unknown run, a reused `tool_use_id`, the ledger failing).
    pub status: Option<ToolCallStatus>,
    /// The policy decision, when one was made.
    pub decision: Option<Decision>,
    /// From the request reaching the engine to its answer.
    pub total: Duration,
    /// Of that, the time the connector ran (zero when it did not run, and for a replay).
    pub connector: Duration,
}

/// The engine's in-memory caches, as an observer tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheKind {
    /// Runs and their manifests.
    Runs,
    /// Tenants' kill switches.
    Flags,
    /// Tenants' compiled policies.
    Policies,
}

impl CacheKind {
    /// Every cache.
    pub const ALL: [CacheKind; 3] = [CacheKind::Runs, CacheKind::Flags, CacheKind::Policies];

    /// The name used in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheKind::Runs => "runs",
            CacheKind::Flags => "flags",
            CacheKind::Policies => "policies",
        }
    }
}

/// Receives the engine's observations. Every method has an empty default. Called on the call
/// path: implementations must be quick and must not block.
pub trait EngineObserver: fmt::Debug + Send + Sync {
    /// An `Engine::execute` ended.
    fn call_finished(&self, report: &CallReport<'_>) {
        let _ = report;
    }

    /// A connector finished running (for a new call or an approved one) after `elapsed`.
    /// `tool` is a registered tool's name.
    fn connector_finished(&self, tool: &str, elapsed: Duration) {
        let _ = (tool, elapsed);
    }

    /// The hot path looked something up in one of its caches: found and trusted (`hit`), or
    /// not (absent, or past its time to live).
    fn cache_lookup(&self, cache: CacheKind, hit: bool) {
        let _ = (cache, hit);
    }
}

/// The observer an engine has unless given one: it ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoEngineObserver;

impl EngineObserver for NoEngineObserver {}
