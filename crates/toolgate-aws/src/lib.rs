//! toolgate's AWS connector: twelve read-only audit tools on the official AWS SDK.
//!
//! - **Tools** (`tools/`): `aws.ec2_inventory`, `aws.ebs_inventory`, `aws.cost_breakdown`,
//!   `aws.cost_anomalies`, `aws.compute_optimizer_recs`, `aws.s3_inventory`,
//!   `aws.iam_audit`, `aws.security_groups_audit`, `aws.cloudtrail_coverage`,
//!   `aws.nat_gateways_audit`, `aws.eips_audit`, `aws.rds_inventory`. All read-only,
//!   idempotent and low risk; they follow the SDK's paginators up to `limit`, fan out over the
//!   requested regions with bounded concurrency, and answer counts, capped items with
//!   `truncated`, and for audits explicit findings.
//! - **Credentials** (`credentials.rs`, `session.rs`): the tenant's `aws_default` secret
//!   (static keys, optionally a role to assume with an external id). An assumed role's session
//!   is narrowed per call by an inline session policy allowing only the tool's own actions
//!   ([`TOOL_ACTIONS`]) and cached until shortly before it expires.
//! - **Transport**: one shared HTTP client for every tenant and service; the call's remaining
//!   deadline is the SDK's operation timeout, its standard retries included. AWS traffic does
//!   not pass toolgate-http's SSRF guard, so the endpoint override comes from [`AwsConfig`]
//!   (the operator's `[connectors.aws]`) only, never from a tenant's secret.
//! - **Errors** (`errors.rs`): stable codes with sanitized, actionable messages.
//!
//! The AWS SDK is used in this crate only. The `testkit` feature adds the `testkit` module:
//! moto on loopback, and fakes of the two services moto does not serve.

mod config;
mod connector;
mod credentials;
mod errors;
mod regions;
mod session;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
mod tools;

#[cfg(test)]
mod tests;

pub use config::{AwsConfig, AwsConfigError, DEFAULT_REGION};
pub use connector::AwsConnector;
pub use credentials::SECRET_NAME;
pub use regions::{KNOWN_REGIONS, MAX_REGIONS};
pub use tools::MAX_LIMIT;
pub use tools::specs::TOOL_ACTIONS;
