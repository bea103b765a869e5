//! Test helpers (feature `testkit`, never in a production build):
//!
//! - [`Moto`]: the AWS emulator moto (`moto_server`), started on a loopback port and killed on
//!   drop; [`Moto::seed_account`] fills it with the resources the audit tools look at, through
//!   the SDK's own write operations;
//! - [`FakeAws`]: a wiremock server answering the two services moto does not serve in their
//!   real wire formats: Cost Explorer `GetAnomalies` (awsJson1_1) and Compute Optimizer
//!   `GetEC2InstanceRecommendations` (rpcv2Cbor), their refusals (`OptInRequiredException`,
//!   Cost Explorer's "not enabled" denial), and `sts:AssumeRole` / `ec2:DescribeAddresses`
//!   (awsQuery / ec2Query XML) to observe what an assumed role signs with.
//!
//! `moto_server` is found through [`MOTO_ENV`]; `cargo xtask ci` installs moto into its
//! Python environment under `target/` and sets it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_smithy_cbor::Encoder;
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Match, Mock, MockServer, Request, ResponseTemplate};

use crate::config::AwsConfig;

/// The variable naming the `moto_server` executable.
pub const MOTO_ENV: &str = "TOOLGATE_TEST_MOTO_SERVER";

/// Static credentials for tests (moto accepts any).
pub const TEST_ACCESS_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
/// The secret key matching [`TEST_ACCESS_KEY`].
pub const TEST_SECRET_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

/// The tenant secret for the test keys in `region`.
pub fn secret_json(region: &str) -> String {
    json!({"access_key_id": TEST_ACCESS_KEY, "secret_access_key": TEST_SECRET_KEY, "region": region}).to_string()
}

/// A running `moto_server` on 127.0.0.1; killed when dropped.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    port: u16,
}

fn moto_binary() -> PathBuf {
    let how = "moto is installed by the project's test command: run `cargo xtask ci` (it creates target/py/venv with moto and sets TOOLGATE_TEST_MOTO_SERVER), or install it yourself (`python3 -m venv target/py/venv && target/py/venv/bin/pip install moto==5.2.5 flask flask-cors`) and set TOOLGATE_TEST_MOTO_SERVER=$PWD/target/py/venv/bin/moto_server";
    let Some(path) = std::env::var_os(MOTO_ENV).filter(|p| !p.is_empty()) else {
        panic!(
            "\n\n==================== moto NOT AVAILABLE ====================\nthis test needs the AWS emulator moto: {MOTO_ENV} is not set.\n{how}\n============================================================\n"
        );
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "\n\n==================== moto NOT AVAILABLE ====================\n{MOTO_ENV} names {}, which does not exist.\n{how}\n============================================================\n",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

impl Moto {
    /// Starts `moto_server -H 127.0.0.1 -p PORT` and waits until it answers.
    pub fn start() -> Moto {
        let binary = moto_binary();
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(&binary)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env("AWS_ACCESS_KEY_ID", "testing")
                .env("AWS_SECRET_ACCESS_KEY", "testing")
                .env("AWS_DEFAULT_REGION", "us-east-1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(60) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Moto { child, port };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "moto_server ({}) did not start listening on loopback within 60 s",
            binary.display()
        );
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A connector configuration pointing at this moto, with 5-item pages so pagination is
    /// exercised with few resources.
    pub fn config(&self) -> AwsConfig {
        AwsConfig {
            endpoint_url: Some(self.endpoint_url()),
            page_size: 5,
            ..AwsConfig::default()
        }
    }

    /// Queues Cost Explorer `GetCostAndUsage` results (each new distinct request pops one).
    pub async fn queue_cost_results(&self, results: Value) {
        let body = json!({"results": results}).to_string();
        let status = http_post(
            self.port,
            "/moto-api/static/ce/cost-and-usage-results",
            &body,
        )
        .await;
        assert!(
            status == 201 || status == 200,
            "moto refused the Cost Explorer results: HTTP {status}"
        );
    }

    /// Seeds the account (see [`Seeded`]).
    pub async fn seed_account(&self) -> Seeded {
        seed(&self.endpoint_url()).await
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.1 POST on loopback; answers the status code.
async fn http_post(port: u16, path: &str, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to moto");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write to moto");
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .expect("read from moto");
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// What [`Moto::seed_account`] created.
#[derive(Debug, Clone, Default)]
pub struct Seeded {
    /// us-east-1 instances (12, each its own reservation; `web-0`..`web-11`; 0 and 1 stopped,
    /// the even ones tagged Environment=prod).
    pub instances: Vec<String>,
    /// The eu-west-1 instance.
    pub eu_instance: String,
    /// Volumes created unattached in us-east-1 (10 GiB and 20 GiB).
    pub unattached_volumes: Vec<String>,
    /// `open-ssh` (22 from 0.0.0.0/0), `open-web-v6` (443 from ::/0), `internal-db` (5432
    /// from 10.0.0.0/8).
    pub open_ssh_group: String,
    /// See `open_ssh_group`.
    pub open_web_v6_group: String,
    /// See `open_ssh_group`.
    pub internal_group: String,
    /// Buckets: `tg-open` (nothing configured), `tg-locked` (all four blocks, AES256),
    /// `tg-eu` in eu-west-1 (nothing configured), `tg-trail-logs`.
    pub buckets: Vec<String>,
    /// IAM users `user-0`..`user-6`; `user-0` has a console password and no MFA, `user-1` an
    /// enabled MFA device, `user-2` two access keys.
    pub users: Vec<String>,
    /// The access keys created (user-2's two).
    pub access_keys: Vec<String>,
    /// `org-trail`: multi-region, home us-east-1, logging.
    pub org_trail_arn: String,
    /// `eu-local`: single-region in eu-west-1, not logging.
    pub eu_trail_arn: String,
    /// Two NAT gateways in one VPC of us-east-1.
    pub nat_gateways: Vec<String>,
    /// The NAT gateways' VPC.
    pub nat_vpc: String,
    /// Elastic IPs allocated and left unassociated.
    pub free_addresses: Vec<String>,
    /// The Elastic IP associated with `instances[2]`.
    pub associated_address: String,
    /// RDS instances: `db-public` (publicly accessible, unencrypted), `db-private`
    /// (encrypted), `db-nobackup` (backup retention 0).
    pub databases: Vec<String>,
}

macro_rules! seed_client {
    ($krate:ident, $endpoint:expr, $region:expr) => {{
        let credentials = aws_credential_types::Credentials::new(
            TEST_ACCESS_KEY,
            TEST_SECRET_KEY,
            None,
            None,
            "testkit",
        );
        let config = $krate::config::Builder::new()
            .behavior_version($krate::config::BehaviorVersion::latest())
            .region($krate::config::Region::new($region))
            .credentials_provider(credentials)
            .endpoint_url($endpoint)
            .build();
        $krate::Client::from_conf(config)
    }};
}

async fn seed(endpoint: &str) -> Seeded {
    let mut seeded = Seeded::default();
    seed_ec2(endpoint, &mut seeded).await;
    seed_s3(endpoint, &mut seeded).await;
    seed_iam(endpoint, &mut seeded).await;
    seed_cloudtrail(endpoint, &mut seeded).await;
    seed_rds(endpoint, &mut seeded).await;
    seeded
}

async fn first_image(ec2: &aws_sdk_ec2::Client) -> String {
    let images = ec2
        .describe_images()
        .owners("amazon")
        .send()
        .await
        .expect("describe moto's images");
    images
        .images()
        .iter()
        .find_map(|i| i.image_id())
        .expect("moto ships images")
        .to_owned()
}

async fn run_instance(ec2: &aws_sdk_ec2::Client, image: &str, name: &str, prod: bool) -> String {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let mut tags = TagSpecification::builder()
        .resource_type(ResourceType::Instance)
        .tags(Tag::builder().key("Name").value(name).build());
    if prod {
        tags = tags.tags(Tag::builder().key("Environment").value("prod").build());
    }
    let output = ec2
        .run_instances()
        .image_id(image)
        .instance_type(aws_sdk_ec2::types::InstanceType::T3Micro)
        .min_count(1)
        .max_count(1)
        .tag_specifications(tags.build())
        .send()
        .await
        .expect("RunInstances on moto");
    output.instances()[0]
        .instance_id()
        .expect("instance id")
        .to_owned()
}

async fn seed_ec2(endpoint: &str, seeded: &mut Seeded) {
    use aws_sdk_ec2::types::{IpPermission, IpRange, Ipv6Range, VolumeType};
    let ec2 = seed_client!(aws_sdk_ec2, endpoint, "us-east-1");
    let image = first_image(&ec2).await;
    for i in 0..12 {
        seeded
            .instances
            .push(run_instance(&ec2, &image, &format!("web-{i}"), i % 2 == 0).await);
    }
    ec2.stop_instances()
        .instance_ids(&seeded.instances[0])
        .instance_ids(&seeded.instances[1])
        .send()
        .await
        .expect("StopInstances on moto");
    let eu = seed_client!(aws_sdk_ec2, endpoint, "eu-west-1");
    let eu_image = first_image(&eu).await;
    seeded.eu_instance = run_instance(&eu, &eu_image, "eu-web", false).await;
    for size in [10, 20] {
        let volume = ec2
            .create_volume()
            .availability_zone("us-east-1a")
            .size(size)
            .volume_type(VolumeType::Gp3)
            .send()
            .await
            .expect("CreateVolume on moto");
        seeded
            .unattached_volumes
            .push(volume.volume_id().expect("volume id").to_owned());
    }
    let vpc = ec2
        .create_vpc()
        .cidr_block("10.20.0.0/16")
        .send()
        .await
        .expect("CreateVpc");
    let vpc_id = vpc
        .vpc()
        .and_then(|v| v.vpc_id())
        .expect("vpc id")
        .to_owned();
    let groups = [
        (
            "open-ssh",
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(22)
                .to_port(22)
                .ip_ranges(IpRange::builder().cidr_ip("0.0.0.0/0").build())
                .build(),
        ),
        (
            "open-web-v6",
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(443)
                .to_port(443)
                .ipv6_ranges(Ipv6Range::builder().cidr_ipv6("::/0").build())
                .build(),
        ),
        (
            "internal-db",
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(5432)
                .to_port(5432)
                .ip_ranges(IpRange::builder().cidr_ip("10.0.0.0/8").build())
                .build(),
        ),
    ];
    for (name, permission) in groups {
        let group = ec2
            .create_security_group()
            .group_name(name)
            .description(format!("{name} for the audit"))
            .vpc_id(&vpc_id)
            .send()
            .await
            .expect("CreateSecurityGroup");
        let id = group.group_id().expect("group id").to_owned();
        ec2.authorize_security_group_ingress()
            .group_id(&id)
            .ip_permissions(permission)
            .send()
            .await
            .expect("AuthorizeSecurityGroupIngress");
        match name {
            "open-ssh" => seeded.open_ssh_group = id,
            "open-web-v6" => seeded.open_web_v6_group = id,
            _ => seeded.internal_group = id,
        }
    }
    let subnet = ec2
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block("10.20.1.0/24")
        .availability_zone("us-east-1a")
        .send()
        .await
        .expect("CreateSubnet");
    let subnet_id = subnet
        .subnet()
        .and_then(|s| s.subnet_id())
        .expect("subnet id")
        .to_owned();
    for _ in 0..2 {
        let address = ec2
            .allocate_address()
            .domain(aws_sdk_ec2::types::DomainType::Vpc)
            .send()
            .await
            .expect("AllocateAddress");
        let nat = ec2
            .create_nat_gateway()
            .subnet_id(&subnet_id)
            .allocation_id(address.allocation_id().expect("allocation id"))
            .send()
            .await
            .expect("CreateNatGateway");
        seeded.nat_gateways.push(
            nat.nat_gateway()
                .and_then(|n| n.nat_gateway_id())
                .expect("nat id")
                .to_owned(),
        );
    }
    seeded.nat_vpc = vpc_id;
    // Addresses are listed after the NAT ones; those are associated with the gateways.
    let associated = ec2
        .allocate_address()
        .domain(aws_sdk_ec2::types::DomainType::Vpc)
        .send()
        .await
        .expect("AllocateAddress");
    let allocation = associated
        .allocation_id()
        .expect("allocation id")
        .to_owned();
    ec2.associate_address()
        .allocation_id(&allocation)
        .instance_id(&seeded.instances[2])
        .send()
        .await
        .expect("AssociateAddress");
    seeded.associated_address = allocation;
    for _ in 0..2 {
        let free = ec2
            .allocate_address()
            .domain(aws_sdk_ec2::types::DomainType::Vpc)
            .send()
            .await
            .expect("AllocateAddress");
        seeded
            .free_addresses
            .push(free.allocation_id().expect("allocation id").to_owned());
    }
}

async fn seed_s3(endpoint: &str, seeded: &mut Seeded) {
    use aws_sdk_s3::types::{
        BucketLocationConstraint, CreateBucketConfiguration, PublicAccessBlockConfiguration,
        ServerSideEncryption, ServerSideEncryptionByDefault, ServerSideEncryptionConfiguration,
        ServerSideEncryptionRule,
    };
    let credentials = aws_credential_types::Credentials::new(
        TEST_ACCESS_KEY,
        TEST_SECRET_KEY,
        None,
        None,
        "testkit",
    );
    let client = |region: &'static str| {
        let config = aws_sdk_s3::config::Builder::new()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new(region))
            .credentials_provider(credentials.clone())
            .endpoint_url(endpoint)
            .force_path_style(true)
            .build();
        aws_sdk_s3::Client::from_conf(config)
    };
    let s3 = client("us-east-1");
    for name in ["tg-open", "tg-locked", "tg-trail-logs"] {
        s3.create_bucket()
            .bucket(name)
            .send()
            .await
            .expect("CreateBucket");
        seeded.buckets.push(name.to_owned());
    }
    s3.put_public_access_block()
        .bucket("tg-locked")
        .public_access_block_configuration(
            PublicAccessBlockConfiguration::builder()
                .block_public_acls(true)
                .ignore_public_acls(true)
                .block_public_policy(true)
                .restrict_public_buckets(true)
                .build(),
        )
        .send()
        .await
        .expect("PutPublicAccessBlock");
    let rule = ServerSideEncryptionRule::builder()
        .apply_server_side_encryption_by_default(
            ServerSideEncryptionByDefault::builder()
                .sse_algorithm(ServerSideEncryption::Aes256)
                .build()
                .expect("sse default"),
        )
        .build();
    s3.put_bucket_encryption()
        .bucket("tg-locked")
        .server_side_encryption_configuration(
            ServerSideEncryptionConfiguration::builder()
                .rules(rule)
                .build()
                .expect("sse config"),
        )
        .send()
        .await
        .expect("PutBucketEncryption");
    let eu = client("eu-west-1");
    eu.create_bucket()
        .bucket("tg-eu")
        .create_bucket_configuration(
            CreateBucketConfiguration::builder()
                .location_constraint(BucketLocationConstraint::EuWest1)
                .build(),
        )
        .send()
        .await
        .expect("CreateBucket in eu-west-1");
    seeded.buckets.push("tg-eu".to_owned());
}

async fn seed_iam(endpoint: &str, seeded: &mut Seeded) {
    let iam = seed_client!(aws_sdk_iam, endpoint, "us-east-1");
    for i in 0..7 {
        let name = format!("user-{i}");
        iam.create_user()
            .user_name(&name)
            .send()
            .await
            .expect("CreateUser");
        seeded.users.push(name);
    }
    iam.create_login_profile()
        .user_name("user-0")
        .password("Correct-Horse-9")
        .send()
        .await
        .expect("CreateLoginProfile");
    let device = iam
        .create_virtual_mfa_device()
        .virtual_mfa_device_name("user-1-mfa")
        .send()
        .await
        .expect("CreateVirtualMFADevice");
    let serial = device
        .virtual_mfa_device()
        .map(|d| d.serial_number().to_owned())
        .expect("serial");
    iam.enable_mfa_device()
        .user_name("user-1")
        .serial_number(serial)
        .authentication_code1("123456")
        .authentication_code2("654321")
        .send()
        .await
        .expect("EnableMFADevice");
    for _ in 0..2 {
        let key = iam
            .create_access_key()
            .user_name("user-2")
            .send()
            .await
            .expect("CreateAccessKey");
        seeded.access_keys.push(
            key.access_key()
                .map(|k| k.access_key_id().to_owned())
                .expect("key id"),
        );
    }
}

async fn seed_cloudtrail(endpoint: &str, seeded: &mut Seeded) {
    let us = seed_client!(aws_sdk_cloudtrail, endpoint, "us-east-1");
    let trail = us
        .create_trail()
        .name("org-trail")
        .s3_bucket_name("tg-trail-logs")
        .is_multi_region_trail(true)
        .enable_log_file_validation(true)
        .send()
        .await
        .expect("CreateTrail");
    seeded.org_trail_arn = trail.trail_arn().expect("trail arn").to_owned();
    us.start_logging()
        .name("org-trail")
        .send()
        .await
        .expect("StartLogging");
    let eu = seed_client!(aws_sdk_cloudtrail, endpoint, "eu-west-1");
    let local = eu
        .create_trail()
        .name("eu-local")
        .s3_bucket_name("tg-trail-logs")
        .send()
        .await
        .expect("CreateTrail eu");
    seeded.eu_trail_arn = local.trail_arn().expect("trail arn").to_owned();
}

async fn seed_rds(endpoint: &str, seeded: &mut Seeded) {
    let rds = seed_client!(aws_sdk_rds, endpoint, "us-east-1");
    for (name, public, encrypted, backups) in [
        ("db-public", true, false, 7),
        ("db-private", false, true, 7),
        ("db-nobackup", false, true, 0),
    ] {
        rds.create_db_instance()
            .db_instance_identifier(name)
            .engine("postgres")
            .db_instance_class("db.t3.micro")
            .allocated_storage(20)
            .master_username("admin")
            .master_user_password("Correct-Horse-9")
            .publicly_accessible(public)
            .storage_encrypted(encrypted)
            .backup_retention_period(backups)
            .send()
            .await
            .expect("CreateDBInstance");
        seeded.databases.push(name.to_owned());
    }
}

/// Matches requests whose JSON body lacks `field` (a first page: no `NextPageToken`).
#[derive(Debug)]
struct BodyLacks(&'static str);

impl Match for BodyLacks {
    fn matches(&self, request: &Request) -> bool {
        serde_json::from_slice::<Value>(&request.body).is_ok_and(|v| v.get(self.0).is_none())
    }
}

/// Matches requests whose JSON body has `field` equal to `value`.
#[derive(Debug)]
struct BodyField(&'static str, String);

impl Match for BodyField {
    fn matches(&self, request: &Request) -> bool {
        serde_json::from_slice::<Value>(&request.body)
            .is_ok_and(|v| v.get(self.0).and_then(Value::as_str) == Some(self.1.as_str()))
    }
}

/// Matches CBOR requests whose body contains the text `needle` (CBOR strings are raw UTF-8).
#[derive(Debug)]
struct BodyBytesContain(Vec<u8>);

impl Match for BodyBytesContain {
    fn matches(&self, request: &Request) -> bool {
        request
            .body
            .windows(self.0.len())
            .any(|w| w == self.0.as_slice())
    }
}

#[derive(Debug)]
struct BodyBytesLack(Vec<u8>);

impl Match for BodyBytesLack {
    fn matches(&self, request: &Request) -> bool {
        !request
            .body
            .windows(self.0.len())
            .any(|w| w == self.0.as_slice())
    }
}

/// A fake of the AWS services moto does not serve, on loopback.
#[derive(Debug)]
pub struct FakeAws {
    server: MockServer,
}

/// The monitor every fake anomaly belongs to.
pub const FAKE_MONITOR_ARN: &str =
    "arn:aws:ce::123456789012:anomalymonitor/0a1b2c3d-1111-2222-3333-444455556666";

/// One anomaly in Cost Explorer's JSON shape.
pub fn anomaly_json(id: &str, service: &str, total_impact: f64) -> Value {
    json!({
        "AnomalyId": id,
        "AnomalyStartDate": "2026-11-03",
        "AnomalyEndDate": "2026-11-05",
        "DimensionValue": service,
        "RootCauses": [{"Service": service, "Region": "us-east-1", "LinkedAccount": "123456789012", "UsageType": "BoxUsage:m5.4xlarge"}],
        "AnomalyScore": {"MaxScore": 0.92, "CurrentScore": 0.4},
        "Impact": {"MaxImpact": total_impact / 2.0, "TotalImpact": total_impact, "TotalActualSpend": total_impact + 100.0, "TotalExpectedSpend": 100.0, "TotalImpactPercentage": total_impact},
        "MonitorArn": FAKE_MONITOR_ARN,
        "Feedback": "YES"
    })
}

/// One Compute Optimizer recommendation, for [`FakeAws::recommendations`].
#[derive(Debug, Clone)]
pub struct FakeRecommendation {
    /// e.g. `arn:aws:ec2:us-east-1:123456789012:instance/i-0abc`.
    pub instance_arn: String,
    /// The Name tag.
    pub instance_name: String,
    /// e.g. `m5.4xlarge`.
    pub current_type: String,
    /// `Overprovisioned`, `Underprovisioned`, `Optimized`.
    pub finding: String,
    /// The rank-1 option.
    pub recommended_type: String,
    /// USD per month.
    pub monthly_savings: f64,
}

fn recommendations_cbor(
    recommendations: &[FakeRecommendation],
    next_token: Option<&str>,
) -> Vec<u8> {
    let mut encoder = Encoder::new(Vec::new());
    encoder.map(if next_token.is_some() { 2 } else { 1 });
    encoder
        .str("instanceRecommendations")
        .array(recommendations.len());
    for r in recommendations {
        encoder.map(7);
        encoder.str("instanceArn").str(&r.instance_arn);
        encoder.str("accountId").str("123456789012");
        encoder.str("instanceName").str(&r.instance_name);
        encoder.str("currentInstanceType").str(&r.current_type);
        encoder.str("finding").str(&r.finding);
        encoder
            .str("findingReasonCodes")
            .array(1)
            .str("CPUOverprovisioned");
        encoder.str("recommendationOptions").array(2);
        // A worse option first: the connector must pick by rank, not by position.
        encoder.map(3);
        encoder.str("instanceType").str("c5.xlarge");
        encoder.str("rank").integer(2);
        encoder.str("savingsOpportunity").map(2);
        encoder.str("savingsOpportunityPercentage").double(10.0);
        encoder
            .str("estimatedMonthlySavings")
            .map(2)
            .str("currency")
            .str("USD")
            .str("value")
            .double(r.monthly_savings / 4.0);
        encoder.map(3);
        encoder.str("instanceType").str(&r.recommended_type);
        encoder.str("rank").integer(1);
        encoder.str("savingsOpportunity").map(2);
        encoder.str("savingsOpportunityPercentage").double(42.5);
        encoder
            .str("estimatedMonthlySavings")
            .map(2)
            .str("currency")
            .str("USD")
            .str("value")
            .double(r.monthly_savings);
    }
    if let Some(token) = next_token {
        encoder.str("nextToken").str(token);
    }
    encoder.into_writer()
}

fn cbor_error(type_name: &str, message: &str) -> Vec<u8> {
    let mut encoder = Encoder::new(Vec::new());
    encoder
        .map(2)
        .str("__type")
        .str(type_name)
        .str("message")
        .str(message);
    encoder.into_writer()
}

const CO_PATH: &str = "/service/ComputeOptimizerService/operation/GetEC2InstanceRecommendations";

fn cbor_response(status: u16, body: Vec<u8>) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("content-type", "application/cbor")
        .insert_header("smithy-protocol", "rpc-v2-cbor")
        .set_body_raw(body, "application/cbor")
}

fn json11(status: u16, body: Value) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .set_body_raw(body.to_string().into_bytes(), "application/x-amz-json-1.1")
}

impl FakeAws {
    /// Starts an empty fake; mount answers with the methods below.
    pub async fn start() -> FakeAws {
        FakeAws {
            server: MockServer::start().await,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint_url(&self) -> String {
        self.server.uri()
    }

    /// A connector configuration pointing at this fake (5-item pages, one attempt per
    /// request so refusals are counted exactly).
    pub fn config(&self) -> AwsConfig {
        AwsConfig {
            endpoint_url: Some(self.endpoint_url()),
            page_size: 5,
            max_attempts: 1,
            ..AwsConfig::default()
        }
    }

    /// `GetAnomalies` answers `pages` in order, linked by `NextPageToken` `page-2`, `page-3`...
    pub async fn anomalies(&self, pages: Vec<Vec<Value>>) {
        let count = pages.len();
        for (i, anomalies) in pages.into_iter().enumerate() {
            let mut body = json!({"Anomalies": anomalies});
            if i + 1 < count {
                body["NextPageToken"] = json!(format!("page-{}", i + 2));
            }
            let mock = Mock::given(method("POST")).and(header(
                "x-amz-target",
                "AWSInsightsIndexService.GetAnomalies",
            ));
            let mock = if i == 0 {
                mock.and(BodyLacks("NextPageToken"))
            } else {
                mock.and(BodyField("NextPageToken", format!("page-{}", i + 1)))
            };
            mock.respond_with(json11(200, body))
                .mount(&self.server)
                .await;
        }
    }

    /// Cost Explorer answers every operation as for a payer that never enabled it.
    pub async fn cost_explorer_not_enabled(&self) {
        Mock::given(method("POST"))
            .and(wiremock::matchers::header_regex("x-amz-target", "^AWSInsightsIndexService\\."))
            .respond_with(json11(400, json!({"__type": "AccessDeniedException", "Message": "User not enabled for cost explorer access"})))
            .mount(&self.server)
            .await;
    }

    /// Cost Explorer throttles every request.
    pub async fn cost_explorer_throttled(&self) {
        Mock::given(method("POST"))
            .and(wiremock::matchers::header_regex("x-amz-target", "^AWSInsightsIndexService\\."))
            .respond_with(json11(400, json!({"__type": "com.amazonaws.ce#ThrottlingException", "message": "Rate exceeded"})))
            .mount(&self.server)
            .await;
    }

    /// Compute Optimizer answers `pages` of recommendations, linked by `nextToken`.
    pub async fn recommendations(&self, pages: Vec<Vec<FakeRecommendation>>) {
        let count = pages.len();
        for (i, page) in pages.iter().enumerate() {
            let next = (i + 1 < count).then(|| format!("co-page-{}", i + 2));
            let mock = Mock::given(method("POST")).and(path(CO_PATH));
            let mock = if i == 0 {
                mock.and(BodyBytesLack(b"nextToken".to_vec()))
            } else {
                mock.and(BodyBytesContain(format!("co-page-{}", i + 1).into_bytes()))
            };
            mock.respond_with(cbor_response(
                200,
                recommendations_cbor(page, next.as_deref()),
            ))
            .mount(&self.server)
            .await;
        }
    }

    /// Compute Optimizer answers as for an account that has not opted in.
    pub async fn compute_optimizer_not_enrolled(&self) {
        Mock::given(method("POST"))
            .and(path(CO_PATH))
            .respond_with(cbor_response(
                403,
                cbor_error(
                    "OptInRequiredException",
                    "Account is not enrolled in the service",
                ),
            ))
            .mount(&self.server)
            .await;
    }

    /// `sts:AssumeRole` issues credentials with access key `assumed_key`;
    /// `ec2:DescribeAddresses` answers one unassociated address.
    pub async fn sts_and_addresses(&self, assumed_key: &str) {
        let sts = format!(
            "<AssumeRoleResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><AssumeRoleResult><Credentials><AccessKeyId>{assumed_key}</AccessKeyId><SecretAccessKey>assumedSecretKeyForTests0000000000000000</SecretAccessKey><SessionToken>FQoGZXIvYXdzEXAMPLESESSIONTOKEN</SessionToken><Expiration>2099-01-01T00:00:00Z</Expiration></Credentials><AssumedRoleUser><AssumedRoleId>AROAEXAMPLE:toolgate-acme</AssumedRoleId><Arn>arn:aws:sts::123456789012:assumed-role/audit/toolgate-acme</Arn></AssumedRoleUser></AssumeRoleResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></AssumeRoleResponse>"
        );
        Mock::given(method("POST"))
            .and(wiremock::matchers::body_string_contains(
                "Action=AssumeRole",
            ))
            .respond_with(ResponseTemplate::new(200).set_body_raw(sts.into_bytes(), "text/xml"))
            .mount(&self.server)
            .await;
        let addresses = "<DescribeAddressesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>1</requestId><addressesSet><item><publicIp>198.51.100.7</publicIp><allocationId>eipalloc-0fake</allocationId><domain>vpc</domain></item></addressesSet></DescribeAddressesResponse>";
        Mock::given(method("POST"))
            .and(wiremock::matchers::body_string_contains(
                "Action=DescribeAddresses",
            ))
            .respond_with(
                ResponseTemplate::new(200).set_body_raw(addresses.as_bytes().to_vec(), "text/xml"),
            )
            .mount(&self.server)
            .await;
    }

    /// Every request received so far.
    pub async fn requests(&self) -> Vec<Request> {
        self.server.received_requests().await.unwrap_or_default()
    }
}
