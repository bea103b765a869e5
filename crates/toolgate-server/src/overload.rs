//! Load shedding for the calls that execute tools: at most `server.max_concurrent_calls` run
//! at once and at most `server.max_queued_calls` wait for a slot (first come, first served);
//! one more is answered RESOURCE_EXHAUSTED at once, naming the limit, so latency stays bounded
//! instead of growing with the backlog. The client's deadline (`grpc-timeout`) is honoured: a
//! call still waiting when it passes is answered DEADLINE_EXCEEDED without executing, and an
//! admitted call carries the deadline to the engine, which caps its hard timeout with it.
//!
//! A refused call never reaches the engine: it has no ledger row and no audit event, and the
//! agent may retry it (with the same `tool_use_id`). An admitted call runs on its own task, so
//! a client that stops waiting (its deadline passed, it hung up) does not cut the call short
//! between the connector and the ledger: it ends as the engine records it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use crate::drain::Drain;
use crate::status::{ServiceError, status};

/// `server.max_concurrent_calls` and `server.max_queued_calls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLimits {
    /// Calls executing at once.
    pub max_concurrent: usize,
    /// Calls waiting for a slot; beyond them a call is refused at once.
    pub max_queued: usize,
}

impl Default for CallLimits {
    fn default() -> CallLimits {
        CallLimits {
            max_concurrent: 256,
            max_queued: 512,
        }
    }
}

/// The deadline of an admitted call, for the handler (in the request's extensions): the
/// client's `grpc-timeout` from when the call arrived, less [`DEADLINE_MARGIN`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallDeadline(pub(crate) Instant);

/// How much earlier than the client's deadline the gateway gives up on a call. tonic's server
/// drops a handler at the client's deadline (answering CANCELLED), timed from when the request
/// arrived, while this layer first sees the call once its task is scheduled, which on a busy
/// machine is milliseconds later; giving up this much earlier lets the gateway's own answer,
/// DEADLINE_EXCEEDED, and the engine's timeout come first. A queued call with less time left
/// could not have done anything useful anyway.
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_millis(20);

/// The slots and the queue shared by every connection.
#[derive(Debug)]
pub(crate) struct Admission {
    limits: CallLimits,
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
}

/// Why a call was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Every slot is busy and the queue is full.
    Full(CallLimits),
    /// The call's deadline passed while it waited.
    DeadlineExceeded,
    /// A shutdown began while it waited.
    ShuttingDown,
}

/// A slot: the call executes while this is held.
#[derive(Debug)]
pub(crate) struct Slot(#[allow(dead_code, reason = "held for its drop")] OwnedSemaphorePermit);

/// Uncounts a waiting call however the wait ends (admitted, refused, or its client gone).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    pub(crate) fn new(limits: CallLimits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            slots: Arc::new(Semaphore::new(limits.max_concurrent)),
            queued: AtomicUsize::new(0),
        })
    }

    /// A slot now, or after waiting in the queue until `deadline`; refused at once when the
    /// queue is full, and when `stopping` resolves while waiting.
    pub(crate) async fn admit(
        &self,
        deadline: Option<Instant>,
        stopping: impl Future<Output = ()>,
    ) -> Result<Slot, Refusal> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(Slot(permit));
        }
        let queued = self.queued.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.queued);
        if queued >= self.limits.max_queued {
            return Err(Refusal::Full(self.limits));
        }
        let acquire = Arc::clone(&self.slots).acquire_owned();
        let expired = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // The semaphore is never closed.
            permit = acquire => permit.map(Slot).map_err(|_| Refusal::ShuttingDown),
            () = expired => Err(Refusal::DeadlineExceeded),
            () = stopping => Err(Refusal::ShuttingDown),
        }
    }

    /// Calls executing and waiting now.
    #[cfg(test)]
    fn load(&self) -> (usize, usize) {
        let executing = self.limits.max_concurrent - self.slots.available_permits();
        (executing, self.queued.load(Ordering::Acquire))
    }
}

impl From<Refusal> for ServiceError {
    fn from(refusal: Refusal) -> ServiceError {
        match refusal {
            Refusal::Full(limits) => ServiceError::Overloaded(format!(
                "the gateway is at its limit of {} concurrent tool calls (server.max_concurrent_calls) with {} more waiting (server.max_queued_calls); retry with backoff",
                limits.max_concurrent, limits.max_queued
            )),
            Refusal::DeadlineExceeded => ServiceError::DeadlineExceeded(
                "the call's deadline (grpc-timeout) passed while it waited for a free slot; it was not executed".to_owned(),
            ),
            Refusal::ShuttingDown => ServiceError::ShuttingDown,
        }
    }
}

/// A gRPC service whose methods named in `limited` pass through an [`Admission`]; its other
/// methods are not limited.
#[derive(Debug, Clone)]
pub(crate) struct Overload<S> {
    inner: S,
    admission: Arc<Admission>,
    drain: Arc<Drain>,
    limited: &'static [&'static str],
}

impl<S> Overload<S> {
    /// Limits the methods whose paths (`/package.Service/Method`) are in `limited`.
    pub(crate) fn new(
        inner: S,
        admission: &Arc<Admission>,
        drain: &Arc<Drain>,
        limited: &'static [&'static str],
    ) -> Overload<S> {
        Overload {
            inner,
            admission: Arc::clone(admission),
            drain: Arc::clone(drain),
            limited,
        }
    }
}

impl<S> Service<http::Request<Body>> for Overload<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        if !self.limited.contains(&request.uri().path()) {
            return Box::pin(self.inner.call(request));
        }
        // Measured now, as close to the call's arrival as this layer gets.
        let deadline = grpc_timeout(request.headers())
            .map(|timeout| Instant::now() + timeout.saturating_sub(DEADLINE_MARGIN));
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let admission = Arc::clone(&self.admission);
        let stopping = self.drain.stopping();
        Box::pin(async move {
            let slot = match admission.admit(deadline, stopping).await {
                Ok(slot) => slot,
                Err(refused) => return Ok(status(ServiceError::from(refused)).into_http()),
            };
            if let Some(deadline) = deadline {
                request.extensions_mut().insert(CallDeadline(deadline));
            }
            let answer = inner.call(request);
            // The task runs in the request's span, so the call joins the caller's trace.
            let running = tokio::spawn(crate::telemetry::in_current_span(async move {
                let answer = answer.await;
                drop(slot);
                answer
            }));
            match running.await {
                Ok(answer) => answer,
                // The task is never aborted, so this is a panic of the handler (the engine
                // contains connectors' own): it goes on as if the task had not been spawned.
                Err(error) => std::panic::resume_unwind(error.into_panic()),
            }
        })
    }
}

impl<S: NamedService> NamedService for Overload<S> {
    const NAME: &'static str = S::NAME;
}

/// The client's `grpc-timeout`: 1 to 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`), as
/// the gRPC over HTTP/2 protocol defines it. A malformed value counts as none, as tonic
/// treats it.
pub(crate) fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    // Made once: a name given as text is parsed and checked on every lookup.
    static GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");
    let value = headers.get(&GRPC_TIMEOUT)?.to_str().ok()?;
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_concurrent: usize, max_queued: usize) -> CallLimits {
        CallLimits {
            max_concurrent,
            max_queued,
        }
    }

    #[test]
    fn grpc_timeouts_are_parsed_as_the_protocol_defines_them() {
        let cases: &[(&str, Option<Duration>)] = &[
            ("1H", Some(Duration::from_secs(3600))),
            ("2M", Some(Duration::from_secs(120))),
            ("3S", Some(Duration::from_secs(3))),
            ("250m", Some(Duration::from_millis(250))),
            ("99999999u", Some(Duration::from_micros(99_999_999))),
            ("5n", Some(Duration::from_nanos(5))),
            ("123456789m", None),
            ("m", None),
            ("10", None),
            ("10x", None),
            ("-1S", None),
            ("1.5S", None),
            ("", None),
        ];
        for (text, expected) in cases {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-timeout", text.parse().unwrap());
            assert_eq!(grpc_timeout(&headers), *expected, "{text:?}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn beyond_the_slots_and_the_queue_calls_are_refused_at_once() {
        let admission = Admission::new(limits(2, 1));
        let never = std::future::pending::<()>;
        let first = admission.admit(None, never()).await.unwrap();
        let second = admission.admit(None, never()).await.unwrap();
        assert_eq!(admission.load(), (2, 0));
        let queued = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.admit(None, never()).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(admission.load(), (2, 1));
        let refused = admission.admit(None, never()).await.unwrap_err();
        assert_eq!(refused, Refusal::Full(limits(2, 1)));
        let message = ServiceError::from(refused).to_string();
        assert!(message.contains("server.max_concurrent_calls"), "{message}");
        assert!(message.contains("server.max_queued_calls"), "{message}");
        assert_eq!(admission.load(), (2, 1), "the refusal is uncounted");
        drop(first);
        let third = queued
            .await
            .unwrap()
            .expect("the queued call gets the freed slot");
        assert_eq!(admission.load(), (2, 0));
        drop((second, third));
        assert_eq!(admission.load(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_deadline_passes_in_the_queue_is_refused() {
        let admission = Admission::new(limits(1, 4));
        let busy = admission.admit(None, std::future::pending()).await.unwrap();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(300);
        let refused = admission
            .admit(Some(deadline), std::future::pending())
            .await
            .unwrap_err();
        assert_eq!(refused, Refusal::DeadlineExceeded);
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(admission.load(), (1, 0));
        drop(busy);
        // A deadline in the past does not matter when a slot is free.
        assert!(
            admission
                .admit(Some(started), std::future::pending())
                .await
                .is_ok()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_calls_are_refused_when_a_shutdown_begins() {
        let admission = Admission::new(limits(1, 4));
        let drain = Drain::new();
        let _busy = admission.admit(None, drain.stopping()).await.unwrap();
        let waiting = {
            let admission = Arc::clone(&admission);
            let stopping = drain.stopping();
            tokio::spawn(async move { admission.admit(None, stopping).await })
        };
        tokio::task::yield_now().await;
        drain.begin();
        assert_eq!(waiting.await.unwrap().unwrap_err(), Refusal::ShuttingDown);
        assert_eq!(admission.load(), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_goes_away_leaves_the_queue() {
        let admission = Admission::new(limits(1, 1));
        let _busy = admission.admit(None, std::future::pending()).await.unwrap();
        let waiting = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.admit(None, std::future::pending()).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(admission.load(), (1, 1));
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(admission.load(), (1, 0));
        assert!(matches!(
            admission
                .admit(Some(Instant::now()), std::future::pending())
                .await,
            Err(Refusal::DeadlineExceeded)
        ));
    }
}
