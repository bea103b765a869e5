//! `aws.s3_inventory`: buckets, public access blocks, default encryption, public policies.

use aws_smithy_types::error::metadata::ProvideErrorMetadata as _;
use serde_json::{Value, json};
use toolgate_core::ToolError;

use crate::errors::{Operation, sdk_error};
use crate::session::Session;
use crate::tools::{Capped, bounded, finding, limit, optional_string, page_size, time};

/// "Not configured" answers: findings, not failures.
const NO_PUBLIC_ACCESS_BLOCK: &str = "NoSuchPublicAccessBlockConfiguration";
const NO_ENCRYPTION: &str = "ServerSideEncryptionConfigurationNotFoundError";
const NO_POLICY: &str = "NoSuchBucketPolicy";

/// The region a bucket lives in, from GetBucketLocation's constraint.
pub(crate) fn bucket_region(constraint: Option<&str>) -> String {
    match constraint {
        None | Some("") => "us-east-1".to_owned(),
        Some("EU") => "eu-west-1".to_owned(),
        Some(other) => other.to_owned(),
    }
}

/// `aws.s3_inventory`.
pub(crate) async fn s3_inventory(session: &Session, arguments: &Value) -> Result<Value, ToolError> {
    let limit = limit(arguments, 100, super::MAX_LIMIT)?;
    let prefix = optional_string(arguments, "prefix", 63)?;
    let list_region = if session.home_region.starts_with("cn-") {
        session.home_region.clone()
    } else {
        "us-east-1".to_owned()
    };
    let client = session.s3(&list_region)?;
    let list_op = Operation {
        action: "s3:ListAllMyBuckets",
    };
    let mut buckets = Capped::new(limit);
    let mut pages = client
        .list_buckets()
        .set_prefix(prefix.clone())
        .into_paginator()
        .page_size(page_size(session, limit, 1, 10_000))
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| sdk_error(list_op, &e))?;
        let more = page.continuation_token().is_some_and(|t| !t.is_empty());
        let names: Vec<(String, Value)> = page
            .buckets()
            .iter()
            .filter_map(|b| Some((b.name()?.to_owned(), time(b.creation_date()))))
            .filter(|(name, _)| prefix.as_deref().is_none_or(|p| name.starts_with(p)))
            .collect();
        if buckets.extend(names, more) {
            break;
        }
    }
    let truncated = buckets.truncated;
    let audited = bounded(
        session.config().max_concurrency,
        buckets.items,
        |(name, created)| {
            let client = client.clone();
            async move { audit_bucket(session, &client, name, created).await }
        },
    )
    .await;
    let mut items = Vec::new();
    let mut findings = Vec::new();
    for bucket in audited {
        let (item, bucket_findings) = bucket?;
        items.push(item);
        findings.extend(bucket_findings);
    }
    Ok(json!({
        "count": items.len(),
        "truncated": truncated,
        "public_access_not_blocked": items.iter().filter(|b| b["public_access_fully_blocked"] == false).count(),
        "without_default_encryption": items.iter().filter(|b| b["default_encryption"].is_null()).count(),
        "findings": findings,
        "items": items,
    }))
}

async fn audit_bucket(
    session: &Session,
    list_client: &aws_sdk_s3::Client,
    name: String,
    created: Value,
) -> Result<(Value, Vec<Value>), ToolError> {
    let location_op = Operation {
        action: "s3:GetBucketLocation",
    };
    let pab_op = Operation {
        action: "s3:GetBucketPublicAccessBlock",
    };
    let encryption_op = Operation {
        action: "s3:GetEncryptionConfiguration",
    };
    let policy_op = Operation {
        action: "s3:GetBucketPolicyStatus",
    };
    let location = list_client
        .get_bucket_location()
        .bucket(&name)
        .send()
        .await
        .map_err(|e| sdk_error(location_op, &e))?;
    let region = bucket_region(location.location_constraint().map(|c| c.as_str()));
    let client = session.s3(&region)?;
    let block = match client.get_public_access_block().bucket(&name).send().await {
        Ok(output) => output.public_access_block_configuration().map(|c| {
            [
                c.block_public_acls(),
                c.ignore_public_acls(),
                c.block_public_policy(),
                c.restrict_public_buckets(),
            ]
        }),
        Err(e) if e.code() == Some(NO_PUBLIC_ACCESS_BLOCK) => None,
        Err(e) => return Err(sdk_error(pab_op, &e)),
    };
    let encryption = match client.get_bucket_encryption().bucket(&name).send().await {
        Ok(output) => output
            .server_side_encryption_configuration()
            .and_then(|c| c.rules().first())
            .and_then(|r| r.apply_server_side_encryption_by_default())
            .map(|d| d.sse_algorithm().as_str().to_owned()),
        Err(e) if e.code() == Some(NO_ENCRYPTION) => None,
        Err(e) => return Err(sdk_error(encryption_op, &e)),
    };
    let policy_public = match client.get_bucket_policy_status().bucket(&name).send().await {
        Ok(output) => output.policy_status().and_then(|s| s.is_public()),
        Err(e) if e.code() == Some(NO_POLICY) => None,
        Err(e) => return Err(sdk_error(policy_op, &e)),
    };
    let flags = block.map(|f| f.map(|v| v.unwrap_or(false)));
    let fully_blocked = flags.is_some_and(|f| f.iter().all(|v| *v));
    let mut findings = Vec::new();
    if !fully_blocked {
        let detail = match flags {
            None => "no public access block is configured on the bucket".to_owned(),
            Some(f) => {
                let names = [
                    "BlockPublicAcls",
                    "IgnorePublicAcls",
                    "BlockPublicPolicy",
                    "RestrictPublicBuckets",
                ];
                let off: Vec<&str> = names
                    .iter()
                    .zip(f)
                    .filter(|(_, on)| !on)
                    .map(|(n, _)| *n)
                    .collect();
                format!("public access block settings off: {}", off.join(", "))
            }
        };
        findings.push(finding("public_access_not_blocked", "high", &name, Some(&region), format!("{detail}; turn on all four settings unless the bucket must be public (the account-level block may still apply)")));
    }
    if encryption.is_none() {
        findings.push(finding(
            "no_default_encryption",
            "medium",
            &name,
            Some(&region),
            "the bucket answers no default encryption configuration".to_owned(),
        ));
    }
    if policy_public == Some(true) {
        findings.push(finding(
            "public_bucket_policy",
            "high",
            &name,
            Some(&region),
            "the bucket policy grants public access".to_owned(),
        ));
    }
    let item = json!({
        "name": name,
        "region": region,
        "created": created,
        "public_access_block": flags.map(|f| json!({
            "block_public_acls": f[0], "ignore_public_acls": f[1], "block_public_policy": f[2], "restrict_public_buckets": f[3]
        })),
        "public_access_fully_blocked": fully_blocked,
        "default_encryption": encryption,
        "policy_is_public": policy_public,
    });
    Ok((item, findings))
}

#[cfg(test)]
mod tests {
    use super::bucket_region;

    #[test]
    fn bucket_regions_follow_s3s_constraints() {
        assert_eq!(bucket_region(None), "us-east-1");
        assert_eq!(bucket_region(Some("")), "us-east-1");
        assert_eq!(bucket_region(Some("EU")), "eu-west-1");
        assert_eq!(bucket_region(Some("ap-south-1")), "ap-south-1");
    }
}
