//! The set-up most end-to-end tests repeat, in one place: a tenant with an agent, granted
//! tools, tool calling switched on and an agent token ([`TenantSetup`]), optionally a Cedar
//! policy and an approver token; the agent's and the approver's calls; credentials stored
//! through the `toolgate secrets put` CLI; and the `toolgate.toml` of the connector fakes.

use std::io::Write as _;
use std::process::{Command, Stdio};

use toolgate_proto::v1 as pb;
use toolgate_proto::v1::approval_service_client::ApprovalServiceClient;

use crate::{Gateway, authed, execute, gateway_binary};

/// A tenant created by [`TenantSetup::create`].
#[derive(Debug, Clone)]
pub struct Tenant {
    /// The tenant id.
    pub id: String,
    /// Its one agent's id.
    pub agent: String,
    /// An agent token of the tenant (for every agent of it).
    pub token: String,
    approver: Option<String>,
}

/// What [`Tenant::setup`] creates on a gateway, step by step: the tenant, its agent
/// (`support` unless told), a grant of each tool to every agent of the tenant, the
/// `tool_calling_enabled` flag on, an agent token; then the policy and an approver token when
/// asked for.
#[derive(Debug, Clone)]
#[must_use = "nothing is created until `create` is awaited"]
pub struct TenantSetup {
    tenant: String,
    agent: String,
    tools: Vec<String>,
    policy: Option<String>,
    approver: bool,
}

impl Tenant {
    /// A tenant `id` to set up: see [`TenantSetup`].
    pub fn setup(id: &str) -> TenantSetup {
        TenantSetup {
            tenant: id.to_owned(),
            agent: "support".to_owned(),
            tools: Vec::new(),
            policy: None,
            approver: false,
        }
    }

    /// The approver token of the tenant.
    ///
    /// # Panics
    /// When the tenant was set up without [`TenantSetup::approver`].
    pub fn approver(&self) -> &str {
        self.approver
            .as_deref()
            .expect("an approver token: set the tenant up with `.approver()`")
    }
}

impl TenantSetup {
    /// The agent's id (default `support`).
    pub fn agent(mut self, agent: &str) -> TenantSetup {
        self.agent = agent.to_owned();
        self
    }

    /// Grants `tools` to every agent of the tenant.
    pub fn tools(mut self, tools: &[&str]) -> TenantSetup {
        self.tools
            .extend(tools.iter().map(|tool| (*tool).to_owned()));
        self
    }

    /// Puts `text` as the tenant's Cedar policy.
    pub fn policy(mut self, text: &str) -> TenantSetup {
        self.policy = Some(text.to_owned());
        self
    }

    /// Creates an approver token for the tenant too ([`Tenant::approver`]).
    pub fn approver(mut self) -> TenantSetup {
        self.approver = true;
        self
    }

    /// Creates it all on `gateway` through the admin API; panics naming the step that failed.
    pub async fn create(self, gateway: &Gateway) -> Tenant {
        let mut admin = gateway.admin().await;
        let token = &gateway.admin_token;
        let tenant = self.tenant;
        admin
            .create_tenant(authed(
                pb::CreateTenantRequest {
                    tenant_id: tenant.clone(),
                    name: tenant.clone(),
                },
                token,
            ))
            .await
            .expect("create tenant");
        admin
            .create_agent(authed(
                pb::CreateAgentRequest {
                    tenant_id: tenant.clone(),
                    agent_id: self.agent.clone(),
                    name: self.agent.clone(),
                },
                token,
            ))
            .await
            .expect("create agent");
        for tool in self.tools {
            admin
                .set_permission(authed(
                    pb::SetPermissionRequest {
                        tenant_id: tenant.clone(),
                        agent_id: String::new(),
                        tool_name: tool,
                        enabled: true,
                    },
                    token,
                ))
                .await
                .expect("grant tool");
        }
        gateway.set_tool_calling(&tenant, true).await;
        let agent_token = admin
            .create_token(authed(
                pb::CreateTokenRequest {
                    role: "agent".into(),
                    tenant_id: tenant.clone(),
                    agent_id: String::new(),
                    label: "e2e".into(),
                },
                token,
            ))
            .await
            .expect("create agent token")
            .into_inner()
            .token;
        if let Some(policy) = &self.policy {
            gateway.put_policy(&tenant, policy).await;
        }
        let approver = if self.approver {
            Some(gateway.approver_token(&tenant).await)
        } else {
            None
        };
        Tenant {
            id: tenant,
            agent: self.agent,
            token: agent_token,
            approver,
        }
    }
}

impl Gateway {
    /// Creates a tenant with one agent, grants `tools`, enables tool calling and returns an
    /// agent token: [`Tenant::setup`] with nothing else.
    pub async fn tenant(&self, tenant: &str, agent: &str, tools: &[&str]) -> String {
        Tenant::setup(tenant)
            .agent(agent)
            .tools(tools)
            .create(self)
            .await
            .token
    }

    /// Tenant `tenant` (agent `support`) granted `testkit.transfer` under
    /// [`BIG_TRANSFERS_NEED_APPROVAL`], with an approver token: what the approval tests start
    /// from.
    pub async fn transfer_tenant(&self, tenant: &str) -> Tenant {
        Tenant::setup(tenant)
            .tools(&["testkit.transfer"])
            .policy(BIG_TRANSFERS_NEED_APPROVAL)
            .approver()
            .create(self)
            .await
    }

    /// Throws the tenant's kill switch (`tool_calling_enabled`) off, or on again.
    pub async fn set_tool_calling(&self, tenant: &str, enabled: bool) {
        self.admin()
            .await
            .set_feature_flag(authed(
                pb::SetFeatureFlagRequest {
                    tenant_id: tenant.into(),
                    flag: "tool_calling_enabled".into(),
                    enabled,
                },
                &self.admin_token,
            ))
            .await
            .expect("set tool_calling_enabled");
    }

    /// The tools `run` may call, as the agent `token` sees them.
    pub async fn list_tools(&self, token: &str, run: &str) -> Vec<pb::ToolDefinition> {
        self.agent()
            .await
            .list_tools(authed(pb::ListToolsRequest { run_id: run.into() }, token))
            .await
            .expect("list tools")
            .into_inner()
            .tools
    }

    /// `ExecuteTool` with the agent `token`; the gRPC error, if any.
    pub async fn try_execute(
        &self,
        token: &str,
        request: pb::ExecuteToolRequest,
    ) -> Result<pb::ToolCallResult, tonic::Status> {
        self.agent()
            .await
            .execute_tool(authed(request, token))
            .await
            .map(tonic::Response::into_inner)
    }

    /// `ExecuteTool` with the agent `token`: its answer (a failed call is an answer too);
    /// panics on a gRPC error, naming the tool.
    pub async fn execute(
        &self,
        token: &str,
        request: pb::ExecuteToolRequest,
    ) -> pb::ToolCallResult {
        let tool = request.tool_name.clone();
        self.try_execute(token, request)
            .await
            .unwrap_or_else(|e| panic!("{tool}: {e}"))
    }

    /// Calls `tool` in `run` with the usual defaults ([`execute`]).
    pub async fn call(
        &self,
        token: &str,
        run: &str,
        tool: &str,
        arguments: &str,
    ) -> pb::ToolCallResult {
        self.execute(token, execute(run, tool, arguments)).await
    }

    /// Calls `tool` in `run` as the LLM's `tool_use_id` (a repeat of it is a replay).
    pub async fn call_with_id(
        &self,
        token: &str,
        run: &str,
        tool_use_id: &str,
        tool: &str,
        arguments: &str,
    ) -> pb::ToolCallResult {
        let request = pb::ExecuteToolRequest {
            tool_use_id: tool_use_id.into(),
            ..execute(run, tool, arguments)
        };
        self.execute(token, request).await
    }

    /// `GetToolCall` with the agent `token`.
    pub async fn get_tool_call(&self, token: &str, tool_call_id: &str) -> pb::ToolCall {
        self.agent()
            .await
            .get_tool_call(authed(
                pb::GetToolCallRequest {
                    tool_call_id: tool_call_id.into(),
                },
                token,
            ))
            .await
            .unwrap_or_else(|e| panic!("get tool call {tool_call_id}: {e}"))
            .into_inner()
    }

    /// `WatchRun` of `run` after `after_cursor` with the agent `token`; the gRPC error, if any.
    pub async fn try_watch_run(
        &self,
        token: &str,
        run: &str,
        after_cursor: i64,
    ) -> Result<tonic::Streaming<pb::RunEvent>, tonic::Status> {
        self.agent()
            .await
            .watch_run(authed(
                pb::WatchRunRequest {
                    run_id: run.into(),
                    after_cursor,
                },
                token,
            ))
            .await
            .map(tonic::Response::into_inner)
    }

    /// `WatchRun` of `run` after `after_cursor` with the agent `token`: its stream.
    pub async fn watch_run(
        &self,
        token: &str,
        run: &str,
        after_cursor: i64,
    ) -> tonic::Streaming<pb::RunEvent> {
        self.try_watch_run(token, run, after_cursor)
            .await
            .unwrap_or_else(|e| panic!("watch run {run}: {e}"))
    }

    /// An approvals client.
    pub async fn approvals(&self) -> ApprovalServiceClient<tonic::transport::Channel> {
        ApprovalServiceClient::new(self.channel().await)
    }

    /// `Resume` with the `approver` token.
    pub async fn resume(
        &self,
        approver: &str,
        run: &str,
        invocation: &str,
        decision: pb::ResumeDecision,
        reason: &str,
    ) -> pb::ResumeResponse {
        self.approvals()
            .await
            .resume(authed(
                pb::ResumeRequest {
                    run_id: run.into(),
                    invocation_id: invocation.into(),
                    decision: decision.into(),
                    reason: reason.into(),
                },
                approver,
            ))
            .await
            .unwrap_or_else(|e| panic!("resume {invocation}: {e}"))
            .into_inner()
    }

    /// The pending invocations of `run` (every run: empty) the `approver` sees.
    pub async fn list_pending(&self, approver: &str, run: &str) -> Vec<pb::PendingInvocation> {
        self.approvals()
            .await
            .list_pending(authed(
                pb::ListPendingRequest {
                    run_id: run.into(),
                    ..Default::default()
                },
                approver,
            ))
            .await
            .expect("list pending invocations")
            .into_inner()
            .invocations
    }

    /// One pending invocation as the `approver` sees it.
    pub async fn get_pending(&self, approver: &str, invocation: &str) -> pb::PendingInvocation {
        self.approvals()
            .await
            .get_pending(authed(
                pb::GetPendingRequest {
                    invocation_id: invocation.into(),
                },
                approver,
            ))
            .await
            .unwrap_or_else(|e| panic!("get pending {invocation}: {e}"))
            .into_inner()
    }

    /// Seals `value` as the tenant's credential `name` through the admin API.
    pub async fn put_secret(&self, tenant: &str, name: &str, value: &str) {
        self.admin()
            .await
            .put_secret(authed(
                pb::PutSecretRequest {
                    tenant_id: tenant.into(),
                    name: name.into(),
                    value: value.into(),
                    metadata_json: String::new(),
                    notes: String::new(),
                },
                &self.admin_token,
            ))
            .await
            .unwrap_or_else(|e| panic!("put secret {name}: {e}"));
    }

    /// `toolgate secrets put TENANT NAME [ARGS]` against this gateway, `stdin` written to it as
    /// it is (with or without the newline `echo` would add); panics unless it succeeds, and
    /// returns what it printed, for the caller to check the value is not in it.
    pub fn secrets_put(&self, tenant: &str, name: &str, args: &[&str], stdin: &str) -> String {
        let mut child = Command::new(gateway_binary())
            .args(["secrets", "put", tenant, name])
            .args(args)
            .current_dir(&self.dir)
            .env("TOOLGATE_ADDR", &self.url)
            .env_remove("TOOLGATE_BIN")
            .env_remove("TOOLGATE_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run toolgate secrets put");
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(stdin.as_bytes())
            .expect("write the value");
        let output = child
            .wait_with_output()
            .expect("wait for toolgate secrets put");
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "secrets put failed: {printed}");
        printed
    }
}

/// The Cedar policy of the approval tests: everything is allowed, and a `testkit.transfer` of
/// more than 1000 waits for an approver.
pub const BIG_TRANSFERS_NEED_APPROVAL: &str = r#"
    @id("base") permit(principal, action, resource);
    @id("big") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
"#;

/// A `testkit.transfer` big enough to wait for an approver under
/// [`BIG_TRANSFERS_NEED_APPROVAL`].
pub const BIG_TRANSFER: &str = r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#;

/// The `[connectors.slack]` table pointing the Slack connector at `fake` (loopback allowed
/// for the API and for webhooks).
pub fn slack_config(fake: &toolgate_slack::testkit::FakeSlack) -> String {
    format!(
        "[connectors.slack]\napi_base_url = \"{}\"\nallow_hosts = [\"127.0.0.1\"]\nwebhook_hosts = [\"127.0.0.1\"]\n",
        fake.api_base_url()
    )
}

/// The `[connectors.shopify]` table letting the Shopify connector reach the fake store on
/// loopback.
pub const SHOPIFY_CONFIG: &str =
    "[connectors.shopify]\napi_version = \"2026-10\"\nallow_hosts = [\"127.0.0.1\"]\n";
