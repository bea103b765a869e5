//! The twelve tool specs: names, the IAM actions each needs (its session policy, and the
//! README's policy document), JSON Schemas and descriptions written for an LLM.

use std::time::Duration;

use serde_json::{Value, json};
use toolgate_core::{RiskLevel, SecretName, Tag, ToolName, ToolSpec};

use crate::credentials::SECRET_NAME;
use crate::regions::MAX_REGIONS;
use crate::tools::MAX_LIMIT;

/// Every tool: its action name and the IAM actions it calls, nothing more.
pub const TOOL_ACTIONS: &[(&str, &[&str])] = &[
    ("ec2_inventory", &["ec2:DescribeInstances"]),
    ("ebs_inventory", &["ec2:DescribeVolumes"]),
    ("cost_breakdown", &["ce:GetCostAndUsage"]),
    ("cost_anomalies", &["ce:GetAnomalies"]),
    (
        "compute_optimizer_recs",
        &["compute-optimizer:GetEC2InstanceRecommendations"],
    ),
    (
        "s3_inventory",
        &[
            "s3:ListAllMyBuckets",
            "s3:GetBucketLocation",
            "s3:GetBucketPublicAccessBlock",
            "s3:GetEncryptionConfiguration",
            "s3:GetBucketPolicyStatus",
        ],
    ),
    (
        "iam_audit",
        &[
            "iam:ListUsers",
            "iam:ListAccessKeys",
            "iam:GetAccessKeyLastUsed",
            "iam:ListMFADevices",
            "iam:GetLoginProfile",
            "iam:GetAccountSummary",
            "iam:GetAccountPasswordPolicy",
        ],
    ),
    ("security_groups_audit", &["ec2:DescribeSecurityGroups"]),
    (
        "cloudtrail_coverage",
        &["cloudtrail:DescribeTrails", "cloudtrail:GetTrailStatus"],
    ),
    ("nat_gateways_audit", &["ec2:DescribeNatGateways"]),
    ("eips_audit", &["ec2:DescribeAddresses"]),
    ("rds_inventory", &["rds:DescribeDBInstances"]),
];

/// The IAM actions of one tool (by its action name, e.g. `ec2_inventory`).
pub(crate) fn actions_of(action: &str) -> &'static [&'static str] {
    TOOL_ACTIONS
        .iter()
        .find(|(name, _)| *name == action)
        .map_or(&[], |(_, actions)| actions)
}

fn regions_property(what: &str) -> Value {
    json!({
        "type": "array",
        "items": {"type": "string", "pattern": "^[a-z]{2}(-gov)?-[a-z]+-[0-9]$"},
        "minItems": 1,
        "maxItems": MAX_REGIONS,
        "uniqueItems": true,
        "description": format!("AWS regions to {what}, e.g. [\"us-east-1\", \"eu-west-1\"]. Default: the tenant's home region. Regions are queried in parallel; a region that fails is listed in region_errors while the others still answer.")
    })
}

fn limit_property(default: u64, what: &str) -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "description": format!("The most {what} to return (default {default}). `truncated` says when more exist.")})
}

fn date_property(what: &str) -> Value {
    json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "description": what})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

fn spec(action: &str, description: &str, schema: Value, category: &str) -> ToolSpec {
    let name = ToolName::new(format!("aws.{action}")).expect("static tool name");
    ToolSpec::new(name, description, schema)
        .tag(Tag::READ_ONLY)
        .tag("aws")
        .tag(category)
        .risk(RiskLevel::Low)
        .idempotent(true)
        .secret(SecretName::new(SECRET_NAME).expect("static secret name"))
        .timeout(Duration::from_secs(60))
}

const ANSWER: &str = "Answers counts, the items (capped at `limit`, with `truncated`), and region_errors for regions that failed.";

/// Every tool the connector serves.
pub(crate) fn specs() -> Vec<ToolSpec> {
    vec![
        spec(
            "ec2_inventory",
            &format!(
                "Lists the account's EC2 instances in one or more regions: id, name tag, type, state, availability zone, launch time, private and public IP, platform, tags. Optionally only some states (e.g. [\"running\"]) or instances carrying a tag. Counts by state and by type. Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "regions": regions_property("list instances in"),
                    "states": {"type": "array", "items": {"enum": ["pending", "running", "shutting-down", "terminated", "stopping", "stopped"]}, "minItems": 1, "uniqueItems": true, "description": "Only instances in these states."},
                    "tag_key": {"type": "string", "minLength": 1, "maxLength": 128, "description": "Only instances with this tag key (e.g. \"Environment\")."},
                    "tag_value": {"type": "string", "minLength": 1, "maxLength": 256, "description": "With tag_key: only instances whose tag has this value (e.g. \"prod\")."},
                    "limit": limit_property(100, "instances")
                }),
                &[],
            ),
            "inventory",
        ),
        spec(
            "ebs_inventory",
            &format!(
                "Lists EBS volumes in one or more regions: id, size (GiB), type, state, availability zone, encryption, the instance attached to. Findings: unattached volumes (state `available`, still billed) with their total GiB, and unencrypted volumes. Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "regions": regions_property("list volumes in"),
                    "only_unattached": {"type": "boolean", "description": "Only volumes not attached to any instance. Default false."},
                    "limit": limit_property(100, "volumes")
                }),
                &[],
            ),
            "inventory",
        ),
        spec(
            "cost_breakdown",
            "Reports the account's AWS spend between two dates from Cost Explorer, per day or month, grouped by a dimension (service by default; or linked account, region, usage type, instance type, purchase type) or by a cost allocation tag: for each period the total and the top groups by cost, with the currency. `end` is exclusive; the range may span at most 366 days. Needs Cost Explorer enabled on the (payer) account; if it is not, the error says so. Read-only.",
            object(
                json!({
                    "start": date_property("First day, YYYY-MM-DD (inclusive)."),
                    "end": date_property("Day after the last, YYYY-MM-DD (exclusive)."),
                    "granularity": {"enum": ["DAILY", "MONTHLY"], "description": "Default MONTHLY."},
                    "group_by": {"enum": ["SERVICE", "LINKED_ACCOUNT", "REGION", "USAGE_TYPE", "INSTANCE_TYPE", "PURCHASE_TYPE", "NONE"], "description": "Default SERVICE. NONE: totals only."},
                    "tag_key": {"type": "string", "minLength": 1, "maxLength": 128, "description": "Group by this cost allocation tag instead of group_by."},
                    "metric": {"enum": ["UnblendedCost", "BlendedCost", "AmortizedCost", "NetUnblendedCost", "NetAmortizedCost", "UsageQuantity"], "description": "Default UnblendedCost."},
                    "limit": limit_property(20, "groups per period")
                }),
                &["start", "end"],
            ),
            "cost",
        ),
        spec(
            "cost_anomalies",
            &format!(
                "Lists cost anomalies AWS Cost Anomaly Detection found between two dates: id, dates, the dimension (e.g. the service), total impact in USD with actual and expected spend, score, root causes (service, region, usage type, linked account) and feedback. Optionally one monitor, or only anomalies with at least a given impact. Needs a cost anomaly monitor on the account. Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "start": date_property("First day, YYYY-MM-DD."),
                    "end": date_property("Last day, YYYY-MM-DD (default today)."),
                    "monitor_arn": {"type": "string", "pattern": "^arn:aws[a-z-]*:ce::[0-9]{12}:anomalymonitor/.+$", "description": "Only anomalies of this monitor."},
                    "min_total_impact": {"type": "number", "minimum": 0, "description": "Only anomalies whose total impact is at least this (USD)."},
                    "limit": limit_property(50, "anomalies")
                }),
                &["start"],
            ),
            "cost",
        ),
        spec(
            "compute_optimizer_recs",
            &format!(
                "Lists AWS Compute Optimizer's EC2 rightsizing recommendations in one or more regions: instance, current type, finding (Overprovisioned, Underprovisioned, Optimized), reasons, the best recommended type and its estimated monthly savings. Needs the account opted in to Compute Optimizer; if it is not, the error says so and how to opt in. Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "regions": regions_property("read recommendations in"),
                    "findings": {"type": "array", "items": {"enum": ["Overprovisioned", "Underprovisioned", "Optimized", "NotOptimized"]}, "minItems": 1, "uniqueItems": true, "description": "Only recommendations with these findings."},
                    "limit": limit_property(50, "recommendations")
                }),
                &[],
            ),
            "cost",
        ),
        spec(
            "s3_inventory",
            &format!(
                "Lists the account's S3 buckets with their region, creation date, public access block settings, default encryption and whether a bucket policy makes it public. Findings: public access not fully blocked, no default encryption configuration, a public bucket policy. S3 is global: no regions to give. Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "prefix": {"type": "string", "minLength": 1, "maxLength": 63, "description": "Only buckets whose name starts with this."},
                    "limit": limit_property(100, "buckets")
                }),
                &[],
            ),
            "storage",
        ),
        spec(
            "iam_audit",
            &format!(
                "Audits IAM identities: for each user, console password, MFA devices and access keys with age and last use. Findings: users without MFA (high when they have a console password), access keys older than max_key_age_days (default 90), keys never used or unused for that long, an access key on the root user, root without MFA, no account password policy. IAM is global: no regions to give. Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "max_key_age_days": {"type": "integer", "minimum": 1, "maximum": 3650, "description": "Access keys older (or unused for longer) than this are findings. Default 90."},
                    "limit": limit_property(100, "users")
                }),
                &[],
            ),
            "identity",
        ),
        spec(
            "security_groups_audit",
            &format!(
                "Audits EC2 security groups in one or more regions for ingress open to the whole internet (0.0.0.0/0 or ::/0): each finding names the group, VPC, protocol and port range, high severity for all ports and for administration or database ports (22, 3389, 3306, 5432, 1433, 27017, 6379, 9200, ...). Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "regions": regions_property("audit"),
                    "limit": limit_property(200, "security groups")
                }),
                &[],
            ),
            "network",
        ),
        spec(
            "cloudtrail_coverage",
            "Checks CloudTrail logging coverage in one or more regions: the trails visible in each region (multi-region trails included), whether each is logging, multi-region, validating log files, and where it delivers. Finding per region not covered by a logging multi-region trail (or by a logging trail of its own), and trails that are not logging. Read-only.",
            object(
                json!({
                    "regions": regions_property("check")
                }),
                &[],
            ),
            "logging",
        ),
        spec(
            "nat_gateways_audit",
            &format!(
                "Lists NAT gateways in one or more regions: id, state, VPC, subnet, public or private connectivity, addresses, creation time; counts per VPC. Findings: failed gateways and VPCs with more than one available NAT gateway (each is billed per hour; one per availability zone is the usual design). Idle detection needs CloudWatch metrics and is not done. Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "regions": regions_property("list NAT gateways in"),
                    "limit": limit_property(100, "NAT gateways")
                }),
                &[],
            ),
            "network",
        ),
        spec(
            "eips_audit",
            &format!(
                "Lists Elastic IP addresses in one or more regions: public IP, allocation id, what it is associated with. Finding per unassociated address (billed while idle): release it or attach it. Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "regions": regions_property("list addresses in"),
                    "limit": limit_property(200, "addresses")
                }),
                &[],
            ),
            "network",
        ),
        spec(
            "rds_inventory",
            &format!(
                "Lists RDS database instances in one or more regions: identifier, engine and version, class, status, Multi-AZ, storage and encryption, public accessibility, backup retention. Findings: publicly accessible instances, unencrypted storage, automated backups off. Read-only. {ANSWER}"
            ),
            object(
                json!({
                    "regions": regions_property("list databases in"),
                    "limit": limit_property(100, "database instances")
                }),
                &[],
            ),
            "inventory",
        ),
    ]
}
