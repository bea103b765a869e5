//! Harness for end-to-end tests: starts the real `toolgate` binary (built with the `testkit`
//! feature) on a loopback port with its own SQLite file, and hands out authenticated clients.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::admin_service_client::AdminServiceClient;
use toolgate_proto::v1::agent_service_client::AgentServiceClient;

/// The gateway binary under test: `TOOLGATE_BIN`, or `toolgate` next to the test executable's
/// target directory. It must be a `testkit` build.
pub fn gateway_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TOOLGATE_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current test executable");
    // target/debug/deps/<test> -> target/debug/toolgate
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile directory");
    let binary = profile_dir.join("toolgate");
    assert!(
        binary.exists(),
        "the gateway binary {} does not exist; build it with `cargo build -p toolgate --features testkit` (the test command `cargo xtask ci` does this first)",
        binary.display()
    );
    binary
}

/// A running gateway; killed when dropped.
#[derive(Debug)]
pub struct Gateway {
    child: Child,
    /// The gateway's working directory (database, token file).
    pub dir: PathBuf,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The bootstrap admin token.
    pub admin_token: String,
    _temp: Option<tempfile::TempDir>,
}

impl Gateway {
    /// Starts a gateway in a fresh temporary directory.
    pub fn start() -> Gateway {
        let temp = tempfile::tempdir().expect("temp dir");
        let dir = temp.path().to_path_buf();
        let mut gateway = Gateway::start_in(&dir, &[]);
        gateway._temp = Some(temp);
        gateway
    }

    /// Starts a gateway in `dir` (reusing its database) with extra environment variables.
    pub fn start_in(dir: &Path, env: &[(&str, &str)]) -> Gateway {
        let binary = gateway_binary();
        let mut command = Command::new(&binary);
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .current_dir(dir)
            .env("TOOLGATE_LOG", "warn")
            // The gateway refuses unknown TOOLGATE_* variables; TOOLGATE_BIN is the harness's.
            .env_remove("TOOLGATE_BIN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(address) = line.strip_prefix("toolgate listening on ") {
                    let _ = tx.send(address.to_owned());
                }
            }
        });
        let address = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(address) => address,
            Err(_) => {
                let _ = child.kill();
                panic!("the gateway did not announce its address within 20 s");
            }
        };
        let admin_token = std::fs::read_to_string(dir.join("toolgate-admin.token"))
            .expect("admin token file written on first start")
            .trim()
            .to_owned();
        Gateway {
            child,
            dir: dir.to_path_buf(),
            url: format!("http://{address}"),
            admin_token,
            _temp: None,
        }
    }

    /// Stops the process and waits for it.
    pub fn stop(mut self) -> Option<tempfile::TempDir> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self._temp.take()
    }

    /// A channel to the gateway.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url.clone())
            .expect("valid url")
            .connect()
            .await
            .expect("connect to gateway")
    }

    /// An admin client.
    pub async fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(self.channel().await)
    }

    /// An agent client.
    pub async fn agent(&self) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel().await)
    }

    /// Creates a tenant with one agent, grants `tools`, enables tool calling and returns an
    /// agent token.
    pub async fn tenant(&self, tenant: &str, agent: &str, tools: &[&str]) -> String {
        let mut admin = self.admin().await;
        let token = &self.admin_token;
        admin
            .create_tenant(authed(
                pb::CreateTenantRequest {
                    tenant_id: tenant.into(),
                    name: tenant.into(),
                },
                token,
            ))
            .await
            .expect("create tenant");
        admin
            .create_agent(authed(
                pb::CreateAgentRequest {
                    tenant_id: tenant.into(),
                    agent_id: agent.into(),
                    name: agent.into(),
                },
                token,
            ))
            .await
            .expect("create agent");
        for tool in tools {
            admin
                .set_permission(authed(
                    pb::SetPermissionRequest {
                        tenant_id: tenant.into(),
                        agent_id: String::new(),
                        tool_name: (*tool).into(),
                        enabled: true,
                    },
                    token,
                ))
                .await
                .expect("grant tool");
        }
        admin
            .set_feature_flag(authed(
                pb::SetFeatureFlagRequest {
                    tenant_id: tenant.into(),
                    flag: "tool_calling_enabled".into(),
                    enabled: true,
                },
                token,
            ))
            .await
            .expect("enable tool calling");
        admin
            .create_token(authed(
                pb::CreateTokenRequest {
                    role: "agent".into(),
                    tenant_id: tenant.into(),
                    agent_id: String::new(),
                    label: "e2e".into(),
                },
                token,
            ))
            .await
            .expect("create agent token")
            .into_inner()
            .token
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wraps a message with `authorization: Bearer <token>`.
pub fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value: MetadataValue<_> = format!("Bearer {token}").parse().expect("ascii token");
    request.metadata_mut().insert("authorization", value);
    request
}

/// An `ExecuteToolRequest` with the usual defaults.
pub fn execute(run_id: &str, tool: &str, arguments: &str) -> pb::ExecuteToolRequest {
    pb::ExecuteToolRequest {
        run_id: run_id.into(),
        tool_use_id: String::new(),
        tool_name: tool.into(),
        arguments_json: arguments.into(),
        correlation_id: String::new(),
        timeout_ms: 0,
    }
}
