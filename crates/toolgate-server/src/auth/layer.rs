//! Authentication as one tower layer: every call to a wrapped service presents a bearer token
//! of the service's role, or is refused before the service sees it; the [`Caller`] travels in
//! the request's extensions.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use toolgate_ledger::Role;

use super::{Authenticator, Caller};
use crate::status::{ServiceError, status};

/// Wraps services so that only callers holding a token of `role` reach them.
#[derive(Debug, Clone)]
pub(crate) struct AuthLayer {
    auth: Arc<Authenticator>,
    role: Role,
}

impl AuthLayer {
    pub(crate) fn new(auth: &Arc<Authenticator>, role: Role) -> AuthLayer {
        AuthLayer {
            auth: Arc::clone(auth),
            role,
        }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = Authenticated<S>;

    fn layer(&self, inner: S) -> Authenticated<S> {
        Authenticated {
            inner,
            layer: self.clone(),
        }
    }
}

/// A gRPC service behind [`AuthLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Authenticated<S> {
    inner: S,
    layer: AuthLayer,
}

impl<S> Service<http::Request<Body>> for Authenticated<S>
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
        // The service polled ready is the one that is called; its clone waits for the next call.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let layer = self.layer.clone();
        Box::pin(async move {
            let authorization = request.headers().get(http::header::AUTHORIZATION);
            match layer.auth.require(authorization, layer.role).await {
                Ok(caller) => {
                    request.extensions_mut().insert(caller);
                    inner.call(request).await
                }
                Err(refused) => Ok(status(refused).into_http()),
            }
        })
    }
}

impl<S: NamedService> NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

/// The caller the layer authenticated, from the request's extensions.
pub(crate) fn caller<T>(request: &tonic::Request<T>) -> Result<Caller, ServiceError> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or(ServiceError::NotAuthenticated)
}
