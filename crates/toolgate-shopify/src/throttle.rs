//! Proactive pacing by Shopify's calculated query cost.
//!
//! Every Admin GraphQL answer reports the store's leaky bucket in `extensions.cost`
//! (`throttleStatus {maximumAvailable, currentlyAvailable, restoreRate}`) and what the query
//! cost (`requestedQueryCost`, which Shopify checks against the bucket before running it, and
//! `actualQueryCost`). The limiter keeps that state per store, learns each query's requested
//! cost, and before sending a query waits just until the bucket has refilled to that cost, so
//! Shopify never has to refuse. A wait that would pass the call's deadline fails at once with
//! `VENDOR_RATE_LIMITED`, nothing sent. Nothing about a plan's limits is hard-coded: every
//! number comes from the answers.
//!
//! Until a store's first answer the bucket is unknown: one query goes out alone and the others
//! wait for what it teaches. Queries admitted but not answered yet are reserved against the
//! bucket, so concurrent calls account for each other. Answers of concurrent queries can arrive
//! out of order: the answer to the most recently admitted query sets the bucket (it counts
//! every query sent before it, and whatever other clients of the app spent), while an older
//! answer arriving later only ever lowers it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The bucket figures from one answer's `extensions.cost`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CostReport {
    /// `requestedQueryCost`: what Shopify checks against the bucket before running the query.
    pub(crate) requested: Option<f64>,
    /// `actualQueryCost`: what it charged (`null` when it refused the query).
    pub(crate) actual: Option<f64>,
    pub(crate) maximum: f64,
    pub(crate) available: f64,
    pub(crate) restore_rate: f64,
}

impl CostReport {
    /// Reads `extensions.cost` from a GraphQL answer; `None` when it is absent or malformed.
    pub(crate) fn from_answer(answer: &Value) -> Option<CostReport> {
        let cost = answer.pointer("/extensions/cost")?;
        let status = cost.get("throttleStatus")?;
        let number = |v: &Value, name: &str| v.get(name).and_then(Value::as_f64);
        let report = CostReport {
            requested: number(cost, "requestedQueryCost"),
            actual: number(cost, "actualQueryCost"),
            maximum: number(status, "maximumAvailable")?,
            available: number(status, "currentlyAvailable")?,
            restore_rate: number(status, "restoreRate")?,
        };
        let sane = report.maximum > 0.0 && report.restore_rate > 0.0 && report.available >= 0.0;
        sane.then_some(report)
    }
}

/// Cost buckets per app and store (`Credentials::bucket_key`), shared by every call of the
/// connector.
#[derive(Debug, Default)]
pub(crate) struct CostLimiter {
    shops: Mutex<HashMap<String, ShopState>>,
    changed: Notify,
}

/// The right to send one query; hand it back with [`Permit::settle`]. A permit dropped
/// unsettled (the call was cancelled at its deadline, or panicked) gives its reservation back,
/// so an abandoned query never holds a store's bucket.
#[derive(Debug)]
pub(crate) struct Permit {
    limiter: Arc<CostLimiter>,
    ticket: Option<Ticket>,
}

#[derive(Debug)]
struct Ticket {
    shop: String,
    query: String,
    reserved: f64,
    probe: bool,
    /// Admission order within the store.
    seq: u64,
}

/// Why a query was not admitted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RateLimited {
    /// How long the store's bucket needs to refill to the query's cost.
    pub(crate) wait: Duration,
}

#[derive(Debug, Default)]
struct ShopState {
    bucket: Option<Bucket>,
    /// A first query is out to learn the bucket.
    probing: bool,
    /// Cost reserved by admitted queries not answered yet.
    reserved: f64,
    /// The last requested cost of each query kind.
    learned: HashMap<String, f64>,
    /// Admissions so far.
    admitted: u64,
    /// The admission number of the query whose answer set the bucket.
    baseline: u64,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    maximum: f64,
    available: f64,
    restore_rate: f64,
    observed: Instant,
}

impl Bucket {
    fn available_at(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.observed).as_secs_f64();
        (self.available + self.restore_rate * elapsed).min(self.maximum)
    }
}

/// What one look at the state decided.
enum Step {
    Go(Permit),
    Sleep(Duration),
    AwaitProbe,
}

impl CostLimiter {
    pub(crate) fn new() -> Arc<CostLimiter> {
        Arc::new(CostLimiter::default())
    }

    /// Waits until the store's bucket holds the query's cost (the learned requested cost of
    /// `query`, else `estimate`), or fails at once when that wait would pass `deadline`.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        shop: &str,
        query: &str,
        estimate: f64,
        deadline: Instant,
    ) -> Result<Permit, RateLimited> {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the state is read, so an answer in between is not missed.
            notified.as_mut().enable();
            let step = self.step(shop, query, estimate, deadline)?;
            match step {
                Step::Go(permit) => return Ok(permit),
                Step::Sleep(wait) => tokio::time::sleep(wait).await,
                Step::AwaitProbe => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(deadline) => {
                            return Err(RateLimited { wait: Duration::ZERO });
                        }
                    }
                }
            }
        }
    }

    fn step(
        self: &Arc<Self>,
        shop: &str,
        query: &str,
        estimate: f64,
        deadline: Instant,
    ) -> Result<Step, RateLimited> {
        let mut shops = self.shops.lock().expect("limiter lock");
        let state = shops.entry(shop.to_owned()).or_default();
        let cost = state.learned.get(query).copied().unwrap_or(estimate);
        let Some(bucket) = state.bucket else {
            if state.probing {
                return Ok(Step::AwaitProbe);
            }
            state.probing = true;
            state.admitted += 1;
            return Ok(Step::Go(self.permit(Ticket {
                shop: shop.to_owned(),
                query: query.to_owned(),
                reserved: cost,
                probe: true,
                seq: state.admitted,
            })));
        };
        // A query dearer than the whole bucket cannot be paced into it; Shopify answers it
        // with MAX_COST_EXCEEDED or THROTTLED, which the caller reports.
        let needed = cost.min(bucket.maximum);
        let now = Instant::now();
        let available = bucket.available_at(now) - state.reserved;
        if available >= needed {
            state.reserved += cost;
            state.admitted += 1;
            return Ok(Step::Go(self.permit(Ticket {
                shop: shop.to_owned(),
                query: query.to_owned(),
                reserved: cost,
                probe: false,
                seq: state.admitted,
            })));
        }
        let wait = Duration::from_secs_f64((needed - available) / bucket.restore_rate);
        if now + wait > deadline {
            return Err(RateLimited { wait });
        }
        Ok(Step::Sleep(wait))
    }

    fn permit(self: &Arc<Self>, ticket: Ticket) -> Permit {
        Permit {
            limiter: Arc::clone(self),
            ticket: Some(ticket),
        }
    }

    fn finish(&self, permit: Ticket, report: Option<CostReport>) {
        // Never poisoned in practice; a poisoned lock still holds consistent numbers.
        let mut shops = self
            .shops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let state = shops.entry(permit.shop.clone()).or_default();
        if permit.probe {
            state.probing = false;
        } else {
            state.reserved = (state.reserved - permit.reserved).max(0.0);
        }
        if let Some(report) = report {
            let now = Instant::now();
            let newest = permit.seq > state.baseline;
            let available = match state.bucket {
                Some(bucket) if !newest => bucket.available_at(now).min(report.available),
                _ => report.available,
            };
            if newest {
                state.baseline = permit.seq;
            }
            state.bucket = Some(Bucket {
                maximum: report.maximum,
                available,
                restore_rate: report.restore_rate,
                observed: now,
            });
            if let Some(requested) = report.requested {
                state.learned.insert(permit.query, requested);
            }
        }
        drop(shops);
        self.changed.notify_waiters();
    }
}

impl Permit {
    /// Hands the permit back with what the answer reported (`None` when it reported nothing,
    /// e.g. a transport failure or an HTTP error without a GraphQL body).
    pub(crate) fn settle(mut self, report: Option<CostReport>) {
        if let Some(ticket) = self.ticket.take() {
            self.limiter.finish(ticket, report);
        }
    }

    #[cfg(test)]
    fn is_probe(&self) -> bool {
        self.ticket.as_ref().is_some_and(|t| t.probe)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.limiter.finish(ticket, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(available: f64, requested: f64) -> CostReport {
        CostReport {
            requested: Some(requested),
            actual: Some(requested),
            maximum: 100.0,
            available,
            restore_rate: 50.0,
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn reads_extensions_cost() {
        let answer = serde_json::json!({"data": {}, "extensions": {"cost": {
            "requestedQueryCost": 12, "actualQueryCost": 8,
            "throttleStatus": {"maximumAvailable": 2000.0, "currentlyAvailable": 1980, "restoreRate": 100.0}
        }}});
        let report = CostReport::from_answer(&answer).unwrap();
        assert_eq!(report.requested, Some(12.0));
        assert_eq!(report.actual, Some(8.0));
        assert_eq!(report.available, 1980.0);
        let throttled = serde_json::json!({"errors": [], "extensions": {"cost": {
            "requestedQueryCost": 12, "actualQueryCost": null,
            "throttleStatus": {"maximumAvailable": 50, "currentlyAvailable": 3, "restoreRate": 5}
        }}});
        assert_eq!(CostReport::from_answer(&throttled).unwrap().actual, None);
        assert!(CostReport::from_answer(&serde_json::json!({"data": {}})).is_none());
    }

    /// The waits are exactly what the restore rate says: checked on paused time, so the
    /// machine's load plays no part.
    #[tokio::test(start_paused = true)]
    async fn waits_just_long_enough_for_the_bucket_to_refill() {
        let limiter = CostLimiter::new();
        let start = Instant::now();
        // The first query learns the bucket: 40 of 100 left, restoring 50 per second.
        let probe = limiter.admit("s", "q", 30.0, far()).await.unwrap();
        probe.settle(Some(report(40.0, 30.0)));
        // One more fits at once (40 >= 30), reserving 30.
        let first = limiter.admit("s", "q", 1.0, far()).await.unwrap();
        assert_eq!(Instant::now(), start);
        // The next needs 30 with 10 left: (30 - 10) / 50 = 400 ms.
        let second = limiter.admit("s", "q", 1.0, far()).await.unwrap();
        assert_eq!(Instant::now() - start, Duration::from_millis(400));
        first.settle(Some(report(10.0, 30.0)));
        second.settle(Some(report(0.0, 30.0)));
        // Empty: a 30-point query waits 600 ms.
        let before = Instant::now();
        let third = limiter.admit("s", "q", 1.0, far()).await.unwrap();
        assert_eq!(Instant::now() - before, Duration::from_millis(600));
        third.settle(Some(report(0.0, 30.0)));
        // Another store has its own bucket.
        let other = limiter.admit("t", "q", 30.0, far()).await.unwrap();
        assert!(other.is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_deadline_fails_at_once() {
        let limiter = CostLimiter::new();
        let probe = limiter.admit("s", "q", 80.0, far()).await.unwrap();
        probe.settle(Some(report(0.0, 80.0)));
        let start = Instant::now();
        let refused = limiter
            .admit("s", "q", 80.0, start + Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(refused.wait, Duration::from_millis(1600));
        assert_eq!(Instant::now(), start, "no time was spent waiting");
    }

    #[tokio::test(start_paused = true)]
    async fn queries_wait_for_the_first_answer_of_a_store() {
        let limiter = CostLimiter::new();
        let probe = limiter.admit("s", "q", 10.0, far()).await.unwrap();
        let waiting = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.admit("s", "q", 10.0, far()).await })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            !waiting.is_finished(),
            "admitted before the bucket was known"
        );
        probe.settle(Some(report(100.0, 10.0)));
        let permit = waiting.await.unwrap().unwrap();
        assert!(!permit.is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn the_newest_answer_sets_the_bucket_and_older_ones_only_lower_it() {
        let limiter = CostLimiter::new();
        let probe = limiter.admit("s", "q", 10.0, far()).await.unwrap();
        probe.settle(Some(report(100.0, 10.0)));
        let a = limiter.admit("s", "q", 10.0, far()).await.unwrap();
        let b = limiter.admit("s", "q", 10.0, far()).await.unwrap();
        // b's answer (bucket 80, counting a) arrives first, then a's with a stale 90.
        b.settle(Some(report(80.0, 10.0)));
        a.settle(Some(report(90.0, 10.0)));
        {
            let state = limiter.shops.lock().unwrap();
            assert_eq!(state["s"].bucket.unwrap().available, 80.0);
            assert_eq!(state["s"].reserved, 0.0);
        }
        // A newer answer lower than the bookkeeping (another client spent) is believed too.
        let c = limiter.admit("s", "q", 10.0, far()).await.unwrap();
        c.settle(Some(report(20.0, 10.0)));
        let state = limiter.shops.lock().unwrap();
        assert_eq!(state["s"].bucket.unwrap().available, 20.0);
    }

    /// A call cancelled at its deadline drops its permit: the reservation comes back, and a
    /// dropped probe lets the next query probe.
    #[tokio::test(start_paused = true)]
    async fn dropped_permits_give_their_reservation_back() {
        let limiter = CostLimiter::new();
        let probe = limiter.admit("s", "q", 10.0, far()).await.unwrap();
        drop(probe);
        let probe = limiter.admit("s", "q", 10.0, far()).await.unwrap();
        assert!(
            probe.is_probe(),
            "the store was left waiting for a probe that never returns"
        );
        probe.settle(Some(report(30.0, 10.0)));
        let abandoned = limiter.admit("s", "q", 10.0, far()).await.unwrap();
        let kept = limiter.admit("s", "q", 10.0, far()).await.unwrap();
        drop(abandoned);
        assert_eq!(limiter.shops.lock().unwrap()["s"].reserved, 10.0);
        kept.settle(None);
        assert_eq!(limiter.shops.lock().unwrap()["s"].reserved, 0.0);
    }
}
