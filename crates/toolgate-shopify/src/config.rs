//! The connector's configuration, given by the gateway from its `[connectors.shopify]` table.

use std::time::Duration;

/// The Admin API version used unless the gateway pins another: the newest stable release.
pub const DEFAULT_API_VERSION: &str = "2026-10";

/// How the connector reaches Shopify. Passed in explicitly; nothing is read from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShopifyConfig {
    /// The Admin API version every query names (`YYYY-MM`, a quarterly release). Pinned so a
    /// Shopify release never changes the shapes under the agent; move it on deliberately.
    pub api_version: String,
    /// Hosts a tenant's `shop` may name besides `*.myshopify.com`, exempt from the SSRF guard and
    /// allowed over plain http (tests: `127.0.0.1`). Empty by default.
    pub allow_hosts: Vec<String>,
    /// How long before a client-credentials token expires it is replaced. Default 5 minutes.
    pub token_refresh_margin: Duration,
}

impl Default for ShopifyConfig {
    fn default() -> ShopifyConfig {
        ShopifyConfig {
            api_version: DEFAULT_API_VERSION.to_owned(),
            allow_hosts: Vec::new(),
            token_refresh_margin: Duration::from_secs(300),
        }
    }
}

/// Whether `version` names a stable quarterly Admin API release (`2026-10`).
pub(crate) fn is_stable_version(version: &str) -> bool {
    let Some((year, month)) = version.split_once('-') else {
        return false;
    };
    year.len() == 4
        && year.bytes().all(|b| b.is_ascii_digit())
        && year >= "2024"
        && matches!(month, "01" | "04" | "07" | "10")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        for good in ["2026-10", "2025-01", "2027-04"] {
            assert!(is_stable_version(good), "{good}");
        }
        for bad in [
            "unstable",
            "2026-11",
            "26-10",
            "2026-1",
            "2019-10",
            "2026-10-01",
            "",
        ] {
            assert!(!is_stable_version(bad), "{bad}");
        }
    }
}
