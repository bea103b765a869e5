//! `aws.cloudtrail_coverage`: which regions a logging trail covers.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use toolgate_core::ToolError;

use crate::errors::{Operation, sdk_error};
use crate::session::Session;
use crate::tools::{bounded, fan_out, finding, regions, settle};

/// One trail as seen from a region.
#[derive(Clone, Debug)]
struct Trail {
    arn: String,
    name: String,
    home_region: String,
    multi_region: bool,
    log_file_validation: bool,
    bucket: Option<String>,
}

/// `aws.cloudtrail_coverage`.
pub(crate) async fn cloudtrail_coverage(
    session: &Session,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let regions = regions(arguments, session)?;
    let describe = Operation {
        action: "cloudtrail:DescribeTrails",
    };
    let results = fan_out(session, &regions, |region| async move {
        let client = session.cloudtrail(&region)?;
        let output = client
            .describe_trails()
            .include_shadow_trails(true)
            .send()
            .await
            .map_err(|e| sdk_error(describe, &e))?;
        let trails: Vec<Trail> = output
            .trail_list()
            .iter()
            .filter_map(|t| {
                Some(Trail {
                    arn: t.trail_arn()?.to_owned(),
                    name: t.name().unwrap_or("").to_owned(),
                    home_region: t.home_region().unwrap_or(&region).to_owned(),
                    multi_region: t.is_multi_region_trail().unwrap_or(false),
                    log_file_validation: t.log_file_validation_enabled().unwrap_or(false),
                    bucket: t.s3_bucket_name().map(str::to_owned),
                })
            })
            .collect();
        Ok(trails)
    })
    .await;
    let (ok, region_errors) = settle(results)?;
    // Each trail's status is asked once, in its home region.
    let mut trails: BTreeMap<String, Trail> = BTreeMap::new();
    for (_, seen) in &ok {
        for trail in seen {
            trails
                .entry(trail.arn.clone())
                .or_insert_with(|| trail.clone());
        }
    }
    let status_op = Operation {
        action: "cloudtrail:GetTrailStatus",
    };
    let statuses = bounded(
        session.config().max_concurrency,
        trails.values().cloned().collect(),
        |trail| async move {
            let client = session.cloudtrail(&trail.home_region)?;
            let status = client
                .get_trail_status()
                .name(&trail.arn)
                .send()
                .await
                .map_err(|e| sdk_error(status_op, &e))?;
            Ok::<_, ToolError>((trail.arn.clone(), status.is_logging().unwrap_or(false)))
        },
    )
    .await;
    let mut logging: BTreeMap<String, bool> = BTreeMap::new();
    for status in statuses {
        let (arn, is_logging) = status?;
        logging.insert(arn, is_logging);
    }
    let mut findings = Vec::new();
    let mut coverage = Vec::new();
    for (region, seen) in &ok {
        let covering: Vec<&Trail> = seen
            .iter()
            .filter(|t| {
                logging.get(&t.arn).copied().unwrap_or(false)
                    && (t.multi_region || t.home_region == *region)
            })
            .collect();
        let multi = covering.iter().any(|t| t.multi_region);
        if !multi {
            let detail = if covering.is_empty() {
                "no logging trail records this region's API activity; create a multi-region trail (or start logging the existing one)".to_owned()
            } else {
                "only a single-region trail logs this region; a multi-region trail also covers regions enabled later".to_owned()
            };
            let severity = if covering.is_empty() { "high" } else { "low" };
            findings.push(finding(
                "region_without_multi_region_trail",
                severity,
                region,
                Some(region),
                detail,
            ));
        }
        coverage.push(json!({
            "region": region,
            "covered_by_multi_region_trail": multi,
            "logging_trails": covering.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        }));
    }
    let mut items = Vec::new();
    for trail in trails.values() {
        let is_logging = logging.get(&trail.arn).copied().unwrap_or(false);
        if !is_logging {
            findings.push(finding(
                "trail_not_logging",
                "high",
                &trail.arn,
                Some(&trail.home_region),
                format!(
                    "trail `{}` exists but is not logging; start logging",
                    trail.name
                ),
            ));
        }
        if !trail.log_file_validation {
            findings.push(finding(
                "log_file_validation_off",
                "low",
                &trail.arn,
                Some(&trail.home_region),
                format!(
                    "trail `{}` does not validate log files (tampering would go unnoticed)",
                    trail.name
                ),
            ));
        }
        items.push(json!({
            "name": trail.name,
            "arn": trail.arn,
            "home_region": trail.home_region,
            "multi_region": trail.multi_region,
            "logging": is_logging,
            "log_file_validation": trail.log_file_validation,
            "s3_bucket": trail.bucket,
        }));
    }
    Ok(json!({
        "regions": regions,
        "count": items.len(),
        "regions_covered": coverage.iter().filter(|c| c["covered_by_multi_region_trail"] == true).count(),
        "coverage": coverage,
        "findings": findings,
        "items": items,
        "region_errors": region_errors,
    }))
}
