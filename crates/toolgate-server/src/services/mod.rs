//! The gRPC services: thin adapters that convert wire types by hand and call the engine or the
//! store. The caller comes authenticated from [`crate::auth::AuthLayer`]; every refusal is a
//! [`ServiceError`](crate::status::ServiceError), made a status in [`crate::status`].

use std::sync::Arc;

use toolgate_core::Clock;
use toolgate_engine::Engine;

use crate::auth::Authenticator;
use crate::drain::Drain;
use crate::keys::KeyManager;

mod admin;
mod agent;
mod approvals;
mod watch;

pub(crate) use admin::AdminApi;
pub(crate) use agent::AgentApi;
pub(crate) use approvals::ApprovalApi;

/// State shared by the services.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub(crate) engine: Arc<Engine>,
    /// The token cache, which the admin service empties of a token it revokes.
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) keys: Arc<KeyManager>,
    /// The shutdown state: streams end when a shutdown begins.
    pub(crate) drain: Arc<Drain>,
    /// Mints client approval links when the console is on.
    pub(crate) client_links: Option<Arc<crate::console::links::LinkMinter>>,
}

/// A page size as the list calls take it: 0 is the default of 100, and at most 1000.
fn page_size(asked: u32) -> u32 {
    match asked {
        0 => 100,
        n => n.min(1000),
    }
}
