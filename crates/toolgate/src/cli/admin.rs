//! `toolgate admin`: tenants, agents, tokens, grants, flags and policies on a running gateway.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use serde_json::json;
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::admin_service_client::AdminServiceClient;

use super::output::{message_json, print_json, print_message, print_text};
use super::{Connection, EXIT_CHAIN_BROKEN, TokenRole};

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
        #[arg(long)]
        name: Option<String>,
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
        #[arg(long)]
        name: Option<String>,
    },
    /// Lists a tenant's agents.
    List { tenant: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Issues a token and prints it once.
    Create {
        /// The role the token grants.
        #[arg(long, value_enum)]
        role: TokenRole,
        /// The tenant (agent and approver tokens; none for admin tokens).
        #[arg(long)]
        tenant: Option<String>,
        /// Binds an agent token to one agent.
        #[arg(long)]
        agent: Option<String>,
        /// Who or what holds the token.
        #[arg(long)]
        label: Option<String>,
    },
    /// Lists tokens of a tenant (admin tokens without --tenant).
    List {
        #[arg(long)]
        tenant: Option<String>,
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
        #[arg(long)]
        agent: Option<String>,
        /// Records the grant disabled.
        #[arg(long)]
        disable: bool,
    },
    /// Lists grants.
    List {
        tenant: String,
        #[arg(long)]
        agent: Option<String>,
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
    let mut client = AdminServiceClient::new(conn.connect(TokenRole::Admin).await?);
    match command {
        AdminCommand::Tenants(TenantCommand::Create { id, name }) => {
            let request = pb::CreateTenantRequest {
                tenant_id: id,
                name: name.unwrap_or_default(),
            };
            print_message(&client.create_tenant(request).await?.into_inner())?;
        }
        AdminCommand::Tenants(TenantCommand::List) => {
            let listed = client.list_tenants(pb::ListTenantsRequest {}).await?;
            print_message(&listed.into_inner().tenants)?;
        }
        AdminCommand::Agents(AgentCommand::Create { tenant, id, name }) => {
            let request = pb::CreateAgentRequest {
                tenant_id: tenant,
                agent_id: id,
                name: name.unwrap_or_default(),
            };
            print_message(&client.create_agent(request).await?.into_inner())?;
        }
        AdminCommand::Agents(AgentCommand::List { tenant }) => {
            let request = pb::ListAgentsRequest { tenant_id: tenant };
            print_message(&client.list_agents(request).await?.into_inner().agents)?;
        }
        AdminCommand::Tokens(TokenCommand::Create {
            role,
            tenant,
            agent,
            label,
        }) => {
            let request = pb::CreateTokenRequest {
                role: role.name().to_owned(),
                tenant_id: tenant.unwrap_or_default(),
                agent_id: agent.unwrap_or_default(),
                label: label.unwrap_or_default(),
            };
            let mut printed = message_json(&client.create_token(request).await?.into_inner())?;
            printed["note"] = json!("the token is shown once; store it now");
            print_json(&printed);
        }
        AdminCommand::Tokens(TokenCommand::List { tenant }) => {
            let request = pb::ListTokensRequest {
                tenant_id: tenant.unwrap_or_default(),
            };
            print_message(&client.list_tokens(request).await?.into_inner().tokens)?;
        }
        AdminCommand::Tokens(TokenCommand::Revoke { token_id }) => {
            let request = pb::RevokeTokenRequest {
                token_id: token_id.clone(),
            };
            client.revoke_token(request).await?;
            print_json(&json!({"revoked": token_id}));
        }
        AdminCommand::Permissions(PermissionCommand::Set {
            tenant,
            tool,
            agent,
            disable,
        }) => {
            let request = pb::SetPermissionRequest {
                tenant_id: tenant,
                agent_id: agent.unwrap_or_default(),
                tool_name: tool,
                enabled: !disable,
            };
            print_message(&client.set_permission(request).await?.into_inner())?;
        }
        AdminCommand::Permissions(PermissionCommand::List { tenant, agent }) => {
            let request = pb::ListPermissionsRequest {
                tenant_id: tenant,
                agent_id: agent.unwrap_or_default(),
            };
            let listed = client.list_permissions(request).await?;
            print_message(&listed.into_inner().permissions)?;
        }
        AdminCommand::Flags(FlagCommand::Set {
            tenant,
            flag,
            enabled,
        }) => {
            let request = pb::SetFeatureFlagRequest {
                tenant_id: tenant,
                flag,
                enabled,
            };
            print_message(&client.set_feature_flag(request).await?.into_inner())?;
        }
        AdminCommand::Flags(FlagCommand::Get { tenant, flag }) => {
            let request = pb::GetFeatureFlagRequest {
                tenant_id: tenant,
                flag,
            };
            print_message(&client.get_feature_flag(request).await?.into_inner())?;
        }
        AdminCommand::Policy(PolicyCommand::Put { tenant, file }) => {
            let request = pb::PutPolicyRequest {
                tenant_id: tenant,
                text: read_policy(&file)?,
            };
            print_message(&client.put_policy(request).await?.into_inner())?;
        }
        AdminCommand::Policy(PolicyCommand::Validate { file }) => {
            let request = pb::ValidatePolicyRequest {
                text: read_policy(&file)?,
            };
            let checked = client.validate_policy(request).await?.into_inner();
            print_message(&checked)?;
            if !checked.valid {
                return Ok(ExitCode::FAILURE);
            }
        }
        AdminCommand::Policy(PolicyCommand::Get { tenant }) => {
            let request = pb::GetPolicyRequest { tenant_id: tenant };
            let policy = client.get_policy(request).await?.into_inner();
            print_text(&format!(
                "// tenant {} policy version {}\n{}",
                policy.tenant_id, policy.version, policy.text
            ));
        }
        AdminCommand::Policy(PolicyCommand::Schema) => {
            let schema = client
                .get_policy_schema(pb::GetPolicySchemaRequest {})
                .await?;
            print_text(&schema.into_inner().cedar_schema);
        }
        AdminCommand::VerifyLedger => {
            let report = client
                .verify_ledger(pb::VerifyLedgerRequest {})
                .await?
                .into_inner();
            print_message(&report)?;
            if !report.ok {
                return Ok(ExitCode::from(EXIT_CHAIN_BROKEN));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read_policy(file: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))
}
