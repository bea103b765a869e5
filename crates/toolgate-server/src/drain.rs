//! Graceful shutdown: once a shutdown begins, new calls are refused (UNAVAILABLE), open
//! streams end, and the calls already running are counted until they finish or the drain
//! timeout passes.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::watch;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use crate::status::{ServiceError, status};

/// Whether a shutdown has begun and how many calls are in flight, in one value so that a call
/// is either counted before the shutdown begins or refused, never both nor neither.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DrainState {
    /// A shutdown has begun.
    pub(crate) draining: bool,
    /// Calls admitted and not yet answered.
    pub(crate) in_flight: usize,
}

/// The shutdown state every service shares.
#[derive(Debug)]
pub(crate) struct Drain {
    state: watch::Sender<DrainState>,
}

impl Drain {
    pub(crate) fn new() -> Arc<Drain> {
        Arc::new(Drain {
            state: watch::Sender::new(DrainState::default()),
        })
    }

    /// Admits a call, or `None` once a shutdown has begun.
    pub(crate) fn enter(self: &Arc<Self>) -> Option<InFlight> {
        let admitted = self.state.send_if_modified(|state| {
            if state.draining {
                return false;
            }
            state.in_flight += 1;
            true
        });
        admitted.then(|| InFlight(Arc::clone(self)))
    }

    /// Begins the shutdown: from now on calls are refused and streams end.
    pub(crate) fn begin(&self) {
        self.state.send_modify(|state| state.draining = true);
    }

    /// The state now.
    pub(crate) fn state(&self) -> DrainState {
        *self.state.borrow()
    }

    /// Resolves once a shutdown has begun (for streams, which end then).
    pub(crate) fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut state = self.state.subscribe();
        async move {
            // An error means the sender is gone, i.e. the gateway is going away anyway.
            let _ = state.wait_for(|state| state.draining).await;
        }
    }

    /// Resolves once no admitted call is still running.
    pub(crate) async fn idle(&self) {
        let mut state = self.state.subscribe();
        let _ = state.wait_for(|state| state.in_flight == 0).await;
    }
}

/// One admitted call; dropping it (the call answered, or its client went away) uncounts it.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Drain>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .state
            .send_modify(|state| state.in_flight = state.in_flight.saturating_sub(1));
    }
}

/// A gRPC service whose calls are admitted through a [`Drain`]: during a shutdown they are
/// answered UNAVAILABLE without reaching the service.
#[derive(Debug, Clone)]
pub(crate) struct Draining<S> {
    inner: S,
    drain: Arc<Drain>,
}

impl<S> Draining<S> {
    pub(crate) fn new(inner: S, drain: &Arc<Drain>) -> Draining<S> {
        Draining {
            inner,
            drain: Arc::clone(drain),
        }
    }
}

impl<S> Service<http::Request<Body>> for Draining<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let Some(admitted) = self.drain.enter() else {
            let refused = status(ServiceError::ShuttingDown).into_http();
            return Box::pin(std::future::ready(Ok(refused)));
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await;
            // Counted until the handler has answered; a stream's body outlives this, and
            // streams end on their own when the shutdown begins.
            drop(admitted);
            response
        })
    }
}

impl<S: NamedService> NamedService for Draining<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_are_counted_until_answered_and_refused_once_draining() {
        let drain = Drain::new();
        let first = drain.enter().expect("admitted before the shutdown");
        let second = drain.enter().expect("admitted before the shutdown");
        assert_eq!(drain.state().in_flight, 2);
        drain.begin();
        assert!(drain.enter().is_none(), "refused once draining");
        assert_eq!(drain.state().in_flight, 2);
        let stopping = tokio::spawn(drain.stopping());
        stopping.await.unwrap();
        drop(first);
        let idle = {
            let drain = Arc::clone(&drain);
            tokio::spawn(async move { drain.idle().await })
        };
        tokio::task::yield_now().await;
        assert!(!idle.is_finished(), "one call still runs");
        drop(second);
        idle.await.unwrap();
        assert_eq!(
            drain.state(),
            DrainState {
                draining: true,
                in_flight: 0
            }
        );
    }
}
