//! The engine's settings, validated by the gateway before anything starts.

use std::time::Duration;

/// Engine settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// The longest timeout a call may ask for (per-call overrides are clamped to it).
    pub max_timeout: Duration,
    /// The call budget of a run that does not ask for one.
    pub default_max_calls: u32,
    /// The largest budget a run may ask for.
    pub max_calls_limit: u32,
    /// The largest accepted arguments text, in bytes.
    pub max_argument_bytes: usize,
    /// How long cached flags and policy sets are trusted before being re-read from the store
    /// (changes made through this process apply at once; this bounds changes made elsewhere).
    pub cache_ttl: Duration,
    /// How long a pending invocation waits for a human before it resolves as rejected.
    pub pending_expiry: Duration,
    /// How long each call's full answer is kept, sealed, for replays and for collecting the
    /// outcome of an approved call; zero keeps none.
    pub answer_retention: Duration,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            max_timeout: Duration::from_secs(300),
            default_max_calls: 100,
            max_calls_limit: 100_000,
            max_argument_bytes: 1024 * 1024,
            cache_ttl: Duration::from_secs(2),
            pending_expiry: Duration::from_secs(24 * 60 * 60),
            answer_retention: Duration::from_secs(24 * 60 * 60),
        }
    }
}
