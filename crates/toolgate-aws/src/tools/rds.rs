//! `aws.rds_inventory`: RDS database instances and their exposure.

use serde_json::{Value, json};
use toolgate_core::ToolError;

use crate::errors::{Operation, sdk_error};
use crate::session::Session;
use crate::tools::{Capped, fan_out, finding, limit, page_size, regions, settle, time};

/// `aws.rds_inventory`.
pub(crate) async fn rds_inventory(
    session: &Session,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let regions = regions(arguments, session)?;
    let limit = limit(arguments, 100, super::MAX_LIMIT)?;
    let op = Operation {
        action: "rds:DescribeDBInstances",
    };
    let results = fan_out(session, &regions, |region| async move {
        let client = session.rds(&region)?;
        let mut capped = Capped::new(limit);
        let mut pages = client
            .describe_db_instances()
            .into_paginator()
            .page_size(page_size(session, limit, 20, 100))
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error(op, &e))?;
            let more = page.marker().is_some_and(|m| !m.is_empty());
            let items: Vec<Value> = page
                .db_instances()
                .iter()
                .map(|db| {
                    json!({
                        "db_instance_id": db.db_instance_identifier(),
                        "engine": db.engine(),
                        "engine_version": db.engine_version(),
                        "instance_class": db.db_instance_class(),
                        "status": db.db_instance_status(),
                        "region": region,
                        "availability_zone": db.availability_zone(),
                        "multi_az": db.multi_az(),
                        "allocated_storage_gib": db.allocated_storage(),
                        "storage_type": db.storage_type(),
                        "storage_encrypted": db.storage_encrypted(),
                        "publicly_accessible": db.publicly_accessible(),
                        "backup_retention_days": db.backup_retention_period(),
                        "created": time(db.instance_create_time()),
                    })
                })
                .collect();
            if capped.extend(items, more) {
                break;
            }
        }
        Ok(capped)
    })
    .await;
    let (ok, region_errors) = settle(results)?;
    let mut items = Vec::new();
    let mut truncated = false;
    for (_, capped) in ok {
        truncated |= capped.truncated;
        for item in capped.items {
            if items.len() == limit {
                truncated = true;
                break;
            }
            items.push(item);
        }
    }
    let mut findings = Vec::new();
    for db in &items {
        let id = db["db_instance_id"].as_str().unwrap_or("");
        let region = db["region"].as_str();
        if db["publicly_accessible"] == true {
            findings.push(finding("publicly_accessible_database", "high", id, region, "the instance accepts connections from the internet (PubliclyAccessible); turn it off unless required".to_owned()));
        }
        if db["storage_encrypted"] == false {
            findings.push(finding(
                "unencrypted_database",
                "medium",
                id,
                region,
                "storage is not encrypted at rest".to_owned(),
            ));
        }
        if db["backup_retention_days"] == 0 {
            findings.push(finding(
                "backups_disabled",
                "medium",
                id,
                region,
                "automated backups are off (retention 0 days)".to_owned(),
            ));
        }
    }
    Ok(json!({
        "regions": regions,
        "count": items.len(),
        "truncated": truncated,
        "findings": findings,
        "items": items,
        "region_errors": region_errors,
    }))
}
