//! Connector tests against real parts: moto (`moto_server` on loopback, seeded through the SDK)
//! for the ten tools it serves, and loopback fakes speaking the real wire formats for Cost
//! Explorer anomalies (awsJson1_1), Compute Optimizer (rpcv2Cbor) and STS.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::{
    AgentId, Connector as _, CorrelationId, ErrorCode, InvocationContext, RunId, SecretName,
    SecretValue, Secrets, TenantId, ToolCallId, ToolError, ToolName,
};

use crate::testkit::{FakeAws, FakeRecommendation, Moto, anomaly_json, secret_json};
use crate::{AwsConfig, AwsConnector, SECRET_NAME, TOOL_ACTIONS};

fn context(tool: &str, secret: Option<&str>) -> InvocationContext {
    let mut secrets = Secrets::empty();
    if let Some(value) = secret {
        secrets.insert(
            SecretName::new(SECRET_NAME).unwrap(),
            SecretValue::new(value),
        );
    }
    InvocationContext {
        tenant: TenantId::new("acme").unwrap(),
        agent: AgentId::new("auditor").unwrap(),
        run: RunId::new("run-1").unwrap(),
        tool_call_id: ToolCallId::new("call-1").unwrap(),
        correlation_id: CorrelationId::new("corr-1").unwrap(),
        tool: ToolName::new(tool).unwrap(),
        deadline: Instant::now() + Duration::from_secs(60),
        secrets,
    }
}

async fn call(
    connector: &AwsConnector,
    secret: Option<&str>,
    tool: &str,
    arguments: Value,
) -> Result<Value, ToolError> {
    let name = ToolName::new(tool).unwrap();
    connector
        .invoke(context(tool, secret), &name, arguments)
        .await
        .map(|o| o.result)
}

async fn ok(connector: &AwsConnector, tool: &str, arguments: Value) -> Value {
    let secret = secret_json("us-east-1");
    match call(connector, Some(&secret), tool, arguments.clone()).await {
        Ok(value) => value,
        Err(err) => panic!("{tool} {arguments}: {err}"),
    }
}

fn strings(value: &Value, field: &str) -> BTreeSet<String> {
    value["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i[field].as_str().map(str::to_owned))
        .collect()
}

fn findings<'a>(value: &'a Value, kind: &str) -> Vec<&'a Value> {
    value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .collect()
}

fn finding_resources(value: &Value, kind: &str) -> BTreeSet<String> {
    findings(value, kind)
        .iter()
        .filter_map(|f| f["resource"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn every_tool_is_read_only_with_a_schema_and_its_actions() {
    let connector = AwsConnector::new(AwsConfig::default()).unwrap();
    let specs = connector.tools();
    assert_eq!(specs.len(), 12);
    assert_eq!(TOOL_ACTIONS.len(), 12);
    for spec in &specs {
        spec.validate().unwrap();
        let action = spec.name.as_str().strip_prefix("aws.").unwrap();
        let actions = TOOL_ACTIONS
            .iter()
            .find(|(a, _)| *a == action)
            .map(|(_, x)| *x)
            .unwrap_or_else(|| panic!("{action} has no actions"));
        assert!(!actions.is_empty());
        assert!(
            spec.has_tag("read_only") && !spec.has_tag("write"),
            "{}",
            spec.name
        );
        assert!(spec.idempotent, "{}", spec.name);
        assert_eq!(spec.risk, toolgate_core::RiskLevel::Low);
        assert_eq!(
            spec.required_secrets
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>(),
            vec![SECRET_NAME]
        );
        assert_eq!(
            spec.input_schema["additionalProperties"], false,
            "{}",
            spec.name
        );
        assert!(
            spec.description.len() > 120,
            "{} needs a description an LLM can choose by",
            spec.name
        );
    }
}

/// The README's IAM policy document lists exactly the actions the tools call.
#[test]
fn the_readme_policy_grants_exactly_the_tools_actions() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let start = readme
        .find("<!-- aws-iam-policy -->")
        .expect("the README marks the AWS IAM policy with <!-- aws-iam-policy -->");
    let block = &readme[start..];
    let open = block
        .find("```json\n")
        .expect("a json block follows the marker")
        + "```json\n".len();
    let close = block[open..].find("```").unwrap();
    let policy: Value = serde_json::from_str(&block[open..open + close])
        .expect("the README's policy is valid JSON");
    let granted: BTreeSet<String> = policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            s["Action"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned())
        })
        .collect();
    let needed: BTreeSet<String> = TOOL_ACTIONS
        .iter()
        .flat_map(|(_, a)| a.iter().map(|s| (*s).to_owned()))
        .collect();
    assert_eq!(granted, needed);
    for statement in policy["Statement"].as_array().unwrap() {
        assert_eq!(statement["Effect"], "Allow");
    }
}

#[tokio::test]
async fn tools_audit_the_seeded_moto_account() {
    let moto = Moto::start();
    let seeded = moto.seed_account().await;
    let connector = AwsConnector::new(moto.config()).unwrap();

    // EC2 instances: 12 in us-east-1 over three 5-item pages, each its own reservation.
    let all = ok(&connector, "aws.ec2_inventory", json!({})).await;
    assert_eq!(all["count"], 12, "{all}");
    assert_eq!(all["truncated"], false);
    assert_eq!(
        strings(&all, "instance_id"),
        seeded.instances.iter().cloned().collect()
    );
    assert_eq!(all["by_state"]["stopped"], 2, "{}", all["by_state"]);
    assert_eq!(all["by_state"]["running"], 10);
    assert_eq!(all["by_type"]["t3.micro"], 12);
    let capped = ok(&connector, "aws.ec2_inventory", json!({"limit": 7})).await;
    assert_eq!(capped["count"], 7);
    assert_eq!(capped["truncated"], true);
    let both = ok(
        &connector,
        "aws.ec2_inventory",
        json!({"regions": ["us-east-1", "eu-west-1"]}),
    )
    .await;
    assert_eq!(both["count"], 13);
    assert!(strings(&both, "instance_id").contains(&seeded.eu_instance));
    let prod = ok(
        &connector,
        "aws.ec2_inventory",
        json!({"tag_key": "Environment", "tag_value": "prod"}),
    )
    .await;
    assert_eq!(prod["count"], 6, "{prod}");
    let stopped = ok(
        &connector,
        "aws.ec2_inventory",
        json!({"states": ["stopped"]}),
    )
    .await;
    assert_eq!(
        strings(&stopped, "instance_id"),
        seeded.instances[..2].iter().cloned().collect()
    );

    // EBS: the two unattached volumes are findings; attached root volumes are not.
    let volumes = ok(&connector, "aws.ebs_inventory", json!({"limit": 1000})).await;
    assert_eq!(
        finding_resources(&volumes, "unattached_volume"),
        seeded.unattached_volumes.iter().cloned().collect()
    );
    assert_eq!(volumes["unattached_gib"], 30);
    let unattached = ok(
        &connector,
        "aws.ebs_inventory",
        json!({"only_unattached": true}),
    )
    .await;
    assert_eq!(
        strings(&unattached, "volume_id"),
        seeded.unattached_volumes.iter().cloned().collect()
    );

    // Security groups: SSH to the world is high, HTTPS over IPv6 medium, the internal rule none.
    let groups = ok(&connector, "aws.security_groups_audit", json!({})).await;
    let open = findings(&groups, "ingress_open_to_internet");
    let ssh: Vec<_> = open
        .iter()
        .filter(|f| f["resource"] == seeded.open_ssh_group.as_str())
        .collect();
    assert_eq!(ssh.len(), 1, "{groups}");
    assert_eq!(
        (
            ssh[0]["cidr"].as_str(),
            ssh[0]["ports"].as_str(),
            ssh[0]["protocol"].as_str(),
            ssh[0]["severity"].as_str()
        ),
        (Some("0.0.0.0/0"), Some("22"), Some("tcp"), Some("high"))
    );
    let web: Vec<_> = open
        .iter()
        .filter(|f| f["resource"] == seeded.open_web_v6_group.as_str())
        .collect();
    assert_eq!(web.len(), 1);
    assert_eq!(
        (
            web[0]["cidr"].as_str(),
            web[0]["ports"].as_str(),
            web[0]["severity"].as_str()
        ),
        (Some("::/0"), Some("443"), Some("medium"))
    );
    assert!(
        open.iter()
            .all(|f| f["resource"] != seeded.internal_group.as_str())
    );
    assert!(strings(&groups, "group_id").contains(&seeded.internal_group));

    // NAT gateways: two available in one VPC.
    let nat = ok(&connector, "aws.nat_gateways_audit", json!({})).await;
    assert_eq!(
        strings(&nat, "nat_gateway_id"),
        seeded.nat_gateways.iter().cloned().collect(),
        "{nat}"
    );
    assert_eq!(
        finding_resources(&nat, "several_nat_gateways_in_vpc"),
        BTreeSet::from([seeded.nat_vpc.clone()]),
        "{nat}"
    );

    // Elastic IPs: the two free ones are findings, the associated one is not.
    let eips = ok(&connector, "aws.eips_audit", json!({})).await;
    let free = finding_resources(&eips, "unassociated_address");
    for id in &seeded.free_addresses {
        assert!(free.contains(id), "{id} not found unassociated: {eips}");
    }
    assert!(!free.contains(&seeded.associated_address), "{eips}");
    assert!(strings(&eips, "allocation_id").contains(&seeded.associated_address));

    // RDS.
    let rds = ok(&connector, "aws.rds_inventory", json!({})).await;
    assert_eq!(
        strings(&rds, "db_instance_id"),
        seeded.databases.iter().cloned().collect()
    );
    assert_eq!(
        finding_resources(&rds, "publicly_accessible_database"),
        BTreeSet::from(["db-public".to_owned()])
    );
    assert_eq!(
        finding_resources(&rds, "unencrypted_database"),
        BTreeSet::from(["db-public".to_owned()])
    );
    assert_eq!(
        finding_resources(&rds, "backups_disabled"),
        BTreeSet::from(["db-nobackup".to_owned()])
    );

    // S3: regions from GetBucketLocation; the locked bucket has no finding. (moto reports new
    // buckets as unencrypted, unlike real S3: only the configured bucket's encryption is checked.)
    let s3 = ok(&connector, "aws.s3_inventory", json!({})).await;
    assert_eq!(
        strings(&s3, "name"),
        seeded.buckets.iter().cloned().collect()
    );
    let bucket = |name: &str| {
        s3["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(bucket("tg-eu")["region"], "eu-west-1");
    assert_eq!(bucket("tg-open")["region"], "us-east-1");
    assert_eq!(bucket("tg-locked")["public_access_fully_blocked"], true);
    assert_eq!(bucket("tg-locked")["default_encryption"], "AES256");
    let not_blocked = finding_resources(&s3, "public_access_not_blocked");
    assert!(
        not_blocked.contains("tg-open")
            && not_blocked.contains("tg-eu")
            && !not_blocked.contains("tg-locked"),
        "{s3}"
    );
    assert!(!finding_resources(&s3, "no_default_encryption").contains("tg-locked"));
    let prefixed = ok(&connector, "aws.s3_inventory", json!({"prefix": "tg-e"})).await;
    assert_eq!(
        strings(&prefixed, "name"),
        BTreeSet::from(["tg-eu".to_owned()])
    );

    // IAM: seven users over two 5-item pages.
    let iam = ok(&connector, "aws.iam_audit", json!({})).await;
    assert_eq!(
        strings(&iam, "user_name"),
        seeded.users.iter().cloned().collect(),
        "{iam}"
    );
    let no_mfa = findings(&iam, "user_without_mfa");
    let user0: Vec<_> = no_mfa
        .iter()
        .filter(|f| f["resource"] == "user-0")
        .collect();
    assert_eq!(user0.len(), 1);
    assert_eq!(user0[0]["severity"], "high");
    assert!(no_mfa.iter().all(|f| f["resource"] != "user-1"), "{iam}");
    assert_eq!(no_mfa.len(), 6);
    let user2 = iam["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["user_name"] == "user-2")
        .unwrap();
    let keys: BTreeSet<String> = user2["access_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["access_key_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, seeded.access_keys.iter().cloned().collect());
    assert_eq!(findings(&iam, "no_password_policy").len(), 1);
    assert!(
        findings(&iam, "access_key_too_old").is_empty(),
        "keys created now are not old"
    );
    let capped_users = ok(&connector, "aws.iam_audit", json!({"limit": 6})).await;
    assert_eq!(capped_users["count"], 6);
    assert_eq!(capped_users["truncated"], true);

    // CloudTrail: the logging multi-region trail covers us-east-1; the EU trail is not logging.
    let trails = ok(
        &connector,
        "aws.cloudtrail_coverage",
        json!({"regions": ["us-east-1", "eu-west-1"]}),
    )
    .await;
    let item = |arn: &str| {
        trails["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["arn"] == arn)
            .cloned()
    };
    let org = item(&seeded.org_trail_arn).unwrap_or_else(|| panic!("{trails}"));
    assert_eq!(
        (org["logging"].as_bool(), org["multi_region"].as_bool()),
        (Some(true), Some(true))
    );
    let eu = item(&seeded.eu_trail_arn).unwrap_or_else(|| panic!("{trails}"));
    assert_eq!(eu["logging"], false);
    assert!(finding_resources(&trails, "trail_not_logging").contains(&seeded.eu_trail_arn));
    assert!(!finding_resources(&trails, "trail_not_logging").contains(&seeded.org_trail_arn));
    let us = trails["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["region"] == "us-east-1")
        .unwrap();
    assert_eq!(us["covered_by_multi_region_trail"], true, "{trails}");
    let uncovered = ok(
        &connector,
        "aws.cloudtrail_coverage",
        json!({"regions": ["ap-south-1"]}),
    )
    .await;
    let visible_there = uncovered["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["arn"] == seeded.org_trail_arn.as_str());
    assert_eq!(
        finding_resources(&uncovered, "region_without_multi_region_trail").contains("ap-south-1"),
        !visible_there,
        "{uncovered}"
    );

    // Cost Explorer spend, from results queued in moto.
    moto.queue_cost_results(json!([{
        "ResultsByTime": [{
            "TimePeriod": {"Start": "2026-10-01", "End": "2026-11-01"},
            "Total": {},
            "Groups": [
                {"Keys": ["Amazon Simple Storage Service"], "Metrics": {"UnblendedCost": {"Amount": "3.20", "Unit": "USD"}}},
                {"Keys": ["Amazon Elastic Compute Cloud - Compute"], "Metrics": {"UnblendedCost": {"Amount": "120.50", "Unit": "USD"}}},
                {"Keys": ["AWS Lambda"], "Metrics": {"UnblendedCost": {"Amount": "45.00", "Unit": "USD"}}}
            ],
            "Estimated": false
        }],
        "DimensionValueAttributes": []
    }]))
    .await;
    let cost = ok(
        &connector,
        "aws.cost_breakdown",
        json!({"start": "2026-10-01", "end": "2026-11-01", "limit": 2}),
    )
    .await;
    let period = &cost["periods"][0];
    assert_eq!(period["start"], "2026-10-01", "{cost}");
    assert_eq!(period["group_count"], 3);
    let groups: Vec<&str> = period["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["keys"].as_str().unwrap())
        .collect();
    assert_eq!(
        groups,
        ["Amazon Elastic Compute Cloud - Compute", "AWS Lambda"]
    );
    assert_eq!(period["groups"][0]["amount"], 120.5);
    assert_eq!(cost["truncated"], true);
}

#[tokio::test]
async fn a_role_is_assumed_through_moto_and_its_session_reused() {
    let moto = Moto::start();
    let connector = AwsConnector::new(moto.config()).unwrap();
    let secret = json!({
        "access_key_id": crate::testkit::TEST_ACCESS_KEY,
        "secret_access_key": crate::testkit::TEST_SECRET_KEY,
        "region": "us-east-1",
        "role_arn": "arn:aws:iam::123456789012:role/toolgate-audit",
        "external_id": "acme-external-7"
    })
    .to_string();
    for _ in 0..2 {
        let value = call(&connector, Some(&secret), "aws.eips_audit", json!({}))
            .await
            .unwrap();
        assert_eq!(value["count"], 0);
    }
    assert_eq!(
        connector.assume_role_requests(),
        1,
        "the role session is cached"
    );
    // Another tool needs other actions: a session with its own policy.
    call(&connector, Some(&secret), "aws.rds_inventory", json!({}))
        .await
        .unwrap();
    assert_eq!(connector.assume_role_requests(), 2);
}

#[tokio::test]
async fn an_assumed_role_is_narrowed_to_the_tools_actions_and_signs_the_calls() {
    let fake = FakeAws::start().await;
    fake.sts_and_addresses("ASIAFAKEASSUMEDKEY01").await;
    let connector = AwsConnector::new(fake.config()).unwrap();
    let secret = json!({
        "access_key_id": crate::testkit::TEST_ACCESS_KEY,
        "secret_access_key": crate::testkit::TEST_SECRET_KEY,
        "role_arn": "arn:aws:iam::123456789012:role/toolgate-audit",
        "external_id": "acme-external-7"
    })
    .to_string();
    let value = call(
        &connector,
        Some(&secret),
        "aws.eips_audit",
        json!({"regions": ["eu-west-1"]}),
    )
    .await
    .unwrap();
    assert_eq!(
        finding_resources(&value, "unassociated_address"),
        BTreeSet::from(["eipalloc-0fake".to_owned()])
    );
    let requests = fake.requests().await;
    let sts: Vec<_> = requests
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("Action=AssumeRole"))
        .collect();
    assert_eq!(sts.len(), 1);
    let form: Vec<(String, String)> = url_decode_form(&String::from_utf8_lossy(&sts[0].body));
    let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(
        field("RoleArn").as_deref(),
        Some("arn:aws:iam::123456789012:role/toolgate-audit")
    );
    assert_eq!(field("ExternalId").as_deref(), Some("acme-external-7"));
    assert_eq!(field("RoleSessionName").as_deref(), Some("toolgate-acme"));
    let policy: Value = serde_json::from_str(&field("Policy").expect("a session policy")).unwrap();
    assert_eq!(
        policy["Statement"][0]["Action"],
        json!(["ec2:DescribeAddresses"])
    );
    let sts_auth = sts[0]
        .headers
        .get("authorization")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        sts_auth.contains("Credential=AKIAIOSFODNN7EXAMPLE/"),
        "{sts_auth}"
    );
    let ec2: Vec<_> = requests
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("Action=DescribeAddresses"))
        .collect();
    assert_eq!(ec2.len(), 1);
    let auth = ec2[0]
        .headers
        .get("authorization")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        auth.contains("Credential=ASIAFAKEASSUMEDKEY01/") && auth.contains("/eu-west-1/ec2/"),
        "{auth}"
    );
    assert!(ec2[0].headers.get("x-amz-security-token").is_some());
}

fn url_decode_form(body: &str) -> Vec<(String, String)> {
    body.split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 3 <= bytes.len() => {
                out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn cost_anomalies_follow_pages_from_the_awsjson_fake() {
    let fake = FakeAws::start().await;
    fake.anomalies(vec![
        vec![
            anomaly_json("a-1", "Amazon EC2", 250.0),
            anomaly_json("a-2", "AWS Lambda", 40.0),
            anomaly_json("a-3", "Amazon S3", 12.5),
        ],
        vec![
            anomaly_json("a-4", "Amazon RDS", 90.0),
            anomaly_json("a-5", "Amazon EC2", 7.5),
        ],
    ])
    .await;
    let connector = AwsConnector::new(fake.config()).unwrap();
    let value = ok(
        &connector,
        "aws.cost_anomalies",
        json!({"start": "2026-11-01", "end": "2026-11-30"}),
    )
    .await;
    assert_eq!(value["count"], 5, "{value}");
    assert_eq!(value["truncated"], false);
    assert_eq!(value["total_impact_usd"], 400.0);
    let first = &value["items"][0];
    assert_eq!(first["anomaly_id"], "a-1");
    assert_eq!(first["dimension_value"], "Amazon EC2");
    assert_eq!(first["root_causes"][0]["usage_type"], "BoxUsage:m5.4xlarge");
    assert_eq!(first["feedback"], "YES");
    let requests = fake.requests().await;
    assert_eq!(requests.len(), 2);
    let second: Value = serde_json::from_slice(&requests[1].body).unwrap();
    assert_eq!(second["NextPageToken"], "page-2");
    assert_eq!(
        second["DateInterval"],
        json!({"StartDate": "2026-11-01", "EndDate": "2026-11-30"})
    );
    let capped = ok(
        &connector,
        "aws.cost_anomalies",
        json!({"start": "2026-11-01", "limit": 4}),
    )
    .await;
    assert_eq!(capped["count"], 4);
    assert_eq!(capped["truncated"], true);
}

#[tokio::test]
async fn cost_explorer_refusals_become_explainable_failures() {
    let fake = FakeAws::start().await;
    fake.cost_explorer_not_enabled().await;
    let connector = AwsConnector::new(fake.config()).unwrap();
    let secret = secret_json("us-east-1");
    let err = call(
        &connector,
        Some(&secret),
        "aws.cost_breakdown",
        json!({"start": "2026-10-01", "end": "2026-11-01"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::VendorError);
    assert!(
        err.message.contains("has not enabled Cost Explorer"),
        "{err}"
    );
    let err = call(
        &connector,
        Some(&secret),
        "aws.cost_anomalies",
        json!({"start": "2026-10-01"}),
    )
    .await
    .unwrap_err();
    assert!(
        err.message.contains("has not enabled Cost Explorer"),
        "{err}"
    );

    let throttled = FakeAws::start().await;
    throttled.cost_explorer_throttled().await;
    let connector = AwsConnector::new(throttled.config()).unwrap();
    let err = call(
        &connector,
        Some(&secret),
        "aws.cost_anomalies",
        json!({"start": "2026-10-01"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::VendorRateLimited, "{err}");
}

fn recommendation(n: u32, finding: &str, savings: f64) -> FakeRecommendation {
    FakeRecommendation {
        instance_arn: format!("arn:aws:ec2:us-east-1:123456789012:instance/i-0{n:015}"),
        instance_name: format!("batch-{n}"),
        current_type: "m5.4xlarge".into(),
        finding: finding.into(),
        recommended_type: "m5.xlarge".into(),
        monthly_savings: savings,
    }
}

#[tokio::test]
async fn compute_optimizer_recommendations_come_from_the_cbor_fake() {
    let fake = FakeAws::start().await;
    fake.recommendations(vec![
        vec![
            recommendation(1, "Overprovisioned", 210.0),
            recommendation(2, "Optimized", 0.0),
        ],
        vec![recommendation(3, "Overprovisioned", 90.0)],
    ])
    .await;
    let connector = AwsConnector::new(fake.config()).unwrap();
    let value = ok(&connector, "aws.compute_optimizer_recs", json!({})).await;
    assert_eq!(value["count"], 3, "{value}");
    let first = &value["items"][0];
    assert_eq!(first["instance_name"], "batch-1");
    assert_eq!(first["finding"], "Overprovisioned");
    assert_eq!(first["current_instance_type"], "m5.4xlarge");
    assert_eq!(
        first["recommended_instance_type"], "m5.xlarge",
        "the rank-1 option"
    );
    assert_eq!(
        first["estimated_monthly_savings"],
        json!({"amount": 210.0, "currency": "USD"})
    );
    assert_eq!(first["reasons"], json!(["CPUOverprovisioned"]));
    assert_eq!(value["estimated_monthly_savings_total"], 300.0);
    let over = ok(
        &connector,
        "aws.compute_optimizer_recs",
        json!({"findings": ["Overprovisioned"], "regions": ["us-east-1", "eu-west-1"]}),
    )
    .await;
    assert_eq!(
        over["count"], 4,
        "two regions, two overprovisioned each: {over}"
    );
    let requests = fake.requests().await;
    assert!(requests.iter().all(|r| r.url.path()
        == "/service/ComputeOptimizerService/operation/GetEC2InstanceRecommendations"));
    assert!(requests.iter().all(|r| {
        r.headers
            .get("smithy-protocol")
            .is_some_and(|v| v == "rpc-v2-cbor")
    }));

    let not_enrolled = FakeAws::start().await;
    not_enrolled.compute_optimizer_not_enrolled().await;
    let connector = AwsConnector::new(not_enrolled.config()).unwrap();
    let secret = secret_json("us-east-1");
    let err = call(
        &connector,
        Some(&secret),
        "aws.compute_optimizer_recs",
        json!({}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::VendorError);
    assert!(
        err.message.contains("has not enabled Compute Optimizer"),
        "{err}"
    );
    // With several regions every one fails the same way: the call fails, naming a region.
    let err = call(
        &connector,
        Some(&secret),
        "aws.compute_optimizer_recs",
        json!({"regions": ["us-west-2", "eu-west-1"]}),
    )
    .await
    .unwrap_err();
    assert!(
        err.message.starts_with("us-west-2: ") && err.message.contains("Compute Optimizer"),
        "{err}"
    );
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let fake = FakeAws::start().await;
    let connector = AwsConnector::new(fake.config()).unwrap();
    let good = secret_json("us-east-1");
    let role = |arn: &str| {
        json!({"access_key_id": crate::testkit::TEST_ACCESS_KEY, "secret_access_key": "s3cr3t", "role_arn": arn}).to_string()
    };
    let cases: Vec<(Option<String>, &str, Value, ErrorCode, &str)> = vec![
        (None, "aws.ec2_inventory", json!({}), ErrorCode::CredentialsNotFound, "no `aws_default` secret"),
        (Some("AKIAIOSFODNN7EXAMPLE:secret".into()), "aws.ec2_inventory", json!({}), ErrorCode::CredentialsUnavailable, "not a JSON object"),
        (Some(role("arn:aws:iam::123:role/x")), "aws.ec2_inventory", json!({}), ErrorCode::CredentialsUnavailable, "not an IAM role ARN"),
        (Some(json!({"access_key_id": crate::testkit::TEST_ACCESS_KEY, "secret_access_key": "x", "endpoint_url": "http://127.0.0.1:1"}).to_string()), "aws.ec2_inventory", json!({}), ErrorCode::CredentialsUnavailable, "set by the gateway's operator"),
        (Some(good.clone()), "aws.ec2_inventory", json!({"regions": ["us-east-9"]}), ErrorCode::InvalidArguments, "did you mean `us-east-1`"),
        (Some(good.clone()), "aws.ec2_inventory", json!({"regions": ["us-east-1", "us-east-1"]}), ErrorCode::InvalidArguments, "twice"),
        (Some(good.clone()), "aws.ec2_inventory", json!({"regions": []}), ErrorCode::InvalidArguments, "1 to 40"),
        (Some(good.clone()), "aws.ec2_inventory", json!({"limit": 0}), ErrorCode::InvalidArguments, "`limit` must be an integer from 1 to 1000"),
        (Some(good.clone()), "aws.rds_inventory", json!({"limit": 5000}), ErrorCode::InvalidArguments, "`limit`"),
        (Some(good.clone()), "aws.ec2_inventory", json!({"states": ["exploded"]}), ErrorCode::InvalidArguments, "`states`"),
        (Some(good.clone()), "aws.ec2_inventory", json!({"tag_value": "prod"}), ErrorCode::InvalidArguments, "needs `tag_key`"),
        (Some(good.clone()), "aws.cost_breakdown", json!({"start": "2026-02-30", "end": "2026-03-01"}), ErrorCode::InvalidArguments, "real date"),
        (Some(good.clone()), "aws.cost_breakdown", json!({"start": "2026-03-01", "end": "2026-03-01"}), ErrorCode::InvalidArguments, "after `start`"),
        (Some(good.clone()), "aws.cost_breakdown", json!({"start": "2024-01-01", "end": "2026-01-01"}), ErrorCode::InvalidArguments, "at most 366"),
        (Some(good.clone()), "aws.cost_breakdown", json!({"start": "2026-01-01", "end": "2026-02-01", "group_by": "COLOR"}), ErrorCode::InvalidArguments, "`group_by`"),
        (Some(good.clone()), "aws.cost_anomalies", json!({"start": "2026-01-01", "monitor_arn": "arn:aws:s3:::x"}), ErrorCode::InvalidArguments, "monitor ARN"),
        (Some(good.clone()), "aws.iam_audit", json!({"max_key_age_days": 0}), ErrorCode::InvalidArguments, "`max_key_age_days`"),
        (Some(good.clone()), "aws.compute_optimizer_recs", json!({"findings": ["Great"]}), ErrorCode::InvalidArguments, "`findings`"),
    ];
    for (secret, tool, arguments, code, message) in cases {
        let err = call(&connector, secret.as_deref(), tool, arguments.clone())
            .await
            .unwrap_err();
        assert_eq!(err.code, code, "{tool} {arguments}: {err}");
        assert!(err.message.contains(message), "{tool} {arguments}: {err}");
        assert!(!err.message.contains("s3cr3t"));
    }
    assert!(
        fake.requests().await.is_empty(),
        "a refused call sent a request"
    );
}

#[tokio::test]
async fn a_call_never_outlives_its_deadline() {
    // A listener that accepts and never answers: the SDK's operation timeout is the deadline.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let _hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let connector = AwsConnector::new(AwsConfig {
        endpoint_url: Some(format!("http://{address}")),
        ..AwsConfig::default()
    })
    .unwrap();
    let mut ctx = context("aws.eips_audit", Some(&secret_json("us-east-1")));
    ctx.deadline = Instant::now() + Duration::from_millis(700);
    let started = Instant::now();
    let err = connector
        .invoke(ctx, &ToolName::new("aws.eips_audit").unwrap(), json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}
