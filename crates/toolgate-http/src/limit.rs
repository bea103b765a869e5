//! Per-host admission: a `governor` rate limiter and an optional concurrency limit per host.
//! A request waits only while its deadline allows; otherwise it fails fast as throttled.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::error::{ErrorKind, HttpError};

/// A request rate: one request per `period` on average, with up to `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    period: Duration,
    burst: NonZeroU32,
}

impl RateLimit {
    /// `per_second` requests a second, bursts of up to `burst`. `None` if either is zero.
    pub fn per_second(per_second: u32, burst: u32) -> Option<RateLimit> {
        let per_second = NonZeroU32::new(per_second)?;
        RateLimit::every(Duration::from_secs(1) / per_second.get(), burst)
    }

    /// One request every `period` (e.g. what a vendor's reset header implies), bursts of up to
    /// `burst`. `None` if the period or burst is zero.
    pub fn every(period: Duration, burst: u32) -> Option<RateLimit> {
        if period.is_zero() {
            return None;
        }
        Some(RateLimit {
            period,
            burst: NonZeroU32::new(burst)?,
        })
    }

    /// The stricter of two limits: the longer period and the smaller burst.
    fn stricter(self, other: RateLimit) -> RateLimit {
        RateLimit {
            period: self.period.max(other.period),
            burst: self.burst.min(other.burst),
        }
    }

    fn limiter(self) -> DefaultDirectRateLimiter {
        // `every` refuses a zero period, so `with_period` cannot fail; fall back to the
        // slowest quota rather than panic if that ever changes.
        let quota = Quota::with_period(self.period)
            .unwrap_or_else(|| Quota::per_hour(NonZeroU32::MIN))
            .allow_burst(self.burst);
        DefaultDirectRateLimiter::direct(quota)
    }
}

/// The limits of every host one client talks to.
#[derive(Debug)]
pub(crate) struct HostLimits {
    rate: Option<RateLimit>,
    max_concurrency: Option<usize>,
    hosts: Mutex<HashMap<String, Arc<HostState>>>,
}

#[derive(Debug)]
struct HostState {
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
    permits: Option<Arc<Semaphore>>,
}

/// Held while an attempt runs; releases the host's concurrency slot when dropped.
#[derive(Debug)]
pub(crate) struct Admission {
    _permit: Option<OwnedSemaphorePermit>,
    /// How long the request waited for the host's rate limit (zero when it did not).
    pub(crate) rate_waited: Duration,
}

impl HostLimits {
    pub(crate) fn new(rate: Option<RateLimit>, max_concurrency: Option<usize>) -> HostLimits {
        HostLimits {
            rate,
            max_concurrency,
            hosts: Mutex::new(HashMap::new()),
        }
    }

    fn state(&self, host: &str) -> Arc<HostState> {
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        let state = hosts.entry(host.to_owned()).or_insert_with(|| {
            Arc::new(HostState {
                limiter: self.rate.map(|rate| Arc::new(rate.limiter())),
                permits: self.max_concurrency.map(|n| Arc::new(Semaphore::new(n))),
            })
        });
        Arc::clone(state)
    }

    /// Replaces `host`'s rate with `reported`, never looser than the configured rate.
    pub(crate) fn limit_host(&self, host: &str, reported: RateLimit) {
        let effective = match self.rate {
            Some(configured) => configured.stricter(reported),
            None => reported,
        };
        let permits = self.state(host).permits.clone();
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts.insert(
            host.to_owned(),
            Arc::new(HostState {
                limiter: Some(Arc::new(effective.limiter())),
                permits,
            }),
        );
    }

    /// Waits for a rate token and a concurrency slot for `host`, or fails as throttled when
    /// the wait would leave less than [`SEND_ROOM`] before `deadline`.
    pub(crate) async fn admit(
        &self,
        host: &str,
        deadline: Instant,
    ) -> Result<Admission, HttpError> {
        let state = self.state(host);
        // The latest moment a wait may end: a request sent in the deadline's last moments
        // could only time out, and the caller learns sooner that the host is throttled.
        let last_start = deadline.checked_sub(SEND_ROOM).unwrap_or(deadline);
        let mut rate_waited = Duration::ZERO;
        if let Some(limiter) = &state.limiter {
            let clock = DefaultClock::default();
            loop {
                let wait = match limiter.check() {
                    Ok(()) => break,
                    Err(not_until) => not_until.wait_time_from(clock.now()),
                };
                if Instant::now() + wait > last_start {
                    return Err(throttled(host, "rate limit"));
                }
                let asleep = Instant::now();
                tokio::time::sleep(wait).await;
                rate_waited += asleep.elapsed();
            }
        }
        let permit = match &state.permits {
            None => None,
            Some(permits) => {
                let acquired =
                    tokio::time::timeout_at(last_start, Arc::clone(permits).acquire_owned()).await;
                match acquired {
                    Ok(Ok(permit)) => Some(permit),
                    Ok(Err(_)) | Err(_) => return Err(throttled(host, "concurrency limit")),
                }
            }
        };
        Ok(Admission {
            _permit: permit,
            rate_waited,
        })
    }
}

/// The time a request is left at least after waiting for its host's limits.
pub(crate) const SEND_ROOM: Duration = Duration::from_millis(100);

fn throttled(host: &str, what: &str) -> HttpError {
    HttpError::new(
        ErrorKind::Throttling,
        format!("the {what} for {host} leaves no room before the deadline"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_constructors_refuse_zero() {
        assert!(RateLimit::per_second(0, 1).is_none());
        assert!(RateLimit::per_second(1, 0).is_none());
        assert!(RateLimit::every(Duration::ZERO, 1).is_none());
        let a = RateLimit::per_second(10, 5).unwrap();
        let b = RateLimit::per_second(2, 8).unwrap();
        assert_eq!(
            a.stricter(b),
            RateLimit::every(Duration::from_millis(500), 5).unwrap()
        );
    }

    #[tokio::test]
    async fn fails_fast_when_the_wait_passes_the_deadline() {
        let limits = HostLimits::new(RateLimit::per_second(1, 1), None);
        let deadline = Instant::now() + Duration::from_millis(200);
        let first = limits.admit("a", deadline).await.unwrap();
        assert_eq!(
            first.rate_waited,
            Duration::ZERO,
            "the burst admits at once"
        );
        let started = std::time::Instant::now();
        let err = limits.admit("a", deadline).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Throttling);
        assert!(started.elapsed() < Duration::from_millis(50));
        // Another host has its own bucket.
        assert!(limits.admit("b", deadline).await.is_ok());
    }

    #[tokio::test]
    async fn a_request_that_waited_for_the_rate_says_how_long() {
        let limits = HostLimits::new(RateLimit::per_second(20, 1), None);
        let deadline = Instant::now() + Duration::from_secs(2);
        let first = limits.admit("a", deadline).await.unwrap();
        assert_eq!(first.rate_waited, Duration::ZERO);
        let second = limits.admit("a", deadline).await.unwrap();
        // One token every 50 ms: the second request waits for most of one period.
        assert!(
            second.rate_waited >= Duration::from_millis(20),
            "{:?}",
            second.rate_waited
        );
    }

    #[tokio::test]
    async fn a_lowered_host_limit_applies_to_that_host_only() {
        let limits = HostLimits::new(RateLimit::per_second(100, 10), None);
        limits.limit_host(
            "slow",
            RateLimit::every(Duration::from_secs(30), 1).unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(1);
        assert!(limits.admit("slow", deadline).await.is_ok());
        assert!(limits.admit("slow", deadline).await.is_err());
        for _ in 0..5 {
            assert!(limits.admit("fast", deadline).await.is_ok());
        }
    }

    #[tokio::test]
    async fn concurrency_limit_waits_then_fails_at_the_deadline() {
        let limits = HostLimits::new(None, Some(1));
        let deadline = Instant::now() + Duration::from_millis(100);
        let held = limits.admit("a", deadline).await.unwrap();
        let err = limits.admit("a", deadline).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Throttling);
        drop(held);
        let later = Instant::now() + Duration::from_millis(100);
        assert!(limits.admit("a", later).await.is_ok());
    }
}
