//! Per-call AWS access: the tenant's keys (or a role assumed with them, narrowed by a session
//! policy to the tool's own actions), one shared HTTP client for every tenant and service, and
//! SDK clients whose operation timeout is the call's remaining deadline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_smithy_http_client::tls;
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use serde_json::json;
use sha2::{Digest as _, Sha256};
use toolgate_core::{ErrorCode, InvocationContext, TenantId, ToolError};

use crate::config::AwsConfig;
use crate::credentials::{Role, SECRET_NAME, TenantCredentials};
use crate::errors::{Operation, sdk_error};

/// Builds an SDK client of crate `$krate` for `$region`: the shared HTTP client, the given
/// credentials, the operator's endpoint, the standard retry, and the deadline as operation
/// timeout. A deadline already passed is a `TIMEOUT` without a request.
macro_rules! build_client {
    ($krate:ident, $sessions:expr, $credentials:expr, $region:expr, $deadline:expr) => {{
        let sessions: &crate::session::Sessions = $sessions;
        match crate::session::call_timeouts($deadline) {
            Err(e) => Err(e),
            Ok(timeouts) => {
                let mut builder = $krate::config::Builder::new()
                    .behavior_version($krate::config::BehaviorVersion::latest())
                    .region($krate::config::Region::new(String::from($region)))
                    .credentials_provider(($credentials).clone())
                    .http_client(sessions.http_client())
                    .timeout_config(timeouts)
                    .retry_config(sessions.retry_config());
                if let Some(url) = &sessions.config().endpoint_url {
                    builder = builder.endpoint_url(url.clone());
                }
                Ok($krate::Client::from_conf(builder.build()))
            }
        }
    }};
}

/// Assumed-role credentials are reused until this long before they expire.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// How long an assumed role's session lasts (STS's minimum).
const ROLE_SESSION_SECONDS: i32 = 900;

/// State shared by every call: the HTTP client and the assumed-role cache.
#[derive(Debug)]
pub(crate) struct Sessions {
    config: AwsConfig,
    http: SharedHttpClient,
    roles: Mutex<HashMap<RoleKey, Credentials>>,
    /// How many `sts:AssumeRole` requests were sent (for tests and logs).
    assumed: std::sync::atomic::AtomicU64,
}

/// One cached role session: whose keys assumed which role with which session policy.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RoleKey {
    tenant: TenantId,
    base_key: String,
    role_arn: String,
    external_id: Option<String>,
    policy_hash: String,
}

/// What one call uses: credentials and its home region, and the shared state.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) sessions: Arc<Sessions>,
    credentials: Credentials,
    /// The region a call without `regions` goes to.
    pub(crate) home_region: String,
    deadline: std::time::Instant,
}

impl Sessions {
    pub(crate) fn new(config: AwsConfig) -> Sessions {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::AwsLc,
            ))
            .build_https();
        Sessions {
            config,
            http,
            roles: Mutex::new(HashMap::new()),
            assumed: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn config(&self) -> &AwsConfig {
        &self.config
    }

    /// How many `sts:AssumeRole` requests were sent so far.
    pub(crate) fn assume_role_requests(&self) -> u64 {
        self.assumed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The credentials for one call of a tool needing `actions`: the tenant's keys, or its role
    /// assumed with a session policy allowing only `actions` (cached per tenant, role and
    /// policy until shortly before expiry).
    pub(crate) async fn open(
        self: &Arc<Self>,
        ctx: &InvocationContext,
        actions: &[&str],
    ) -> Result<Session, ToolError> {
        let Some(secret) = ctx.secrets.get(SECRET_NAME) else {
            return Err(ToolError::new(
                ErrorCode::CredentialsNotFound,
                format!("the tenant has no `{SECRET_NAME}` secret; an administrator stores the AWS keys with `toolgate secrets put TENANT {SECRET_NAME}`"),
            )
            .with_attempts(0));
        };
        let tenant = TenantCredentials::parse(secret.expose())?;
        let home_region = tenant
            .region
            .clone()
            .unwrap_or_else(|| self.config.default_region.clone());
        let base = Credentials::new(
            tenant.access_key_id.expose(),
            tenant.secret_access_key.expose(),
            tenant.session_token.as_ref().map(|t| t.expose().to_owned()),
            None,
            "toolgate",
        );
        let credentials = match &tenant.role {
            None => base,
            Some(role) => {
                self.assume(ctx, &tenant, role, base, &home_region, actions)
                    .await?
            }
        };
        Ok(Session {
            sessions: Arc::clone(self),
            credentials,
            home_region,
            deadline: ctx.deadline,
        })
    }

    async fn assume(
        &self,
        ctx: &InvocationContext,
        tenant: &TenantCredentials,
        role: &Role,
        base: Credentials,
        region: &str,
        actions: &[&str],
    ) -> Result<Credentials, ToolError> {
        let policy = session_policy(actions);
        let key = RoleKey {
            tenant: ctx.tenant.clone(),
            base_key: toolgate_core::hex::encode(Sha256::digest(format!(
                "{}\n{}",
                tenant.access_key_id.expose(),
                tenant.secret_access_key.expose()
            ))),
            role_arn: role.arn.clone(),
            external_id: role.external_id.clone(),
            policy_hash: toolgate_core::hex::encode(Sha256::digest(&policy)),
        };
        let now = SystemTime::now();
        let cached = self
            .roles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .filter(|c| c.expiry().is_some_and(|e| e > now + REFRESH_BEFORE_EXPIRY))
            .cloned();
        if let Some(credentials) = cached {
            return Ok(credentials);
        }
        let sts = build_client!(aws_sdk_sts, self, &base, region, ctx.deadline)?;
        let mut request = sts
            .assume_role()
            .role_arn(&role.arn)
            .role_session_name(session_name(&ctx.tenant))
            .duration_seconds(ROLE_SESSION_SECONDS)
            .policy(policy);
        if let Some(id) = &role.external_id {
            request = request.external_id(id);
        }
        self.assumed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let output = request.send().await.map_err(|e| {
            let mut err = sdk_error(Operation { action: "sts:AssumeRole" }, &e);
            if err.code == ErrorCode::VendorError {
                err.message = format!(
                    "{}; check the role's trust policy (it must trust the tenant's keys, with the external id when one is set)",
                    err.message
                );
            }
            err
        })?;
        let Some(issued) = output.credentials() else {
            return Err(ToolError::new(
                ErrorCode::VendorError,
                "sts:AssumeRole answered without credentials",
            ));
        };
        let expiry = SystemTime::try_from(*issued.expiration()).ok();
        let credentials = Credentials::new(
            issued.access_key_id(),
            issued.secret_access_key(),
            Some(issued.session_token().to_owned()),
            expiry,
            "toolgate-assume-role",
        );
        let mut roles = self
            .roles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        roles.retain(|_, c| c.expiry().is_some_and(|e| e > now));
        roles.insert(key, credentials.clone());
        Ok(credentials)
    }
}

impl Sessions {
    pub(crate) fn http_client(&self) -> SharedHttpClient {
        self.http.clone()
    }

    pub(crate) fn retry_config(&self) -> RetryConfig {
        RetryConfig::standard().with_max_attempts(self.config.max_attempts)
    }
}

/// The SDK's operation timeout (retries included) is what is left of the call.
pub(crate) fn call_timeouts(deadline: std::time::Instant) -> Result<TimeoutConfig, ToolError> {
    let remaining = deadline.saturating_duration_since(std::time::Instant::now());
    if remaining < Duration::from_millis(5) {
        return Err(ToolError::new(
            ErrorCode::Timeout,
            "the call's deadline passed before AWS could be asked",
        ));
    }
    Ok(TimeoutConfig::builder()
        .operation_timeout(remaining)
        .connect_timeout(remaining.min(Duration::from_secs(10)))
        .build())
}

impl Session {
    pub(crate) fn config(&self) -> &AwsConfig {
        self.sessions.config()
    }

    pub(crate) fn ec2(&self, region: &str) -> Result<aws_sdk_ec2::Client, ToolError> {
        build_client!(
            aws_sdk_ec2,
            &self.sessions,
            &self.credentials,
            region,
            self.deadline
        )
    }

    pub(crate) fn rds(&self, region: &str) -> Result<aws_sdk_rds::Client, ToolError> {
        build_client!(
            aws_sdk_rds,
            &self.sessions,
            &self.credentials,
            region,
            self.deadline
        )
    }

    pub(crate) fn cloudtrail(&self, region: &str) -> Result<aws_sdk_cloudtrail::Client, ToolError> {
        build_client!(
            aws_sdk_cloudtrail,
            &self.sessions,
            &self.credentials,
            region,
            self.deadline
        )
    }

    pub(crate) fn compute_optimizer(
        &self,
        region: &str,
    ) -> Result<aws_sdk_computeoptimizer::Client, ToolError> {
        build_client!(
            aws_sdk_computeoptimizer,
            &self.sessions,
            &self.credentials,
            region,
            self.deadline
        )
    }

    /// Cost Explorer is served from us-east-1 only (aws-cn: cn-northwest-1).
    pub(crate) fn cost_explorer(&self) -> Result<aws_sdk_costexplorer::Client, ToolError> {
        let region = if self.home_region.starts_with("cn-") {
            "cn-northwest-1"
        } else {
            "us-east-1"
        };
        build_client!(
            aws_sdk_costexplorer,
            &self.sessions,
            &self.credentials,
            region,
            self.deadline
        )
    }

    /// IAM is global; requests are signed for us-east-1 (or the partition's own region).
    pub(crate) fn iam(&self) -> Result<aws_sdk_iam::Client, ToolError> {
        let region = match self.home_region.as_str() {
            r if r.starts_with("cn-") => "cn-north-1",
            r if r.starts_with("us-gov-") => "us-gov-west-1",
            _ => "us-east-1",
        };
        build_client!(
            aws_sdk_iam,
            &self.sessions,
            &self.credentials,
            region,
            self.deadline
        )
    }

    /// S3 with path-style addressing when an endpoint override is set (emulators do not serve
    /// `bucket.host` names).
    pub(crate) fn s3(&self, region: &str) -> Result<aws_sdk_s3::Client, ToolError> {
        let timeouts = call_timeouts(self.deadline)?;
        let mut builder = aws_sdk_s3::config::Builder::new()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new(region.to_owned()))
            .credentials_provider(self.credentials.clone())
            .http_client(self.sessions.http_client())
            .timeout_config(timeouts)
            .retry_config(self.sessions.retry_config());
        if let Some(url) = &self.config().endpoint_url {
            builder = builder.endpoint_url(url.clone()).force_path_style(true);
        }
        Ok(aws_sdk_s3::Client::from_conf(builder.build()))
    }
}

/// An inline session policy allowing exactly `actions` on every resource: the role's session
/// can do no more than the tool needs (the effective rights are the role's intersected with it).
pub(crate) fn session_policy(actions: &[&str]) -> String {
    json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "ToolgateToolActions",
            "Effect": "Allow",
            "Action": actions,
            "Resource": "*"
        }]
    })
    .to_string()
}

/// `toolgate-<tenant>`, within STS's 64 characters of `[\w+=,.@-]`.
fn session_name(tenant: &TenantId) -> String {
    let name: String = format!("toolgate-{tenant}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_+=,.@-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_policy_allows_only_the_actions() {
        let policy: serde_json::Value = serde_json::from_str(&session_policy(&[
            "ec2:DescribeInstances",
            "ec2:DescribeRegions",
        ]))
        .unwrap();
        assert_eq!(
            policy["Statement"][0]["Action"],
            json!(["ec2:DescribeInstances", "ec2:DescribeRegions"])
        );
        assert_eq!(policy["Statement"][0]["Effect"], "Allow");
        assert_eq!(policy["Statement"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn session_names_fit_sts() {
        let tenant = TenantId::new("acme").unwrap();
        assert_eq!(session_name(&tenant), "toolgate-acme");
    }

    #[test]
    fn a_passed_deadline_sends_nothing() {
        let err = call_timeouts(std::time::Instant::now()).unwrap_err();
        assert_eq!(err.code, ErrorCode::Timeout);
    }
}
