//! The command-line client: `admin`, `call`, `tools` and `ledger` subcommands.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use toolgate_engine::Catalog;
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::admin_service_client::AdminServiceClient;
use toolgate_proto::v1::agent_service_client::AgentServiceClient;

use toolgate_server::convert;

/// Where the gateway is and how to authenticate. Each command uses a token of its own role and
/// never another role's: `TOOLGATE_AGENT_TOKEN` for `call`, `TOOLGATE_APPROVER_TOKEN` for
/// `approvals`, and for `admin` and `secrets` the admin token file the gateway writes on first
/// start (or `TOOLGATE_ADMIN_TOKEN`). Tokens never come from the command line (it shows in
/// process listings): from those variables or `--token-file`.
#[derive(Debug, Args)]
pub(crate) struct Connection {
    /// The gateway's address. A gateway that is still starting is waited for up to 10 s.
    #[arg(long, env = "TOOLGATE_ADDR", default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// A file holding the token, instead of the role's variable (admin commands: instead of
    /// TOOLGATE_ADMIN_TOKEN and ./toolgate-admin.token).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

/// The role a command needs a token of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenRole {
    Agent,
    Approver,
    Admin,
}

impl TokenRole {
    fn name(self) -> &'static str {
        match self {
            TokenRole::Agent => "agent",
            TokenRole::Approver => "approver",
            TokenRole::Admin => "admin",
        }
    }

    /// The variable holding this role's token.
    fn variable(self) -> &'static str {
        match self {
            TokenRole::Agent => "TOOLGATE_AGENT_TOKEN",
            TokenRole::Approver => "TOOLGATE_APPROVER_TOKEN",
            TokenRole::Admin => "TOOLGATE_ADMIN_TOKEN",
        }
    }
}

/// Where the admin token is when nothing else is said: the file the gateway writes on first
/// start in its working directory.
const DEFAULT_ADMIN_TOKEN_FILE: &str = "toolgate-admin.token";

/// How long a command waits for a gateway that refuses connections (one still starting).
const CONNECT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

impl Connection {
    /// The token for `role`: `--token-file`, else the role's variable, else (admin only) the
    /// gateway's admin token file. Never another role's token.
    fn token(&self, role: TokenRole) -> anyhow::Result<String> {
        let variable = role.variable();
        let (token, source) = if let Some(file) = &self.token_file {
            (
                read_token_file(file)?,
                format!("--token-file {}", file.display()),
            )
        } else if let Some(value) = std::env::var(variable)
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            (value.trim().to_owned(), variable.to_owned())
        } else if role == TokenRole::Admin {
            let file = PathBuf::from(DEFAULT_ADMIN_TOKEN_FILE);
            let token = read_token_file(&file).with_context(|| {
                format!(
                    "no admin token: set {variable} or pass --token-file (the gateway writes {} in its working directory on first start)",
                    file.display()
                )
            })?;
            (token, file.display().to_string())
        } else {
            let legacy = if std::env::var_os("TOOLGATE_TOKEN").is_some() {
                " (TOOLGATE_TOKEN is not read: each command takes the token of its own role)"
            } else {
                ""
            };
            bail!(
                "no {role} token: set {variable} to the token `toolgate admin tokens create --role {role} --tenant TENANT` printed, or pass --token-file{legacy}",
                role = role.name()
            );
        };
        // Tokens name their role (`tg_<role>_...`): refuse to send another role's.
        let held = ["agent", "approver", "admin"]
            .into_iter()
            .find(|name| token.starts_with(&format!("tg_{name}_")));
        if let Some(held) = held
            && held != role.name()
        {
            bail!(
                "{source} holds an {held} token, but this command needs an {} token",
                role.name()
            );
        }
        Ok(token)
    }

    async fn channel(
        &self,
        role: TokenRole,
    ) -> anyhow::Result<(Channel, MetadataValue<tonic::metadata::Ascii>)> {
        // A token that comes from the environment or a named file is checked before anything
        // is sent; the admin token file may appear only once a starting gateway listens.
        let early = match (role, &self.token_file) {
            (TokenRole::Admin, None) if std::env::var_os(role.variable()).is_none() => None,
            _ => Some(self.token(role)?),
        };
        let endpoint = Channel::from_shared(self.addr.clone())
            .with_context(|| format!("invalid address `{}`", self.addr))?;
        let started = std::time::Instant::now();
        let channel = loop {
            match endpoint.connect().await {
                Ok(channel) => break channel,
                Err(error) if refused(&error) && started.elapsed() < CONNECT_PATIENCE => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(error) => {
                    return Err(anyhow::Error::new(error).context(format!(
                        "cannot reach the gateway at {} (is `toolgate serve` running there?)",
                        self.addr
                    )));
                }
            }
        };
        let token = match early {
            Some(token) => token,
            None => self.token(role)?,
        };
        let header: MetadataValue<_> = format!("Bearer {token}")
            .parse()
            .context("the token contains characters not allowed in a header")?;
        Ok((channel, header))
    }
}

fn read_token_file(path: &std::path::Path) -> anyhow::Result<String> {
    toolgate_server::files::refuse_shared_file(path, "token file")?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(token.to_owned())
}

/// Whether connecting failed because nothing listens (yet) at the address.
fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        current = error.source();
    }
    false
}

/// The exit codes, shown in `toolgate --help` and the README.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  done: the command did what it says (a call that succeeded, an approval that executed a
     call that succeeded, a rejection or continue applied, a ledger whose chains verify)
  1  error: the command could not be done (gateway unreachable, request refused, no token,
     bad input, an invalid policy file)
  2  usage: the command line is wrong
  3  the tool call did not succeed (refused, failed, timed out, outcome unknown)
  4  the tool call waits for an approver's decision
  5  the decision was not applied (another decision came first, a policy denial cannot be
     approved, or tool calling is disabled so an approval executes nothing)
  6  the ledger's audit chains do not verify";

/// `toolgate call`: the call did not succeed.
const EXIT_CALL_NOT_SUCCEEDED: u8 = 3;
/// `toolgate call`: the call waits for approval.
const EXIT_WAITING_APPROVAL: u8 = 4;
/// `toolgate approvals`: the decision did not apply.
const EXIT_NOT_DECIDED: u8 = 5;
/// `ledger verify`, `admin verify-ledger`: tampering found.
const EXIT_CHAIN_BROKEN: u8 = 6;

fn authed<T>(message: T, header: &MetadataValue<tonic::metadata::Ascii>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", header.clone());
    request
}

#[allow(
    clippy::print_stdout,
    reason = "printing results is what the CLI is for"
)]
fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// Admin subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum AdminCommand {
    /// Tenants.
    #[command(subcommand)]
    Tenants(TenantCommand),
    /// Agents of a tenant.
    #[command(subcommand)]
    Agents(AgentCommand),
    /// API tokens.
    #[command(subcommand)]
    Tokens(TokenCommand),
    /// Tool permissions (grants).
    #[command(subcommand)]
    Permissions(PermissionCommand),
    /// Feature flags such as tool_calling_enabled.
    #[command(subcommand)]
    Flags(FlagCommand),
    /// Cedar policy sets.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Verifies the audit hash chains on the server.
    VerifyLedger,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TenantCommand {
    /// Creates a tenant.
    Create {
        id: String,
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Lists tenants.
    List,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AgentCommand {
    /// Creates an agent.
    Create {
        tenant: String,
        id: String,
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Lists a tenant's agents.
    List { tenant: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Issues a token and prints it once.
    Create {
        /// agent, approver or admin.
        #[arg(long)]
        role: String,
        #[arg(long, default_value = "")]
        tenant: String,
        #[arg(long, default_value = "")]
        agent: String,
        #[arg(long, default_value = "")]
        label: String,
    },
    /// Lists tokens of a tenant (admin tokens without --tenant).
    List {
        #[arg(long, default_value = "")]
        tenant: String,
    },
    /// Revokes a token by id.
    Revoke { token_id: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum PermissionCommand {
    /// Grants a tool to a tenant, or to one agent with --agent.
    Set {
        tenant: String,
        tool: String,
        #[arg(long, default_value = "")]
        agent: String,
        /// Records the grant disabled.
        #[arg(long)]
        disable: bool,
    },
    /// Lists grants.
    List {
        tenant: String,
        #[arg(long, default_value = "")]
        agent: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum FlagCommand {
    /// Sets a flag.
    Set {
        tenant: String,
        flag: String,
        #[arg(action = clap::ArgAction::Set)]
        enabled: bool,
    },
    /// Shows a flag.
    Get { tenant: String, flag: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Validates and uploads a Cedar policy file as the tenant's new version.
    Put { tenant: String, file: PathBuf },
    /// Validates a Cedar policy file without storing it.
    Validate { file: PathBuf },
    /// Prints the policy set in force.
    Get { tenant: String },
    /// Prints the Cedar schema generated from the registered tools.
    Schema,
}

/// Runs an admin subcommand.
pub(crate) async fn admin(conn: Connection, command: AdminCommand) -> anyhow::Result<ExitCode> {
    let (channel, header) = conn.channel(TokenRole::Admin).await?;
    let mut client = AdminServiceClient::new(channel);
    let h = &header;
    let value = match command {
        AdminCommand::Tenants(TenantCommand::Create { id, name }) => {
            let t = client
                .create_tenant(authed(
                    pb::CreateTenantRequest {
                        tenant_id: id,
                        name,
                    },
                    h,
                ))
                .await?
                .into_inner();
            json!({"tenant_id": t.tenant_id, "name": t.name})
        }
        AdminCommand::Tenants(TenantCommand::List) => {
            let r = client
                .list_tenants(authed(pb::ListTenantsRequest {}, h))
                .await?
                .into_inner();
            json!(
                r.tenants
                    .iter()
                    .map(|t| json!({"tenant_id": t.tenant_id, "name": t.name}))
                    .collect::<Vec<_>>()
            )
        }
        AdminCommand::Agents(AgentCommand::Create { tenant, id, name }) => {
            let a = client
                .create_agent(authed(
                    pb::CreateAgentRequest {
                        tenant_id: tenant,
                        agent_id: id,
                        name,
                    },
                    h,
                ))
                .await?
                .into_inner();
            json!({"tenant_id": a.tenant_id, "agent_id": a.agent_id, "name": a.name})
        }
        AdminCommand::Agents(AgentCommand::List { tenant }) => {
            let r = client
                .list_agents(authed(pb::ListAgentsRequest { tenant_id: tenant }, h))
                .await?
                .into_inner();
            json!(
                r.agents
                    .iter()
                    .map(|a| json!({"agent_id": a.agent_id, "name": a.name}))
                    .collect::<Vec<_>>()
            )
        }
        AdminCommand::Tokens(TokenCommand::Create {
            role,
            tenant,
            agent,
            label,
        }) => {
            let r = client
                .create_token(authed(
                    pb::CreateTokenRequest {
                        role,
                        tenant_id: tenant,
                        agent_id: agent,
                        label,
                    },
                    h,
                ))
                .await?
                .into_inner();
            json!({"token_id": r.token_id, "token": r.token, "note": "the token is shown once; store it now"})
        }
        AdminCommand::Tokens(TokenCommand::List { tenant }) => {
            let r = client
                .list_tokens(authed(pb::ListTokensRequest { tenant_id: tenant }, h))
                .await?
                .into_inner();
            json!(
                r.tokens
                    .iter()
                    .map(|t| json!({
                        "token_id": t.token_id, "role": t.role, "tenant_id": t.tenant_id,
                        "agent_id": t.agent_id, "label": t.label, "revoked": t.revoked
                    }))
                    .collect::<Vec<_>>()
            )
        }
        AdminCommand::Tokens(TokenCommand::Revoke { token_id }) => {
            client
                .revoke_token(authed(
                    pb::RevokeTokenRequest {
                        token_id: token_id.clone(),
                    },
                    h,
                ))
                .await?;
            json!({"revoked": token_id})
        }
        AdminCommand::Permissions(PermissionCommand::Set {
            tenant,
            tool,
            agent,
            disable,
        }) => {
            let p = client
                .set_permission(authed(
                    pb::SetPermissionRequest {
                        tenant_id: tenant,
                        agent_id: agent,
                        tool_name: tool,
                        enabled: !disable,
                    },
                    h,
                ))
                .await?
                .into_inner();
            json!({"tenant_id": p.tenant_id, "agent_id": p.agent_id, "tool_name": p.tool_name, "enabled": p.enabled})
        }
        AdminCommand::Permissions(PermissionCommand::List { tenant, agent }) => {
            let r = client
                .list_permissions(authed(
                    pb::ListPermissionsRequest {
                        tenant_id: tenant,
                        agent_id: agent,
                    },
                    h,
                ))
                .await?
                .into_inner();
            json!(
                r.permissions
                    .iter()
                    .map(|p| json!({
                        "agent_id": p.agent_id, "tool_name": p.tool_name, "enabled": p.enabled
                    }))
                    .collect::<Vec<_>>()
            )
        }
        AdminCommand::Flags(FlagCommand::Set {
            tenant,
            flag,
            enabled,
        }) => {
            let f = client
                .set_feature_flag(authed(
                    pb::SetFeatureFlagRequest {
                        tenant_id: tenant,
                        flag,
                        enabled,
                    },
                    h,
                ))
                .await?
                .into_inner();
            json!({"tenant_id": f.tenant_id, "flag": f.flag, "enabled": f.enabled})
        }
        AdminCommand::Flags(FlagCommand::Get { tenant, flag }) => {
            let f = client
                .get_feature_flag(authed(
                    pb::GetFeatureFlagRequest {
                        tenant_id: tenant,
                        flag,
                    },
                    h,
                ))
                .await?
                .into_inner();
            json!({"tenant_id": f.tenant_id, "flag": f.flag, "enabled": f.enabled, "explicitly_set": f.explicitly_set})
        }
        AdminCommand::Policy(PolicyCommand::Put { tenant, file }) => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let p = client
                .put_policy(authed(
                    pb::PutPolicyRequest {
                        tenant_id: tenant,
                        text,
                    },
                    h,
                ))
                .await?
                .into_inner();
            json!({"tenant_id": p.tenant_id, "version": p.version})
        }
        AdminCommand::Policy(PolicyCommand::Validate { file }) => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let r = client
                .validate_policy(authed(pb::ValidatePolicyRequest { text }, h))
                .await?
                .into_inner();
            let valid = r.valid;
            print_json(&json!({"valid": r.valid, "errors": r.errors}));
            return Ok(if valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        AdminCommand::Policy(PolicyCommand::Get { tenant }) => {
            let p = client
                .get_policy(authed(pb::GetPolicyRequest { tenant_id: tenant }, h))
                .await?
                .into_inner();
            print_text(&format!(
                "// tenant {} policy version {}\n{}",
                p.tenant_id, p.version, p.text
            ));
            return Ok(ExitCode::SUCCESS);
        }
        AdminCommand::Policy(PolicyCommand::Schema) => {
            let r = client
                .get_policy_schema(authed(pb::GetPolicySchemaRequest {}, h))
                .await?
                .into_inner();
            print_text(&r.cedar_schema);
            return Ok(ExitCode::SUCCESS);
        }
        AdminCommand::VerifyLedger => {
            let r = client
                .verify_ledger(authed(pb::VerifyLedgerRequest {}, h))
                .await?
                .into_inner();
            let ok = r.ok;
            print_json(&verify_json(&r));
            return Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_CHAIN_BROKEN)
            });
        }
    };
    print_json(&value);
    Ok(ExitCode::SUCCESS)
}

#[allow(
    clippy::print_stdout,
    reason = "printing results is what the CLI is for"
)]
fn print_text(text: &str) {
    println!("{text}");
}

fn verify_json(r: &pb::VerifyLedgerResponse) -> Value {
    let mut value =
        json!({"ok": r.ok, "events_checked": r.events_checked, "chains_checked": r.chains_checked});
    if !r.ok {
        value["problem"] = json!({
            "tenant_id": r.problem_tenant_id,
            "chain_seq": r.problem_chain_seq,
            "kind": r.problem_kind,
            "detail": r.problem_detail,
        });
    }
    value
}

/// `toolgate call` arguments.
#[derive(Debug, Args)]
pub(crate) struct CallArgs {
    #[command(flatten)]
    conn: Connection,
    /// The agent to open the run for (may be omitted with a token bound to one agent).
    #[arg(long, default_value = "")]
    agent: String,
    /// Reuse an existing run instead of opening one.
    #[arg(long, default_value = "")]
    run: String,
    /// An idempotency key; repeat it to get the recorded outcome instead of a second call.
    #[arg(long, default_value = "")]
    tool_use_id: String,
    /// Per-call timeout in milliseconds.
    #[arg(long, default_value_t = 0)]
    timeout_ms: u64,
    /// The tool, e.g. slack.post_message.
    tool: String,
    /// The arguments as a JSON object.
    #[arg(default_value = "{}")]
    arguments: String,
}

/// Runs `toolgate call`.
pub(crate) async fn call(args: CallArgs) -> anyhow::Result<ExitCode> {
    let (channel, header) = args.conn.channel(TokenRole::Agent).await?;
    let mut client = AgentServiceClient::new(channel);
    let run_id = if args.run.is_empty() {
        client
            .create_run(authed(
                pb::CreateRunRequest {
                    agent_id: args.agent,
                    run_id: String::new(),
                    max_calls: 0,
                },
                &header,
            ))
            .await?
            .into_inner()
            .run_id
    } else {
        args.run
    };
    let result = client
        .execute_tool(authed(
            pb::ExecuteToolRequest {
                run_id: run_id.clone(),
                tool_use_id: args.tool_use_id,
                tool_name: args.tool,
                arguments_json: args.arguments,
                correlation_id: String::new(),
                timeout_ms: args.timeout_ms,
            },
            &header,
        ))
        .await?
        .into_inner();
    let status = pb::ToolCallStatus::try_from(result.status)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("TOOL_CALL_STATUS_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| result.status.to_string());
    let parsed_result: Value = if result.result_json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&result.result_json)
            .unwrap_or(Value::String(result.result_json.clone()))
    };
    let code = call_exit_code(&status);
    print_json(&json!({
        "run_id": run_id,
        "tool_call_id": result.tool_call_id,
        "status": status,
        "result": parsed_result,
        "error_code": result.error_code,
        "error_message": result.error_message,
        "decision": result.decision,
        "risk_level": result.risk_level,
        "pending_invocation_id": result.pending_invocation_id,
        "duration_ms": result.duration_ms,
        "replayed": result.replayed,
    }));
    Ok(ExitCode::from(code))
}

/// The exit code of a call that ended with `status` (lower case, as printed).
fn call_exit_code(status: &str) -> u8 {
    match status {
        "succeeded" => 0,
        "waiting_approval" => EXIT_WAITING_APPROVAL,
        _ => EXIT_CALL_NOT_SUCCEEDED,
    }
}

/// Runs `toolgate tools`.
pub(crate) fn tools(as_json: bool) -> anyhow::Result<ExitCode> {
    let registry = toolgate_server::build_registry(
        &[],
        &toolgate_server::config::SlackSettings::default(),
        &toolgate_server::config::ShopifySettings::default(),
        &toolgate_server::config::AwsSettings::default(),
    )?;
    let catalog = Catalog::new(registry)?;
    let definitions: Vec<Value> = catalog
        .registry()
        .specs()
        .map(|spec| {
            let d = convert::tool_definition(spec);
            if as_json {
                json!({
                    "name": d.name, "llm_name": d.llm_name, "description": d.description,
                    "input_schema": spec.input_schema, "tags": d.tags, "risk_level": d.risk_level,
                    "idempotent": d.idempotent, "default_timeout_ms": d.default_timeout_ms,
                })
            } else {
                json!(format!(
                    "{:<32} {:<6} {}",
                    d.name, d.risk_level, d.description
                ))
            }
        })
        .collect();
    if as_json {
        print_json(&json!(definitions));
    } else if definitions.is_empty() {
        print_text("no tools: this build has no connectors enabled");
    } else {
        for line in definitions {
            print_text(line.as_str().unwrap_or_default());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Ledger subcommands (work on the database directly, no server needed).
#[derive(Debug, Subcommand)]
pub(crate) enum LedgerCommand {
    /// Checks every audit chain (each tenant's and the system chain), the call, decision and
    /// pending-invocation rows its events bind, and optionally a checkpoint; reports the first
    /// problem and what could not be checked (without the master keys: the events' MACs).
    Verify {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// A checkpoint written earlier by `ledger checkpoint`: truncation and rewinding show
        /// against it.
        #[arg(long)]
        checkpoint: Option<PathBuf>,
    },
    /// Verifies the ledger, then prints the head of every chain MAC'd with the master keys,
    /// to keep away from the database (for `ledger verify --checkpoint`).
    Checkpoint {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// Write the checkpoint to this file (0600) instead of standard output.
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

/// Where the ledger and its keys are.
#[derive(Debug, Args)]
pub(crate) struct LedgerArgs {
    /// The ledger: a SQLite file or a postgres:// URL.
    #[arg(long, env = "TOOLGATE_DATABASE", default_value = "toolgate.db")]
    database: String,
    /// The PostgreSQL schema holding the ledger.
    #[arg(long, env = "TOOLGATE_DATABASE_SCHEMA")]
    schema: Option<String>,
    /// The master key file the gateway uses (TOOLGATE_MASTER_KEYS takes precedence); the
    /// audit chain's keys are derived from it. Never created by these commands.
    #[arg(long, env = "TOOLGATE_KEY_FILE", default_value = "toolgate-keys")]
    key_file: PathBuf,
}

impl LedgerArgs {
    /// The key ring, if one is configured.
    fn keys(&self) -> anyhow::Result<Option<Arc<dyn toolgate_core::AuditKeys>>> {
        let inline = std::env::var("TOOLGATE_MASTER_KEYS")
            .ok()
            .filter(|keys| !keys.trim().is_empty());
        let ring = toolgate_server::keys::read_key_ring(&self.key_file, inline.as_deref())?;
        Ok(ring.map(|ring| Arc::new(ring) as Arc<dyn toolgate_core::AuditKeys>))
    }

    /// The ledger, read-only (works beside the gateway that owns a SQLite file).
    async fn open(
        &self,
        keys: Option<Arc<dyn toolgate_core::AuditKeys>>,
    ) -> anyhow::Result<Arc<dyn toolgate_ledger::Store>> {
        let database =
            toolgate_server::storage::Database::parse(&self.database, self.schema.clone())
                .map_err(|message| anyhow::anyhow!(message))?;
        if let toolgate_server::storage::Database::Sqlite(path) = &database
            && !path.exists()
        {
            bail!("no ledger at {}", path.display());
        }
        database.open_for_reading(keys).await
    }
}

/// Runs a ledger subcommand.
pub(crate) async fn ledger(command: LedgerCommand) -> anyhow::Result<ExitCode> {
    match command {
        LedgerCommand::Verify { ledger, checkpoint } => {
            let keys = ledger.keys()?;
            let checkpoint = match &checkpoint {
                Some(path) => {
                    let text = std::fs::read_to_string(path).with_context(|| {
                        format!("cannot read the checkpoint {}", path.display())
                    })?;
                    let parsed = toolgate_ledger::Checkpoint::parse(&text)
                        .with_context(|| format!("checkpoint {}", path.display()))?;
                    let auth = parsed.authenticate(keys.as_deref());
                    if auth == toolgate_ledger::CheckpointAuth::Forged {
                        bail!(
                            "the checkpoint {} does not match its MAC: it was changed after it \
                             was written (or written with other keys); nothing was verified \
                             against it",
                            path.display()
                        );
                    }
                    Some((parsed, auth))
                }
                None => None,
            };
            let store = ledger.open(keys).await?;
            let report = store
                .verify_against(checkpoint.as_ref().map(|(parsed, _)| parsed))
                .await?;
            let ok = report.first_problem.is_none();
            print_json(&ledger_report_json(
                &report,
                checkpoint.as_ref().map(|(_, auth)| auth),
            ));
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_CHAIN_BROKEN)
            })
        }
        LedgerCommand::Checkpoint { ledger, output } => {
            let Some(keys) = ledger.keys()? else {
                bail!(
                    "no master keys: a checkpoint is MAC'd with the audit chain key, derived \
                     from the master key file ({}) or TOOLGATE_MASTER_KEYS",
                    ledger.key_file.display()
                );
            };
            let store = ledger.open(Some(Arc::clone(&keys))).await?;
            let report = store.verify_chains().await?;
            let now = toolgate_core::Clock::now(&toolgate_core::SystemClock).0;
            let checkpoint =
                match toolgate_ledger::Checkpoint::of_report(&report, keys.as_ref(), now) {
                    Ok(checkpoint) => checkpoint,
                    Err(error) => {
                        eprintln!("toolgate: {error}");
                        return Ok(ExitCode::from(EXIT_CHAIN_BROKEN));
                    }
                };
            let text = checkpoint.to_text();
            match output {
                Some(path) => {
                    toolgate_server::files::write_private_file(&path, &text).with_context(
                        || format!("cannot write the checkpoint {}", path.display()),
                    )?;
                }
                None => print_raw(&text),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[allow(
    clippy::print_stdout,
    reason = "printing results is what the CLI is for"
)]
fn print_raw(text: &str) {
    print!("{text}");
}

/// `ledger verify`'s answer: the verdict, the counts, what was and was not checked, and the
/// first problem.
fn ledger_report_json(
    report: &toolgate_ledger::VerifyReport,
    checkpoint: Option<&toolgate_ledger::CheckpointAuth>,
) -> Value {
    let mut notes: Vec<String> = Vec::new();
    if !report.keys_loaded {
        notes.push(format!(
            "no master keys were given: the MACs of {} keyed events were not checked, so an \
             event edited by someone without the key goes unseen; links, order and the rows \
             the events bind were checked",
            report.keyed_events
        ));
    } else if !report.missing_keys.is_empty() {
        notes.push(format!(
            "{} keyed events are MAC'd with keys that are not loaded ({}): their MACs were not \
             checked",
            report.keyed_events - report.authenticated_events,
            report.missing_keys.join(", ")
        ));
    }
    if report.legacy_events > 0 {
        let protection = if report.unprotected_legacy_events > 0 {
            "nothing authenticates them (they were written without keys)"
        } else {
            "the keyed record taken when the keyed chain began authenticates them"
        };
        notes.push(format!(
            "{} legacy events carry the unkeyed hash of the format before the keyed chain: {}",
            report.legacy_events, protection
        ));
    }
    if report.legacy_rows > 0 {
        notes.push(format!(
            "{} call, decision or pending-invocation rows were recorded before the keyed chain \
             and are not bound to it",
            report.legacy_rows
        ));
    }
    match checkpoint {
        None => notes.push(
            "no checkpoint was given: removal of the newest events with the head rewound cannot \
             be ruled out (see `toolgate ledger checkpoint`)"
                .to_owned(),
        ),
        Some(toolgate_ledger::CheckpointAuth::Unverifiable) => notes.push(
            "the checkpoint's MAC was not checked (its key is not loaded): the chains were \
             compared with it as given"
                .to_owned(),
        ),
        Some(_) => {}
    }
    let mut value = json!({
        "ok": report.first_problem.is_none(),
        "events_checked": report.events_checked,
        "chains_checked": report.chains_checked,
        "keys_loaded": report.keys_loaded,
        "keyed_events": report.keyed_events,
        "authenticated_events": report.authenticated_events,
        "legacy_events": report.legacy_events,
        "missing_keys": report.missing_keys,
        "rows_checked": report.rows_checked,
        "legacy_rows": report.legacy_rows,
        "checkpoint": match checkpoint {
            None => Value::Null,
            Some(auth) => json!({
                "authenticated": *auth == toolgate_ledger::CheckpointAuth::Authentic,
                "chains": report.checkpoint_chains,
            }),
        },
        "not_checked": notes,
    });
    if let Some(problem) = &report.first_problem {
        value["problem"] = json!({
            "tenant_id": problem.chain.to_string(),
            "chain_seq": problem.chain_seq,
            "kind": problem.kind.as_str(),
            "detail": problem.detail,
        });
    }
    value
}

/// `toolgate secrets` subcommands. Values are read from standard input or a file, never from
/// the command line (it shows in process listings and shell history).
#[derive(Debug, Subcommand)]
pub(crate) enum SecretsCommand {
    /// Seals and stores a credential; the value comes from --file or standard input.
    Put {
        tenant: String,
        name: String,
        /// Read the value from this file instead of standard input.
        #[arg(long)]
        file: Option<PathBuf>,
        /// A JSON object describing the credential.
        #[arg(long, default_value = "")]
        metadata: String,
        #[arg(long, default_value = "")]
        notes: String,
    },
    /// Stores a reference read at use: `env:NAME` or `file:/absolute/path`.
    Ref {
        tenant: String,
        name: String,
        reference: String,
        #[arg(long, default_value = "")]
        metadata: String,
        #[arg(long, default_value = "")]
        notes: String,
    },
    /// Lists a tenant's credentials (never their values).
    List { tenant: String },
    /// Deletes a credential.
    Delete { tenant: String, name: String },
    /// Adds a new master key and makes it the one that seals.
    RotateKey,
    /// Re-seals every credential under the active master key.
    Rewrap,
    /// Removes an old master key (refused while a credential needs it).
    RetireKey { key_id: String },
}

/// Runs a secrets subcommand.
pub(crate) async fn secrets(conn: Connection, command: SecretsCommand) -> anyhow::Result<ExitCode> {
    let (channel, header) = conn.channel(TokenRole::Admin).await?;
    let mut client = AdminServiceClient::new(channel);
    let h = &header;
    let info = |s: pb::SecretInfo| {
        json!({
            "tenant_id": s.tenant_id, "name": s.name, "kind": s.kind, "key_id": s.key_id,
            "reference": s.reference, "notes": s.notes, "created_by": s.created_by,
            "metadata": serde_json::from_str::<Value>(&s.metadata_json).unwrap_or(Value::Null),
        })
    };
    let value = match command {
        SecretsCommand::Put {
            tenant,
            name,
            file,
            metadata,
            notes,
        } => {
            let value = read_secret_value(file.as_deref())?;
            let request = pb::PutSecretRequest {
                tenant_id: tenant,
                name,
                value,
                metadata_json: metadata,
                notes,
            };
            info(client.put_secret(authed(request, h)).await?.into_inner())
        }
        SecretsCommand::Ref {
            tenant,
            name,
            reference,
            metadata,
            notes,
        } => {
            let request = pb::PutSecretReferenceRequest {
                tenant_id: tenant,
                name,
                reference,
                metadata_json: metadata,
                notes,
            };
            info(
                client
                    .put_secret_reference(authed(request, h))
                    .await?
                    .into_inner(),
            )
        }
        SecretsCommand::List { tenant } => {
            let r = client
                .list_secrets(authed(pb::ListSecretsRequest { tenant_id: tenant }, h))
                .await?
                .into_inner();
            json!(r.secrets.into_iter().map(info).collect::<Vec<_>>())
        }
        SecretsCommand::Delete { tenant, name } => {
            client
                .delete_secret(authed(
                    pb::DeleteSecretRequest {
                        tenant_id: tenant,
                        name: name.clone(),
                    },
                    h,
                ))
                .await?;
            json!({"deleted": name})
        }
        SecretsCommand::RotateKey => {
            let r = client
                .rotate_key(authed(pb::RotateKeyRequest {}, h))
                .await?
                .into_inner();
            json!({"active_key_id": r.active_key_id, "key_ids": r.key_ids, "next": "run `toolgate secrets rewrap`, then retire the old key"})
        }
        SecretsCommand::Rewrap => {
            let r = client
                .rewrap_secrets(authed(pb::RewrapSecretsRequest {}, h))
                .await?
                .into_inner();
            json!({"rewrapped": r.rewrapped, "skipped": r.skipped, "active_key_id": r.active_key_id})
        }
        SecretsCommand::RetireKey { key_id } => {
            let r = client
                .retire_key(authed(pb::RetireKeyRequest { key_id }, h))
                .await?
                .into_inner();
            json!({"active_key_id": r.active_key_id, "key_ids": r.key_ids})
        }
    };
    print_json(&value);
    Ok(ExitCode::SUCCESS)
}

/// A secret value from a file or standard input, without one trailing newline.
fn read_secret_value(file: Option<&std::path::Path>) -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut value = String::new();
    match file {
        Some(path) => {
            value = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
        }
        None => {
            std::io::stdin()
                .read_to_string(&mut value)
                .context("cannot read the value from standard input")?;
        }
    }
    let trimmed = value.strip_suffix('\n').unwrap_or(&value);
    let trimmed = trimmed.strip_suffix('\r').unwrap_or(trimmed);
    if trimmed.is_empty() {
        bail!("the secret value is empty: pipe it on standard input or pass --file");
    }
    Ok(trimmed.to_owned())
}

/// `toolgate approvals` subcommands (needs an approver token, from TOOLGATE_APPROVER_TOKEN or
/// --token-file).
#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// Invocations awaiting a decision.
    List {
        #[arg(long, default_value = "")]
        run: String,
        #[arg(long, default_value = "")]
        tool: String,
        /// APPROVAL_REQUIRED, POLICY_DENIED or EXECUTION_FAILED.
        #[arg(long, default_value = "")]
        origin: String,
    },
    /// One invocation.
    Show { invocation_id: String },
    /// Approves: the call executes once, and its outcome is printed.
    Approve {
        run_id: String,
        invocation_id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Rejects: the call ends without executing.
    Reject {
        run_id: String,
        invocation_id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Lets the run move on without executing the call (it ends SKIPPED); resolves any
    /// pending invocation, a policy denial included.
    Continue {
        run_id: String,
        invocation_id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
}

fn pending_json(p: &pb::PendingInvocation) -> Value {
    json!({
        "invocation_id": p.invocation_id, "run_id": p.run_id, "tool_call_id": p.tool_call_id,
        "tool_name": p.tool_name,
        "arguments": serde_json::from_str::<Value>(&p.arguments_json).unwrap_or(Value::Null),
        "origin": p.origin, "decision": p.decision, "state": p.state, "version": p.version,
        "expires_at_ms": p.expires_at_ms, "tool_call_status": p.tool_call_status,
        "timeout_ms": p.timeout_ms,
    })
}

/// Runs an approvals subcommand.
pub(crate) async fn approvals(
    conn: Connection,
    command: ApprovalsCommand,
) -> anyhow::Result<ExitCode> {
    use toolgate_proto::v1::approval_service_client::ApprovalServiceClient;
    let (channel, header) = conn.channel(TokenRole::Approver).await?;
    let mut client = ApprovalServiceClient::new(channel);
    let h = &header;
    let (run_id, invocation_id, reason, decision) = match command {
        ApprovalsCommand::List { run, tool, origin } => {
            let request = pb::ListPendingRequest {
                run_id: run,
                tool_name: tool,
                origin,
                page_size: 0,
            };
            let r = client.list_pending(authed(request, h)).await?.into_inner();
            print_json(&json!(
                r.invocations.iter().map(pending_json).collect::<Vec<_>>()
            ));
            return Ok(ExitCode::SUCCESS);
        }
        ApprovalsCommand::Show { invocation_id } => {
            let p = client
                .get_pending(authed(pb::GetPendingRequest { invocation_id }, h))
                .await?
                .into_inner();
            print_json(&pending_json(&p));
            return Ok(ExitCode::SUCCESS);
        }
        ApprovalsCommand::Approve {
            run_id,
            invocation_id,
            reason,
        } => (run_id, invocation_id, reason, pb::ResumeDecision::Approve),
        ApprovalsCommand::Reject {
            run_id,
            invocation_id,
            reason,
        } => (run_id, invocation_id, reason, pb::ResumeDecision::Reject),
        ApprovalsCommand::Continue {
            run_id,
            invocation_id,
            reason,
        } => (run_id, invocation_id, reason, pb::ResumeDecision::Continue),
    };
    let request = pb::ResumeRequest {
        run_id,
        invocation_id,
        decision: decision.into(),
        reason,
    };
    let r = client.resume(authed(request, h)).await?.into_inner();
    let outcome = pb::ResumeOutcome::try_from(r.outcome)
        .map(|o| {
            o.as_str_name()
                .trim_start_matches("RESUME_OUTCOME_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| r.outcome.to_string());
    let result = r.result.map(|result| {
        json!({
            "status": pb::ToolCallStatus::try_from(result.status)
                .map(|s| s.as_str_name().trim_start_matches("TOOL_CALL_STATUS_").to_lowercase())
                .unwrap_or_default(),
            "result": serde_json::from_str::<Value>(&result.result_json).unwrap_or(Value::Null),
            "error_code": result.error_code,
            "error_message": result.error_message,
        })
    });
    let executed_status = result
        .as_ref()
        .and_then(|r| r["status"].as_str().map(str::to_owned));
    let code = resume_exit_code(&outcome, executed_status.as_deref());
    print_json(
        &json!({"outcome": outcome, "tool_call_id": r.tool_call_id, "expired": r.expired, "result": result}),
    );
    Ok(ExitCode::from(code))
}

/// The exit code of a decision: 0 when it applied (a rejection, a continue, an approval whose
/// execution succeeded), the call's own code when an approved execution did not succeed, and
/// [`EXIT_NOT_DECIDED`] when the decision did not apply.
fn resume_exit_code(outcome: &str, executed_status: Option<&str>) -> u8 {
    match outcome {
        "executed" => call_exit_code(executed_status.unwrap_or_default()),
        "rejected" | "continued" => 0,
        _ => EXIT_NOT_DECIDED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_mean_what_they_say() {
        let calls = [
            ("succeeded", 0),
            ("waiting_approval", EXIT_WAITING_APPROVAL),
            ("failed", EXIT_CALL_NOT_SUCCEEDED),
            ("blocked", EXIT_CALL_NOT_SUCCEEDED),
            ("timed_out", EXIT_CALL_NOT_SUCCEEDED),
            ("outcome_unknown", EXIT_CALL_NOT_SUCCEEDED),
        ];
        for (status, code) in calls {
            assert_eq!(call_exit_code(status), code, "{status}");
        }
        let decisions = [
            ("executed", Some("succeeded"), 0),
            ("executed", Some("failed"), EXIT_CALL_NOT_SUCCEEDED),
            ("rejected", None, 0),
            ("continued", None, 0),
            ("claim_lost", None, EXIT_NOT_DECIDED),
            ("policy_denial_terminal", None, EXIT_NOT_DECIDED),
            ("feature_disabled", None, EXIT_NOT_DECIDED),
        ];
        for (outcome, status, code) in decisions {
            assert_eq!(resume_exit_code(outcome, status), code, "{outcome}");
        }
        // Usage errors are clap's 2; none of ours collides with it or with 1.
        for code in [
            EXIT_CALL_NOT_SUCCEEDED,
            EXIT_WAITING_APPROVAL,
            EXIT_NOT_DECIDED,
            EXIT_CHAIN_BROKEN,
        ] {
            assert!(code > 2, "{code}");
            assert!(
                EXIT_CODES.contains(&format!("  {code}  ")),
                "{code} is documented"
            );
        }
    }
}
