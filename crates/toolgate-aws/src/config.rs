//! The connector's configuration, given by the gateway from its `[connectors.aws]` table.
//! Only the operator sets it: the endpoint override in particular never comes from a tenant,
//! because AWS traffic does not pass the HTTP crate's SSRF guard.

use crate::regions::check_region;

/// The region used when neither the call nor the tenant's secret names one.
pub const DEFAULT_REGION: &str = "us-east-1";

/// How the connector reaches AWS. Passed in explicitly; nothing is read from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsConfig {
    /// One endpoint for every AWS service (an emulator such as moto or LocalStack, or a
    /// private gateway). `None`: the real AWS endpoints. Operator configuration only.
    pub endpoint_url: Option<String>,
    /// The region used when neither the call nor the tenant's secret names one.
    pub default_region: String,
    /// How many AWS requests one call runs at once (regions, buckets, users). Default 4.
    pub max_concurrency: usize,
    /// Attempts per AWS request, the first included (the SDK's standard retry, bounded by the
    /// call's deadline). Default 3.
    pub max_attempts: u32,
    /// Items asked for per AWS page (clamped to each operation's own bounds). Smaller pages
    /// mean smaller answers and more requests. Default 100.
    pub page_size: u32,
}

impl Default for AwsConfig {
    fn default() -> AwsConfig {
        AwsConfig {
            endpoint_url: None,
            default_region: DEFAULT_REGION.to_owned(),
            max_concurrency: 4,
            max_attempts: 3,
            page_size: 100,
        }
    }
}

/// Why the connector could not be built (an invalid configuration).
#[derive(Debug, thiserror::Error)]
#[error("invalid aws connector configuration: {0}")]
pub struct AwsConfigError(pub(crate) String);

impl AwsConfig {
    /// Checks every field; the gateway calls this before binding a port.
    pub fn validate(&self) -> Result<(), AwsConfigError> {
        if let Some(url) = &self.endpoint_url {
            let plain = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"));
            let host_ok = plain.is_some_and(|rest| {
                let authority = rest.split('/').next().unwrap_or("");
                !authority.is_empty() && !authority.contains('@')
            });
            if !host_ok {
                return Err(AwsConfigError(format!(
                    "endpoint_url must be an http(s) URL such as http://127.0.0.1:5000, got `{url}`"
                )));
            }
        }
        check_region(&self.default_region)
            .map_err(|e| AwsConfigError(format!("default_region: {e}")))?;
        if !(1..=32).contains(&self.max_concurrency) {
            return Err(AwsConfigError(format!(
                "max_concurrency must be from 1 to 32, got {}",
                self.max_concurrency
            )));
        }
        if !(1..=10).contains(&self.max_attempts) {
            return Err(AwsConfigError(format!(
                "max_attempts must be from 1 to 10, got {}",
                self.max_attempts
            )));
        }
        if !(1..=1000).contains(&self.page_size) {
            return Err(AwsConfigError(format!(
                "page_size must be from 1 to 1000, got {}",
                self.page_size
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configurations_are_named() {
        let cases: [(AwsConfig, &str); 5] = [
            (
                AwsConfig {
                    endpoint_url: Some("127.0.0.1:5000".into()),
                    ..AwsConfig::default()
                },
                "endpoint_url",
            ),
            (
                AwsConfig {
                    endpoint_url: Some("http://user@host".into()),
                    ..AwsConfig::default()
                },
                "endpoint_url",
            ),
            (
                AwsConfig {
                    default_region: "mars-1".into(),
                    ..AwsConfig::default()
                },
                "default_region",
            ),
            (
                AwsConfig {
                    max_concurrency: 0,
                    ..AwsConfig::default()
                },
                "max_concurrency",
            ),
            (
                AwsConfig {
                    max_attempts: 11,
                    ..AwsConfig::default()
                },
                "max_attempts",
            ),
        ];
        for (config, field) in cases {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
        assert!(AwsConfig::default().validate().is_ok());
        let moto = AwsConfig {
            endpoint_url: Some("http://127.0.0.1:5000".into()),
            ..AwsConfig::default()
        };
        assert!(moto.validate().is_ok());
    }
}
