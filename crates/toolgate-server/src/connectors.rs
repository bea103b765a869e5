//! The connectors of this build, registered explicitly: Slack, Shopify and AWS each behind
//! its cargo feature (all three by default), the `testkit.*` test connectors behind `testkit`.

use std::sync::Arc;

use anyhow::{Context as _, bail};
use toolgate_core::{Connector, ToolRegistry};
use toolgate_http::HttpObserver;

use crate::config::{AwsSettings, ShopifySettings, SlackSettings};

/// The connectors compiled into this build, in registration order.
fn compiled_connectors(
    slack: &SlackSettings,
    shopify: &ShopifySettings,
    aws: &AwsSettings,
    vendor_observer: &Arc<dyn HttpObserver>,
) -> anyhow::Result<Vec<Arc<dyn Connector>>> {
    let mut connectors: Vec<Arc<dyn Connector>> = Vec::new();
    add_slack(&mut connectors, slack, vendor_observer)?;
    add_shopify(&mut connectors, shopify, vendor_observer)?;
    add_aws(&mut connectors, aws)?;
    add_testkit(&mut connectors);
    Ok(connectors)
}

#[cfg(feature = "slack")]
fn add_slack(
    connectors: &mut Vec<Arc<dyn Connector>>,
    settings: &SlackSettings,
    vendor_observer: &Arc<dyn HttpObserver>,
) -> anyhow::Result<()> {
    let defaults = toolgate_slack::SlackConfig::default();
    let config = toolgate_slack::SlackConfig {
        api_base_url: settings
            .api_base_url
            .clone()
            .unwrap_or(defaults.api_base_url.clone()),
        allow_hosts: settings.allow_hosts.clone(),
        webhook_hosts: settings
            .webhook_hosts
            .clone()
            .unwrap_or(defaults.webhook_hosts.clone()),
        ..defaults
    };
    let connector =
        toolgate_slack::SlackConnector::with_http_observer(config, Arc::clone(vendor_observer))
            .context("connectors.slack in the configuration")?;
    connectors.push(Arc::new(connector));
    Ok(())
}

#[cfg(not(feature = "slack"))]
fn add_slack(
    _connectors: &mut Vec<Arc<dyn Connector>>,
    _settings: &SlackSettings,
    _vendor_observer: &Arc<dyn HttpObserver>,
) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(feature = "shopify")]
fn add_shopify(
    connectors: &mut Vec<Arc<dyn Connector>>,
    settings: &ShopifySettings,
    vendor_observer: &Arc<dyn HttpObserver>,
) -> anyhow::Result<()> {
    let defaults = toolgate_shopify::ShopifyConfig::default();
    let config = toolgate_shopify::ShopifyConfig {
        api_version: settings
            .api_version
            .clone()
            .unwrap_or(defaults.api_version.clone()),
        allow_hosts: settings.allow_hosts.clone(),
        ..defaults
    };
    let connector =
        toolgate_shopify::ShopifyConnector::with_http_observer(config, Arc::clone(vendor_observer))
            .context("connectors.shopify in the configuration")?;
    connectors.push(Arc::new(connector));
    Ok(())
}

#[cfg(feature = "aws")]
fn add_aws(connectors: &mut Vec<Arc<dyn Connector>>, settings: &AwsSettings) -> anyhow::Result<()> {
    let defaults = toolgate_aws::AwsConfig::default();
    let config = toolgate_aws::AwsConfig {
        endpoint_url: settings.endpoint_url.clone(),
        default_region: settings
            .default_region
            .clone()
            .unwrap_or(defaults.default_region.clone()),
        max_concurrency: settings.max_concurrency.unwrap_or(defaults.max_concurrency),
        max_attempts: settings.max_attempts.unwrap_or(defaults.max_attempts),
        page_size: settings.page_size.unwrap_or(defaults.page_size),
    };
    let connector =
        toolgate_aws::AwsConnector::new(config).context("connectors.aws in the configuration")?;
    connectors.push(Arc::new(connector));
    Ok(())
}

#[cfg(not(feature = "shopify"))]
fn add_shopify(
    _connectors: &mut Vec<Arc<dyn Connector>>,
    _settings: &ShopifySettings,
    _vendor_observer: &Arc<dyn HttpObserver>,
) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(not(feature = "aws"))]
fn add_aws(
    _connectors: &mut Vec<Arc<dyn Connector>>,
    _settings: &AwsSettings,
) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(feature = "testkit")]
fn add_testkit(connectors: &mut Vec<Arc<dyn Connector>>) {
    connectors.push(Arc::new(toolgate_engine::testkit::TestkitConnector));
}

#[cfg(not(feature = "testkit"))]
fn add_testkit(_connectors: &mut Vec<Arc<dyn Connector>>) {}

/// Registers every compiled connector except the disabled families.
pub fn build_registry(
    disabled: &[String],
    slack: &SlackSettings,
    shopify: &ShopifySettings,
    aws: &AwsSettings,
) -> anyhow::Result<ToolRegistry> {
    let observer: Arc<dyn HttpObserver> = Arc::new(toolgate_http::NoHttpObserver);
    build_observed_registry(disabled, slack, shopify, aws, observer)
}

/// [`build_registry`], the HTTP connectors telling `vendor_observer` of every vendor request
/// (the gateway's metrics). The AWS connector's SDK requests are not told.
pub(crate) fn build_observed_registry(
    disabled: &[String],
    slack: &SlackSettings,
    shopify: &ShopifySettings,
    aws: &AwsSettings,
    vendor_observer: Arc<dyn HttpObserver>,
) -> anyhow::Result<ToolRegistry> {
    let connectors = compiled_connectors(slack, shopify, aws, &vendor_observer)?;
    for family in disabled {
        if !connectors.iter().any(|c| c.family() == family) {
            let available: Vec<&str> = connectors.iter().map(|c| c.family()).collect();
            bail!(
                "connectors.disabled names `{family}`, which this build does not include (compiled connectors: {})",
                if available.is_empty() {
                    "none".to_owned()
                } else {
                    available.join(", ")
                }
            );
        }
    }
    let mut registry = ToolRegistry::new();
    for connector in connectors {
        if disabled.iter().any(|family| family == connector.family()) {
            continue;
        }
        registry.register(connector)?;
    }
    Ok(registry)
}
