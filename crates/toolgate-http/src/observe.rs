//! What the client reports as it works, for whoever keeps metrics: a narrow hook with a no-op
//! default, so this crate holds no metric state and a library user needs nothing.

use std::fmt;
use std::time::Duration;

/// How one attempt ended, as far as counting goes: its status, or why none came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The vendor answered with this status (any, redirects and errors included).
    Status(u16),
    /// No answer: the connection failed or the response could not be read.
    Connection,
    /// The attempt did not finish before the call's deadline.
    Timeout,
    /// Refused before or while sending (the SSRF guard, an unusable request or redirect, a body
    /// over the cap).
    Refused,
}

/// Receives the client's observations. Every method has an empty default; implement the ones
/// you count. `host` is the request's `host` or `host:port` (no userinfo, path or query).
/// Called on the request path: implementations must be quick and must not block.
pub trait HttpObserver: fmt::Debug + Send + Sync {
    /// An attempt was sent (or tried) and ended as `outcome`.
    fn attempt(&self, host: &str, outcome: AttemptOutcome) {
        let _ = (host, outcome);
    }

    /// A failed attempt is retried.
    fn retry(&self, host: &str) {
        let _ = host;
    }

    /// The retry policy would have retried, but the client's retry budget was spent.
    fn retry_budget_refused(&self, host: &str) {
        let _ = host;
    }

    /// A request waited `waited` for the host's rate limit before it could be sent.
    fn rate_limit_wait(&self, host: &str, waited: Duration) {
        let _ = (host, waited);
    }
}

/// The observer a client has unless given one: it ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHttpObserver;

impl HttpObserver for NoHttpObserver {}
