//! The toolgate gateway as a library: configuration (loaded and validated before any port is
//! bound), bearer-token authentication as one layer, the agent, admin and approval gRPC
//! services, the one mapping of refusals to gRPC statuses, the master key file, TLS on the
//! listener, load shedding of tool calls, logs and traces ([`telemetry`]), and [`serve`]. The
//! `toolgate` binary is `main.rs` and the CLI around it.

mod admin;
mod auth;
pub mod config;
pub mod connectors;
mod console;
pub mod convert;
mod drain;
pub mod files;
pub mod keys;
mod mcp;
pub mod metrics;
mod overload;
mod server;
mod services;
pub mod status;
pub mod storage;
pub mod telemetry;
pub mod tls;

pub use config::Config;
pub use connectors::build_registry;
pub use overload::CallLimits;
pub use server::{serve, serve_with};
pub use status::ServiceError;
pub use telemetry::{Telemetry, TelemetrySettings};
