//! The gRPC services in process: `serve_with` on a loopback listener with a SQLite ledger in a
//! temporary directory and the `testkit.*` connectors, called with the generated clients.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::Channel;
use toolgate_core::ToolRegistry;
use toolgate_engine::testkit::TestkitConnector;
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::admin_service_client::AdminServiceClient;
use toolgate_proto::v1::agent_service_client::AgentServiceClient;
use toolgate_proto::v1::approval_service_client::ApprovalServiceClient;

/// A gateway served by this process.
struct Gateway {
    _dir: tempfile::TempDir,
    channel: Channel,
    admin_token: String,
    stop: oneshot::Sender<()>,
    /// The server runs on a thread and runtime of its own, as the binary runs it (`serve`'s
    /// future is driven by `block_on`, never spawned).
    served: std::thread::JoinHandle<anyhow::Result<()>>,
}

impl Gateway {
    async fn start() -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str| format!("{:?}", dir.path().join(name).to_str().unwrap());
        let config_file = dir.path().join("toolgate.toml");
        let text = format!(
            "[storage]\ndatabase = {}\n[auth]\nadmin_token_file = {}\n[secrets]\nkey_file = {}\n",
            file("ledger.db"),
            file("admin.token"),
            file("keys"),
        );
        std::fs::write(&config_file, text).unwrap();
        let config =
            toolgate_server::Config::load(Some(&config_file), &BTreeMap::new(), None, None)
                .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        let mut registry = ToolRegistry::new();
        registry.register(Arc::new(TestkitConnector)).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = futures::stream::once(async {
            let _ = stopped.await;
        });
        let served = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener)?;
                toolgate_server::serve_with(config, registry, listener, shutdown).await
            })
        });
        let admin_token = read_admin_token(&dir.path().join("admin.token")).await;
        Gateway {
            channel: channel(address).await,
            _dir: dir,
            admin_token,
            stop,
            served,
        }
    }

    fn agent(&self) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel.clone())
    }

    fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(self.channel.clone())
    }

    fn approvals(&self) -> ApprovalServiceClient<Channel> {
        ApprovalServiceClient::new(self.channel.clone())
    }

    /// A tenant with one agent allowed the echo tool, tool calling on; its agent token.
    async fn tenant(&self, tenant: &str) -> String {
        let mut admin = self.admin();
        let token = &self.admin_token;
        admin
            .create_tenant(authed(
                pb::CreateTenantRequest {
                    tenant_id: tenant.into(),
                    name: String::new(),
                },
                token,
            ))
            .await
            .unwrap();
        admin
            .create_agent(authed(
                pb::CreateAgentRequest {
                    tenant_id: tenant.into(),
                    agent_id: "support".into(),
                    name: "support".into(),
                },
                token,
            ))
            .await
            .unwrap();
        admin
            .set_permission(authed(
                pb::SetPermissionRequest {
                    tenant_id: tenant.into(),
                    agent_id: String::new(),
                    tool_name: "testkit.echo".into(),
                    enabled: true,
                },
                token,
            ))
            .await
            .unwrap();
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
            .unwrap();
        self.token("agent", tenant).await
    }

    async fn token(&self, role: &str, tenant: &str) -> String {
        self.admin()
            .create_token(authed(
                pb::CreateTokenRequest {
                    role: role.into(),
                    tenant_id: tenant.into(),
                    agent_id: String::new(),
                    label: "in-process".into(),
                },
                &self.admin_token,
            ))
            .await
            .unwrap()
            .into_inner()
            .token
    }

    /// Opens a run and echoes `arguments` in it: (run id, the call's result).
    async fn echo(&self, token: &str, arguments: &str) -> (String, pb::ToolCallResult) {
        let mut agent = self.agent();
        let run = agent
            .create_run(authed(
                pb::CreateRunRequest {
                    agent_id: "support".into(),
                    run_id: String::new(),
                    max_calls: 0,
                },
                token,
            ))
            .await
            .unwrap()
            .into_inner()
            .run_id;
        let result = agent
            .execute_tool(authed(
                pb::ExecuteToolRequest {
                    run_id: run.clone(),
                    tool_use_id: "toolu_1".into(),
                    tool_name: "testkit.echo".into(),
                    arguments_json: arguments.into(),
                    correlation_id: String::new(),
                    timeout_ms: 0,
                },
                token,
            ))
            .await
            .unwrap()
            .into_inner();
        (run, result)
    }

    /// Begins the shutdown; the gateway drains and `serve_with` returns.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        let served = tokio::task::spawn_blocking(move || self.served.join())
            .await
            .unwrap()
            .expect("the server thread does not panic");
        served.expect("the gateway stops cleanly");
    }
}

fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// The first admin token, once the gateway has written it.
async fn read_admin_token(path: &Path) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text.trim().to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no admin token at {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn channel(address: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn assert_refused(status: &tonic::Status, code: Code, says: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(says), "{status:?}");
}

#[tokio::test]
async fn calls_without_a_valid_token_of_the_services_role_are_refused() {
    let gateway = Gateway::start().await;
    let agent_token = gateway.tenant("acme").await;
    let approver_token = gateway.token("approver", "acme").await;
    // (authorization metadata, code, what the message says)
    let cases: &[(Option<String>, Code, &str)] = &[
        (
            None,
            Code::Unauthenticated,
            "UNAUTHENTICATED: missing `authorization: Bearer <token>` metadata",
        ),
        (
            Some("Basic dXNlcjpwdw==".into()),
            Code::Unauthenticated,
            "UNAUTHENTICATED: the authorization header must be `Bearer <token>`",
        ),
        (
            Some("Bearer tg_agent_not-a-token".into()),
            Code::Unauthenticated,
            "UNAUTHENTICATED: unknown or revoked token",
        ),
        (
            Some(format!("Bearer {}", gateway.admin_token)),
            Code::PermissionDenied,
            "PERMISSION_DENIED: this call needs an agent token, not an admin token",
        ),
        (
            Some(format!("Bearer {approver_token}")),
            Code::PermissionDenied,
            "PERMISSION_DENIED: this call needs an agent token, not an approver token",
        ),
    ];
    for (authorization, code, says) in cases {
        let mut request = tonic::Request::new(pb::GetRunRequest {
            run_id: "run_1".into(),
        });
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert("authorization", value.parse().unwrap());
        }
        let refused = gateway.agent().get_run(request).await.unwrap_err();
        assert_refused(&refused, *code, says);
    }
    // Each service takes its own role only.
    let refused = gateway
        .admin()
        .list_tenants(authed(pb::ListTenantsRequest {}, &agent_token))
        .await
        .unwrap_err();
    assert_refused(
        &refused,
        Code::PermissionDenied,
        "needs an admin token, not an agent token",
    );
    let refused = gateway
        .approvals()
        .list_pending(authed(pb::ListPendingRequest::default(), &agent_token))
        .await
        .unwrap_err();
    assert_refused(
        &refused,
        Code::PermissionDenied,
        "needs an approver token, not an agent token",
    );
    // A revoked token is refused at once (the cache forgets it).
    let listed = gateway
        .approvals()
        .list_pending(authed(pb::ListPendingRequest::default(), &approver_token))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.invocations.is_empty(), "{listed:?}");
    let tokens = gateway
        .admin()
        .list_tokens(authed(
            pb::ListTokensRequest {
                tenant_id: "acme".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
        .tokens;
    let approver = tokens.iter().find(|t| t.role == "approver").unwrap();
    gateway
        .admin()
        .revoke_token(authed(
            pb::RevokeTokenRequest {
                token_id: approver.token_id.clone(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap();
    let refused = gateway
        .approvals()
        .list_pending(authed(pb::ListPendingRequest::default(), &approver_token))
        .await
        .unwrap_err();
    assert_refused(&refused, Code::Unauthenticated, "unknown or revoked token");
    gateway.stop().await;
}

#[tokio::test]
async fn execute_tool_round_trips_through_the_testkit_connector() {
    let gateway = Gateway::start().await;
    let token = gateway.tenant("acme").await;
    let (run, result) = gateway.echo(&token, r#"{"message": "hello"}"#).await;
    assert_eq!(result.status(), pb::ToolCallStatus::Succeeded, "{result:?}");
    let value: serde_json::Value = serde_json::from_str(&result.result_json).unwrap();
    assert_eq!(value, serde_json::json!({"message": "hello"}));
    assert!(!result.replayed);

    let mut agent = gateway.agent();
    let call = agent
        .get_tool_call(authed(
            pb::GetToolCallRequest {
                tool_call_id: result.tool_call_id.clone(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(call.run_id, run);
    assert_eq!(call.tool_name, "testkit.echo");
    assert_eq!(call.status(), pb::ToolCallStatus::Succeeded);
    // The same tool_use_id again is a replay of the recorded answer.
    let replay = agent
        .execute_tool(authed(
            pb::ExecuteToolRequest {
                run_id: run.clone(),
                tool_use_id: "toolu_1".into(),
                tool_name: "testkit.echo".into(),
                arguments_json: r#"{"message": "hello"}"#.into(),
                correlation_id: String::new(),
                timeout_ms: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(replay.replayed, "{replay:?}");
    assert_eq!(replay.tool_call_id, result.tool_call_id);
    // A malformed id is refused naming the field.
    let refused = agent
        .get_tool_call(authed(
            pb::GetToolCallRequest {
                tool_call_id: String::new(),
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_refused(&refused, Code::InvalidArgument, "tool_call_id: ");
    gateway.stop().await;
}

#[tokio::test]
async fn a_tenant_cannot_see_another_tenants_run_or_call() {
    let gateway = Gateway::start().await;
    let acme = gateway.tenant("acme").await;
    let globex = gateway.tenant("globex").await;
    let (run, result) = gateway.echo(&acme, r#"{"secret": "acme's"}"#).await;
    let mut agent = gateway.agent();
    let refused = agent
        .get_tool_call(authed(
            pb::GetToolCallRequest {
                tool_call_id: result.tool_call_id.clone(),
            },
            &globex,
        ))
        .await
        .unwrap_err();
    assert_refused(
        &refused,
        Code::NotFound,
        &format!("tool call `{}` not found", result.tool_call_id),
    );
    let refused = agent
        .get_run(authed(
            pb::GetRunRequest {
                run_id: run.clone(),
            },
            &globex,
        ))
        .await
        .unwrap_err();
    assert_refused(&refused, Code::NotFound, &format!("run `{run}` not found"));
    let refused = agent
        .list_tool_calls(authed(
            pb::ListToolCallsRequest {
                run_id: run.clone(),
                page_token: String::new(),
                page_size: 0,
            },
            &globex,
        ))
        .await
        .unwrap_err();
    assert_refused(&refused, Code::NotFound, "not found");
    // The owner still sees both.
    let calls = agent
        .list_tool_calls(authed(
            pb::ListToolCallsRequest {
                run_id: run,
                page_token: String::new(),
                page_size: 0,
            },
            &acme,
        ))
        .await
        .unwrap()
        .into_inner()
        .tool_calls;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].tool_call_id, result.tool_call_id);
    gateway.stop().await;
}

#[tokio::test]
async fn admin_calls_create_list_and_refuse_through_the_one_mapping() {
    let gateway = Gateway::start().await;
    gateway.tenant("acme").await;
    let mut admin = gateway.admin();
    let token = &gateway.admin_token;
    let tenants = admin
        .list_tenants(authed(pb::ListTenantsRequest {}, token))
        .await
        .unwrap()
        .into_inner()
        .tenants;
    let ids: Vec<&str> = tenants.iter().map(|t| t.tenant_id.as_str()).collect();
    assert_eq!(ids, ["acme"]);
    let refused = admin
        .create_tenant(authed(
            pb::CreateTenantRequest {
                tenant_id: "acme".into(),
                name: String::new(),
            },
            token,
        ))
        .await
        .unwrap_err();
    assert_refused(&refused, Code::AlreadyExists, "tenant acme already exists");
    let refused = admin
        .set_feature_flag(authed(
            pb::SetFeatureFlagRequest {
                tenant_id: "acme".into(),
                flag: "Not A Flag".into(),
                enabled: true,
            },
            token,
        ))
        .await
        .unwrap_err();
    assert_refused(
        &refused,
        Code::InvalidArgument,
        "flag: `Not A Flag` must be",
    );
    let refused = admin
        .set_permission(authed(
            pb::SetPermissionRequest {
                tenant_id: "acme".into(),
                agent_id: String::new(),
                tool_name: "slack.post_message".into(),
                enabled: true,
            },
            token,
        ))
        .await
        .unwrap_err();
    assert_refused(
        &refused,
        Code::InvalidArgument,
        "tool_name: `slack.post_message` is not served by this gateway; registered tools: testkit.",
    );
    gateway.stop().await;
}
