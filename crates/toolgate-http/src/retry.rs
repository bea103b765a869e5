//! Retry as a policy value: the pure decision (whether and how long to wait before the next
//! attempt), the server's wait hints (`Retry-After`, `X-RateLimit-Reset`), and the retry budget
//! that keeps an outage from turning into a retry storm.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use tokio::time::Instant;

/// When and how a failed attempt is retried. Retries only ever happen for idempotent requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts including the first; `1` disables retries. Default 3.
    pub max_attempts: u32,
    /// The first backoff step; each later step doubles. Default 100 ms.
    pub base: Duration,
    /// The longest single wait, and the longest server-requested wait honoured: a vendor asking
    /// for more makes the call fail at once as throttled. Default 10 s.
    pub cap: Duration,
    /// The 5xx statuses that are retried. Default 500, 502, 503, 504.
    pub retry_statuses: Vec<u16>,
    /// Whether 429 is retried (after `Retry-After` or a backoff). Default true. A connector
    /// that paces itself from the vendor's own accounting (Shopify's query cost) turns it off
    /// and decides the wait itself; a 429 then fails at once as throttled, with the response.
    pub retry_throttled: bool,
    /// Limits retries relative to requests, shared by everything one client sends.
    pub budget: RetryBudget,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            retry_statuses: vec![500, 502, 503, 504],
            retry_throttled: true,
            budget: RetryBudget::default(),
        }
    }
}

/// A token bucket for retries: each request deposits `ratio_percent / 100` of a token, each
/// retry withdraws one, and `min_per_second` retries are always available on top so that a
/// quiet client can still retry. The balance is capped at `max_balance` so a long healthy
/// period cannot save up a storm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryBudget {
    /// Retries allowed as a percentage of requests. Default 20.
    pub ratio_percent: u32,
    /// Retries always allowed per second, whatever the ratio. Default 10.
    pub min_per_second: u32,
    /// The most retry tokens that can accumulate. Default 100.
    pub max_balance: u32,
}

impl Default for RetryBudget {
    fn default() -> RetryBudget {
        RetryBudget {
            ratio_percent: 20,
            min_per_second: 10,
            max_balance: 100,
        }
    }
}

/// Why an attempt is retried (logged with the attempt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RetryReason {
    Throttled,
    ServerError(u16),
    Connection,
}

impl RetryReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RetryReason::Throttled => "throttled",
            RetryReason::ServerError(_) => "server error",
            RetryReason::Connection => "connection error",
        }
    }
}

/// What went wrong with an attempt, as far as retrying is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    Status(u16),
    Connection,
}

/// A server-requested wait read from the response headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hint {
    None,
    Wait(Duration),
    /// A header was present but unreadable; it is ignored.
    Malformed,
}

/// Everything the decision depends on, so that it is a pure function.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryInput {
    /// Attempts made so far (1 after the first).
    pub(crate) attempts: u32,
    pub(crate) idempotent: bool,
    pub(crate) failure: Failure,
    pub(crate) hint: Hint,
    /// Time left until the call's deadline.
    pub(crate) remaining: Duration,
    /// A uniform random number in [0, 1) for full jitter.
    pub(crate) jitter: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Retry {
        delay: Duration,
        reason: RetryReason,
    },
    GiveUp(GiveUp),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GiveUp {
    NotIdempotent,
    NotRetryable,
    AttemptsExhausted,
    /// The server asked for a longer wait than the cap.
    HintBeyondCap,
    /// The wait would end after the deadline.
    DeadlineTooClose {
        throttled: bool,
    },
}

impl RetryPolicy {
    /// Whether the failed attempt is retried, and after how long.
    pub(crate) fn decide(&self, input: &RetryInput) -> Decision {
        if !input.idempotent {
            return Decision::GiveUp(GiveUp::NotIdempotent);
        }
        let reason = match input.failure {
            Failure::Status(429) if self.retry_throttled => RetryReason::Throttled,
            Failure::Status(429) => return Decision::GiveUp(GiveUp::NotRetryable),
            Failure::Status(code) if self.retry_statuses.contains(&code) => {
                RetryReason::ServerError(code)
            }
            Failure::Status(_) => return Decision::GiveUp(GiveUp::NotRetryable),
            Failure::Connection => RetryReason::Connection,
        };
        if input.attempts >= self.max_attempts {
            return Decision::GiveUp(GiveUp::AttemptsExhausted);
        }
        let backoff = self.backoff(input.attempts, input.jitter);
        let delay = match input.hint {
            Hint::Wait(wait) if wait > self.cap => return Decision::GiveUp(GiveUp::HintBeyondCap),
            Hint::Wait(wait) => wait.max(backoff),
            Hint::None | Hint::Malformed => backoff,
        };
        if delay >= input.remaining {
            let throttled = matches!(input.hint, Hint::Wait(_)) || reason == RetryReason::Throttled;
            return Decision::GiveUp(GiveUp::DeadlineTooClose { throttled });
        }
        Decision::Retry { delay, reason }
    }

    /// Full jitter: uniform in [0, min(cap, base * 2^(attempts - 1))].
    fn backoff(&self, attempts: u32, jitter: f64) -> Duration {
        let exponent = attempts.saturating_sub(1).min(31);
        let step = self
            .base
            .checked_mul(1u32 << exponent)
            .unwrap_or(self.cap)
            .min(self.cap);
        step.mul_f64(jitter.clamp(0.0, 1.0))
    }
}

/// The wait a vendor asked for in `headers` (`Retry-After`, else `X-RateLimit-Reset`) as the
/// retry policy reads it; `None` when there is none or it is unreadable (then it is ignored).
pub fn requested_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    match server_hint(headers, now) {
        Hint::Wait(wait) => Some(wait),
        Hint::None | Hint::Malformed => None,
    }
}

/// Reads the server's requested wait: `Retry-After` (delta seconds or HTTP date), else
/// `X-RateLimit-Reset` (delta seconds, or a Unix timestamp when the number is that large).
pub(crate) fn server_hint(headers: &HeaderMap, now: SystemTime) -> Hint {
    if let Some(value) = headers.get(http::header::RETRY_AFTER) {
        return match value.to_str() {
            Ok(text) => parse_retry_after(text, now),
            Err(_) => Hint::Malformed,
        };
    }
    if let Some(value) = headers.get("x-ratelimit-reset") {
        return match value.to_str() {
            Ok(text) => parse_ratelimit_reset(text, now),
            Err(_) => Hint::Malformed,
        };
    }
    Hint::None
}

/// `Retry-After: 120` or `Retry-After: Wed, 21 Oct 2015 07:28:00 GMT`; a date in the past
/// means no wait.
pub(crate) fn parse_retry_after(text: &str, now: SystemTime) -> Hint {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: too many of them is still a (huge) wait, not a parse failure.
        let seconds = text.parse::<u64>().unwrap_or(u64::MAX);
        return Hint::Wait(Duration::from_secs(seconds));
    }
    match httpdate::parse_http_date(text) {
        Ok(at) => Hint::Wait(at.duration_since(now).unwrap_or(Duration::ZERO)),
        Err(_) => Hint::Malformed,
    }
}

/// Values at or above this are Unix timestamps rather than delta seconds (2001-09-09).
const EPOCH_THRESHOLD: f64 = 1_000_000_000.0;

fn parse_ratelimit_reset(text: &str, now: SystemTime) -> Hint {
    let Ok(number) = text.trim().parse::<f64>() else {
        return Hint::Malformed;
    };
    if !number.is_finite() || number < 0.0 {
        return Hint::Malformed;
    }
    if number >= EPOCH_THRESHOLD {
        let Ok(since_epoch) = Duration::try_from_secs_f64(number) else {
            return Hint::Wait(Duration::MAX);
        };
        let at = UNIX_EPOCH.checked_add(since_epoch);
        return match at {
            Some(at) => Hint::Wait(at.duration_since(now).unwrap_or(Duration::ZERO)),
            None => Hint::Wait(Duration::MAX),
        };
    }
    match Duration::try_from_secs_f64(number) {
        Ok(wait) => Hint::Wait(wait),
        Err(_) => Hint::Malformed,
    }
}

/// The shared state of a [`RetryBudget`] (one per client).
#[derive(Debug)]
pub(crate) struct BudgetState {
    config: RetryBudget,
    inner: Mutex<BudgetInner>,
}

#[derive(Debug)]
struct BudgetInner {
    /// Earned retry tokens, in thousandths.
    balance_milli: u64,
    /// Floor retries left in the current one-second window.
    floor_left: u32,
    window_start: Instant,
}

const MILLI: u64 = 1000;

impl BudgetState {
    pub(crate) fn new(config: RetryBudget, now: Instant) -> BudgetState {
        BudgetState {
            config,
            inner: Mutex::new(BudgetInner {
                balance_milli: 0,
                floor_left: config.min_per_second,
                window_start: now,
            }),
        }
    }

    /// Called once per request (not per attempt).
    pub(crate) fn deposit(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let max = u64::from(self.config.max_balance) * MILLI;
        let earned = u64::from(self.config.ratio_percent) * MILLI / 100;
        inner.balance_milli = inner.balance_milli.saturating_add(earned).min(max);
    }

    /// Takes one retry token if there is one.
    pub(crate) fn try_withdraw(&self, now: Instant) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_duration_since(inner.window_start) >= Duration::from_secs(1) {
            inner.window_start = now;
            inner.floor_left = self.config.min_per_second;
        }
        if inner.floor_left > 0 {
            inner.floor_left -= 1;
            return true;
        }
        if inner.balance_milli >= MILLI {
            inner.balance_milli -= MILLI;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(failure: Failure, hint: Hint) -> RetryInput {
        RetryInput {
            attempts: 1,
            idempotent: true,
            failure,
            hint,
            remaining: Duration::from_secs(60),
            jitter: 0.5,
        }
    }

    /// (idempotent, failure, hint, attempts so far, remaining seconds, expected delay or reason)
    type Case = (bool, Failure, Hint, u32, u64, Result<Duration, GiveUp>);

    #[test]
    fn decision_table() {
        let policy = RetryPolicy::default();
        let secs = |s| Hint::Wait(Duration::from_secs(s));
        let cases: Vec<Case> = vec![
            (
                false,
                Failure::Status(503),
                Hint::None,
                1,
                60,
                Err(GiveUp::NotIdempotent),
            ),
            (
                false,
                Failure::Connection,
                Hint::None,
                1,
                60,
                Err(GiveUp::NotIdempotent),
            ),
            (
                true,
                Failure::Status(400),
                Hint::None,
                1,
                60,
                Err(GiveUp::NotRetryable),
            ),
            (
                true,
                Failure::Status(409),
                secs(1),
                1,
                60,
                Err(GiveUp::NotRetryable),
            ),
            (
                true,
                Failure::Status(501),
                Hint::None,
                1,
                60,
                Err(GiveUp::NotRetryable),
            ),
            (
                true,
                Failure::Status(503),
                Hint::None,
                3,
                60,
                Err(GiveUp::AttemptsExhausted),
            ),
            (
                true,
                Failure::Status(429),
                secs(11),
                1,
                60,
                Err(GiveUp::HintBeyondCap),
            ),
            (
                true,
                Failure::Status(429),
                secs(5),
                1,
                4,
                Err(GiveUp::DeadlineTooClose { throttled: true }),
            ),
            (
                true,
                Failure::Status(429),
                secs(5),
                1,
                60,
                Ok(Duration::from_secs(5)),
            ),
            (
                true,
                Failure::Status(503),
                secs(2),
                2,
                60,
                Ok(Duration::from_secs(2)),
            ),
            // Jitter 0.5 of base 100 ms, then of 200 ms.
            (
                true,
                Failure::Status(500),
                Hint::None,
                1,
                60,
                Ok(Duration::from_millis(50)),
            ),
            (
                true,
                Failure::Connection,
                Hint::Malformed,
                2,
                60,
                Ok(Duration::from_millis(100)),
            ),
        ];
        for (i, (idempotent, failure, hint, attempts, remaining, expected)) in
            cases.into_iter().enumerate()
        {
            let mut case = input(failure, hint);
            case.idempotent = idempotent;
            case.attempts = attempts;
            case.remaining = Duration::from_secs(remaining);
            let got = match policy.decide(&case) {
                Decision::Retry { delay, .. } => Ok(delay),
                Decision::GiveUp(why) => Err(why),
            };
            assert_eq!(got, expected, "case {i}");
        }
    }

    #[test]
    fn throttling_is_left_to_the_caller_when_asked() {
        let policy = RetryPolicy {
            retry_throttled: false,
            ..RetryPolicy::default()
        };
        let throttled = input(Failure::Status(429), Hint::Wait(Duration::from_secs(1)));
        assert_eq!(
            policy.decide(&throttled),
            Decision::GiveUp(GiveUp::NotRetryable)
        );
        // Server errors are still retried.
        let server = input(Failure::Status(503), Hint::None);
        assert!(matches!(policy.decide(&server), Decision::Retry { .. }));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let policy = RetryPolicy {
            max_attempts: 100,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(300),
            ..RetryPolicy::default()
        };
        let full = |attempts| policy.backoff(attempts, 1.0);
        assert_eq!(full(1), Duration::from_millis(10));
        assert_eq!(full(3), Duration::from_millis(40));
        assert_eq!(full(10), Duration::from_millis(300));
        assert_eq!(full(60), Duration::from_millis(300));
        assert_eq!(policy.backoff(4, 0.0), Duration::ZERO);
    }

    #[test]
    fn retry_after_forms() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 2015-10-21 07:28:00 GMT
        let cases: &[(&str, Hint)] = &[
            ("120", Hint::Wait(Duration::from_secs(120))),
            (" 0 ", Hint::Wait(Duration::ZERO)),
            (
                "Wed, 21 Oct 2015 07:28:30 GMT",
                Hint::Wait(Duration::from_secs(30)),
            ),
            ("Wed, 21 Oct 2015 07:00:00 GMT", Hint::Wait(Duration::ZERO)),
            (
                "99999999999999999999999",
                Hint::Wait(Duration::from_secs(u64::MAX)),
            ),
            ("-5", Hint::Malformed),
            ("1.5", Hint::Malformed),
            ("soon", Hint::Malformed),
            ("", Hint::Malformed),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_retry_after(text, now), *expected, "{text:?}");
        }
    }

    #[test]
    fn ratelimit_reset_forms() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let cases: &[(&str, Hint)] = &[
            ("30", Hint::Wait(Duration::from_secs(30))),
            ("1.5", Hint::Wait(Duration::from_millis(1500))),
            ("1700000042", Hint::Wait(Duration::from_secs(42))),
            ("1600000000", Hint::Wait(Duration::ZERO)),
            ("NaN", Hint::Malformed),
            ("-1", Hint::Malformed),
            ("x", Hint::Malformed),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_ratelimit_reset(text, now), *expected, "{text:?}");
        }
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-reset", "7".parse().unwrap());
        assert_eq!(
            server_hint(&headers, now),
            Hint::Wait(Duration::from_secs(7))
        );
        headers.insert(http::header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(
            server_hint(&headers, now),
            Hint::Wait(Duration::from_secs(3))
        );
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        assert_eq!(server_hint(&headers, now), Hint::Malformed);
    }

    #[tokio::test(start_paused = true)]
    async fn budget_allows_ratio_plus_floor_per_second() {
        let config = RetryBudget {
            ratio_percent: 20,
            min_per_second: 2,
            max_balance: 100,
        };
        let budget = BudgetState::new(config, Instant::now());
        for _ in 0..10 {
            budget.deposit();
        }
        let mut allowed = 0;
        while budget.try_withdraw(Instant::now()) {
            allowed += 1;
        }
        // Two earned tokens (20% of 10) plus the floor of two.
        assert_eq!(allowed, 4);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(budget.try_withdraw(Instant::now()));
        assert!(budget.try_withdraw(Instant::now()));
        assert!(!budget.try_withdraw(Instant::now()));
    }

    #[test]
    fn budget_balance_is_capped() {
        let config = RetryBudget {
            ratio_percent: 100,
            min_per_second: 0,
            max_balance: 3,
        };
        let budget = BudgetState::new(config, Instant::now());
        for _ in 0..1000 {
            budget.deposit();
        }
        let now = Instant::now();
        let allowed = (0..10).filter(|_| budget.try_withdraw(now)).count();
        assert_eq!(allowed, 3);
    }
}
