//! The tenant's `aws_default` secret: static keys, optionally a role to assume with them,
//! validated before anything is sent.
//!
//! The value is a JSON object:
//! `{"access_key_id": "AKIA...", "secret_access_key": "...", "session_token": "...",
//!   "region": "eu-west-1", "role_arn": "arn:aws:iam::123456789012:role/audit",
//!   "external_id": "..."}`; `session_token`, `region`, `role_arn` and `external_id` are
//! optional (`external_id` only with `role_arn`). Endpoint keys are refused on purpose: where
//! AWS traffic goes is the operator's decision, never a tenant's.

use serde_json::Value;
use toolgate_core::{ErrorCode, SecretValue, ToolError};

use crate::regions::check_region;

/// The secret every AWS tool declares.
pub const SECRET_NAME: &str = "aws_default";

/// A validated credential set. `Debug` never shows the keys.
#[derive(Clone)]
pub(crate) struct TenantCredentials {
    pub(crate) access_key_id: SecretValue,
    pub(crate) secret_access_key: SecretValue,
    pub(crate) session_token: Option<SecretValue>,
    /// The tenant's home region, when it names one.
    pub(crate) region: Option<String>,
    /// The role to assume for every call, when cross-account access is configured.
    pub(crate) role: Option<Role>,
}

/// A role to assume with the tenant's keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Role {
    pub(crate) arn: String,
    pub(crate) external_id: Option<String>,
}

impl std::fmt::Debug for TenantCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantCredentials")
            .field("session_token", &self.session_token.is_some())
            .field("region", &self.region)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// The keys the secret may hold.
const KEYS: &str =
    "access_key_id, secret_access_key, session_token, region, role_arn and external_id";

impl TenantCredentials {
    /// Parses and validates the secret's value. Messages never repeat a key or a token.
    pub(crate) fn parse(value: &str) -> Result<TenantCredentials, ToolError> {
        let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(value.trim()) else {
            return Err(bad_secret(
                "it is not a JSON object; expected {\"access_key_id\": \"AKIA...\", \"secret_access_key\": \"...\", \"region\": \"us-east-1\"} with optional session_token, role_arn and external_id",
            ));
        };
        let mut access_key_id = None;
        let mut secret_access_key = None;
        let mut session_token = None;
        let mut region = None;
        let mut role_arn = None;
        let mut external_id = None;
        for (key, value) in &fields {
            let lowered = key.to_ascii_lowercase();
            if lowered.contains("endpoint") || lowered == "url" || lowered == "base_url" {
                return Err(bad_secret(&format!(
                    "`{}` is not accepted: the AWS endpoint is set by the gateway's operator in [connectors.aws], never in a tenant's secret",
                    shown(key)
                )));
            }
            let Some(text) = value.as_str() else {
                return Err(bad_secret(&format!("`{}` must be a string", shown(key))));
            };
            let text = text.trim();
            match key.as_str() {
                "access_key_id" => access_key_id = Some(text),
                "secret_access_key" => secret_access_key = Some(text),
                "session_token" => session_token = Some(text),
                "region" => region = Some(text),
                "role_arn" => role_arn = Some(text),
                "external_id" => external_id = Some(text),
                other => {
                    return Err(bad_secret(&format!(
                        "unknown key `{}`; the keys are {KEYS}",
                        shown(other)
                    )));
                }
            }
        }
        let access_key_id =
            access_key_id.ok_or_else(|| bad_secret("`access_key_id` is missing"))?;
        let key_ok = (16..=128).contains(&access_key_id.len())
            && access_key_id.chars().all(|c| c.is_ascii_alphanumeric());
        if !key_ok {
            return Err(bad_secret(
                "`access_key_id` must be 16 to 128 letters and digits (AKIA... for a user's key, ASIA... for temporary ones)",
            ));
        }
        let secret_access_key =
            secret_access_key.ok_or_else(|| bad_secret("`secret_access_key` is missing"))?;
        if secret_access_key.is_empty() || secret_access_key.chars().any(char::is_whitespace) {
            return Err(bad_secret(
                "`secret_access_key` is empty or contains whitespace",
            ));
        }
        if session_token.is_some_and(str::is_empty) {
            return Err(bad_secret("`session_token` is empty; leave it out"));
        }
        if let Some(region) = region {
            check_region(region).map_err(|e| bad_secret(&format!("`region`: {e}")))?;
        }
        let role = match (role_arn, external_id) {
            (None, Some(_)) => {
                return Err(bad_secret("`external_id` is given without `role_arn`"));
            }
            (None, None) => None,
            (Some(arn), external_id) => {
                check_role_arn(arn)?;
                if let Some(id) = external_id {
                    check_external_id(id)?;
                }
                Some(Role {
                    arn: arn.to_owned(),
                    external_id: external_id.map(str::to_owned),
                })
            }
        };
        Ok(TenantCredentials {
            access_key_id: SecretValue::new(access_key_id),
            secret_access_key: SecretValue::new(secret_access_key),
            session_token: session_token.map(SecretValue::new),
            region: region.map(str::to_owned),
            role,
        })
    }
}

/// `arn:PARTITION:iam::ACCOUNT:role/PATH/NAME`, as IAM issues them.
fn check_role_arn(arn: &str) -> Result<(), ToolError> {
    let malformed = || {
        bad_secret(
            "`role_arn` is not an IAM role ARN; expected arn:aws:iam::123456789012:role/NAME",
        )
    };
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    let [prefix, partition, service, region, account, resource] = parts.as_slice() else {
        return Err(malformed());
    };
    let partition_ok = matches!(*partition, "aws" | "aws-cn" | "aws-us-gov");
    let account_ok = account.len() == 12 && account.chars().all(|c| c.is_ascii_digit());
    let name = resource.strip_prefix("role/").unwrap_or("");
    let name_ok = !name.is_empty()
        && arn.len() <= 2048
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+=,.@-_/".contains(c))
        && !name.ends_with('/');
    if *prefix == "arn"
        && partition_ok
        && *service == "iam"
        && region.is_empty()
        && account_ok
        && name_ok
    {
        Ok(())
    } else {
        Err(malformed())
    }
}

/// STS: 2 to 1224 characters of `[\w+=,.@:/-]`.
fn check_external_id(id: &str) -> Result<(), ToolError> {
    let ok = (2..=1224).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_+=,.@:/-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(bad_secret(
            "`external_id` must be 2 to 1224 characters of letters, digits and _+=,.@:/-",
        ))
    }
}

fn shown(key: &str) -> String {
    key.chars().take(40).collect()
}

/// Why a stored credential is unusable; the operator fixes it with `toolgate secrets put`.
fn bad_secret(reason: &str) -> ToolError {
    ToolError::new(
        ErrorCode::CredentialsUnavailable,
        format!(
            "the tenant's `{SECRET_NAME}` secret is not a usable AWS credential: {reason}; nothing was sent to AWS"
        ),
    )
    .with_attempts(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "AKIAIOSFODNN7EXAMPLE";
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    #[test]
    fn accepted_forms() {
        let plain = TenantCredentials::parse(&format!(
            r#"{{"access_key_id": "{KEY}", "secret_access_key": "{SECRET}", "region": "eu-west-1"}}"#
        ))
        .unwrap();
        assert_eq!(plain.region.as_deref(), Some("eu-west-1"));
        assert!(plain.role.is_none() && plain.session_token.is_none());
        let role = TenantCredentials::parse(&format!(
            r#"{{"access_key_id": "{KEY}", "secret_access_key": "{SECRET}", "session_token": "FwoGZXIvYXdzEXAMPLE", "role_arn": "arn:aws:iam::123456789012:role/path/audit", "external_id": "acme-7f3a"}}"#
        ))
        .unwrap();
        assert_eq!(
            role.role,
            Some(Role {
                arn: "arn:aws:iam::123456789012:role/path/audit".into(),
                external_id: Some("acme-7f3a".into())
            })
        );
        assert!(role.region.is_none());
    }

    #[test]
    fn refused_forms_say_why_and_never_echo_secrets() {
        let base = format!(r#""access_key_id": "{KEY}", "secret_access_key": "{SECRET}""#);
        let cases = [
            (format!("{KEY}:{SECRET}"), "not a JSON object"),
            (
                format!(r#"{{"secret_access_key": "{SECRET}"}}"#),
                "`access_key_id` is missing",
            ),
            (
                format!(r#"{{"access_key_id": "{KEY}"}}"#),
                "`secret_access_key` is missing",
            ),
            (
                format!(r#"{{"access_key_id": "AK-1", "secret_access_key": "{SECRET}"}}"#),
                "16 to 128",
            ),
            (
                format!(r#"{{{base}, "region": "us-east-9"}}"#),
                "not an AWS region",
            ),
            (
                format!(r#"{{{base}, "role_arn": "arn:aws:iam::12345:role/x"}}"#),
                "not an IAM role ARN",
            ),
            (
                format!(r#"{{{base}, "role_arn": "arn:aws:s3:::bucket"}}"#),
                "not an IAM role ARN",
            ),
            (
                format!(r#"{{{base}, "role_arn": "arn:aws:iam::123456789012:user/bob"}}"#),
                "not an IAM role ARN",
            ),
            (
                format!(r#"{{{base}, "external_id": "abc"}}"#),
                "without `role_arn`",
            ),
            (
                format!(
                    r#"{{{base}, "role_arn": "arn:aws:iam::123456789012:role/a", "external_id": "x"}}"#
                ),
                "2 to 1224",
            ),
            (
                format!(r#"{{{base}, "endpoint_url": "http://169.254.169.254"}}"#),
                "set by the gateway's operator",
            ),
            (
                format!(r#"{{{base}, "Endpoint": "http://10.0.0.1"}}"#),
                "set by the gateway's operator",
            ),
            (
                format!(r#"{{{base}, "profile": "default"}}"#),
                "unknown key `profile`",
            ),
            (format!(r#"{{{base}, "region": 5}}"#), "must be a string"),
        ];
        for (value, expected) in cases {
            let err = TenantCredentials::parse(&value).unwrap_err();
            assert_eq!(err.code, ErrorCode::CredentialsUnavailable, "{value}");
            assert!(err.message.contains(expected), "{value}: {}", err.message);
            assert!(err.message.contains("nothing was sent"), "{}", err.message);
            assert!(
                !err.message.contains(SECRET),
                "secret echoed: {}",
                err.message
            );
            assert!(!err.message.contains(KEY), "key echoed: {}", err.message);
        }
    }

    #[test]
    fn debug_hides_keys() {
        let parsed = TenantCredentials::parse(&format!(
            r#"{{"access_key_id": "{KEY}", "secret_access_key": "{SECRET}", "session_token": "TOKENVALUE"}}"#
        ))
        .unwrap();
        let shown = format!("{parsed:?}");
        assert!(
            !shown.contains(KEY) && !shown.contains(SECRET) && !shown.contains("TOKENVALUE"),
            "{shown}"
        );
    }
}
