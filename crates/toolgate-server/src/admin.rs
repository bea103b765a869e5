//! Administration as both doors perform it: the gRPC `AdminService` and the console's admin
//! pages call these operations, so an input one refuses the other refuses too, with the same
//! message, and every change is recorded with the same actor (the calling admin token's id) in
//! the change's own audit event.
//!
//! Inputs are the fields as a caller typed them (ids as text, an empty agent meaning none);
//! each is checked here, naming the field that is wrong.

use toolgate_core::{AgentId, SecretName, TenantId, Timestamp, ToolName};
use toolgate_ledger::{Actor, Agent, CredentialKind, CredentialRecord, Permission, Role, Tenant};

use crate::auth::{Caller, IssuedToken, issue_token};
use crate::convert::parse_id;
use crate::services::Shared;
use crate::status::ServiceError;

/// One admin token's administrative operations.
#[derive(Debug)]
pub(crate) struct Admin<'a> {
    shared: &'a Shared,
    caller: &'a Caller,
}

/// A tenant's current policy set: its version (0 for the built-in default), text and when it
/// was stored.
#[derive(Debug)]
pub(crate) struct PolicySetView {
    pub(crate) version: i64,
    pub(crate) text: String,
    pub(crate) created_at: Timestamp,
}

/// A credential as it is put: the value (sealed text or a reference) and its description.
#[derive(Debug)]
pub(crate) struct CredentialInput<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) name: &'a str,
    pub(crate) metadata_json: &'a str,
    pub(crate) notes: String,
}

pub(crate) fn tenant_id(value: &str) -> Result<TenantId, ServiceError> {
    parse_id("tenant_id", value, TenantId::new)
}

pub(crate) fn optional_agent(value: &str) -> Result<Option<AgentId>, ServiceError> {
    if value.is_empty() {
        Ok(None)
    } else {
        parse_id("agent_id", value, AgentId::new).map(Some)
    }
}

impl<'a> Admin<'a> {
    pub(crate) fn new(shared: &'a Shared, caller: &'a Caller) -> Admin<'a> {
        Admin { shared, caller }
    }

    /// The calling admin token as the actor of a change made now: the ledger records it (its
    /// id, never the token) in the change's audit event.
    fn actor(&self) -> Actor {
        Actor::token(self.caller.token_id.clone(), self.shared.clock.now())
    }

    fn store(&self) -> &dyn toolgate_ledger::Store {
        self.shared.engine.store().as_ref()
    }

    // --- tenants and agents --------------------------------------------------------------

    pub(crate) async fn create_tenant(&self, id: &str, name: &str) -> Result<Tenant, ServiceError> {
        let id = tenant_id(id)?;
        // A blank name is the id; any other is kept as given.
        let name = if name.trim().is_empty() {
            id.to_string()
        } else {
            name.to_owned()
        };
        let tenant = Tenant {
            id,
            name,
            created_at: self.shared.clock.now(),
        };
        self.store()
            .create_tenant(tenant.clone(), &self.actor())
            .await?;
        Ok(tenant)
    }

    pub(crate) async fn list_tenants(&self) -> Result<Vec<Tenant>, ServiceError> {
        Ok(self.store().list_tenants().await?)
    }

    /// The tenant, or NOT_FOUND naming it.
    pub(crate) async fn tenant(&self, id: &str) -> Result<Tenant, ServiceError> {
        let id = tenant_id(id)?;
        self.store()
            .get_tenant(&id)
            .await?
            .ok_or_else(|| ServiceError::NotFound(format!("tenant `{id}`")))
    }

    pub(crate) async fn create_agent(
        &self,
        tenant: &str,
        id: &str,
        name: String,
    ) -> Result<Agent, ServiceError> {
        let agent = Agent {
            tenant: tenant_id(tenant)?,
            id: parse_id("agent_id", id, AgentId::new)?,
            name,
            created_at: self.shared.clock.now(),
        };
        self.store()
            .create_agent(agent.clone(), &self.actor())
            .await?;
        Ok(agent)
    }

    pub(crate) async fn list_agents(&self, tenant: &str) -> Result<Vec<Agent>, ServiceError> {
        Ok(self.store().list_agents(&tenant_id(tenant)?).await?)
    }

    // --- tokens --------------------------------------------------------------------------

    /// Issues a token; the secret is in the answer only.
    pub(crate) async fn create_token(
        &self,
        role: &str,
        tenant: &str,
        agent: &str,
        label: String,
    ) -> Result<IssuedToken, ServiceError> {
        let role = Role::parse(role).ok_or_else(|| {
            ServiceError::invalid(
                "role",
                format!("`{role}` is not one of agent, approver, admin"),
            )
        })?;
        let (tenant, agent) = match role {
            Role::Admin => {
                if !tenant.is_empty() || !agent.is_empty() {
                    return Err(ServiceError::InvalidArgument(
                        "admin tokens belong to no tenant: leave tenant_id and agent_id empty"
                            .to_owned(),
                    ));
                }
                (None, None)
            }
            Role::Agent => (Some(tenant_id(tenant)?), optional_agent(agent)?),
            Role::Approver => {
                if !agent.is_empty() {
                    return Err(ServiceError::invalid(
                        "agent_id",
                        "approver tokens are not bound to an agent",
                    ));
                }
                (Some(tenant_id(tenant)?), None)
            }
        };
        let issued = issue_token(role, tenant, agent, label, self.shared.clock.now());
        self.store()
            .create_token(issued.record.clone(), &self.actor())
            .await?;
        Ok(issued)
    }

    /// Tokens of one tenant, or of all (an empty `tenant`).
    pub(crate) async fn list_tokens(
        &self,
        tenant: &str,
    ) -> Result<Vec<toolgate_ledger::TokenRecord>, ServiceError> {
        let tenant = match tenant {
            "" => None,
            id => Some(tenant_id(id)?),
        };
        Ok(self.store().list_tokens(tenant.as_ref()).await?)
    }

    /// Revokes a token; this process forgets it at once (others within their cache TTL, or at
    /// once on PostgreSQL through the change notification).
    pub(crate) async fn revoke_token(&self, id: &str) -> Result<(), ServiceError> {
        if id.is_empty() {
            return Err(ServiceError::invalid("token_id", "required"));
        }
        self.store().revoke_token(id, &self.actor()).await?;
        self.shared.auth.forget_token(id);
        Ok(())
    }

    // --- grants, flags, policies ---------------------------------------------------------

    /// Grants (or withdraws) a tool to a tenant or one of its agents; the tool must be one
    /// this gateway serves.
    pub(crate) async fn set_permission(
        &self,
        tenant: &str,
        agent: &str,
        tool: &str,
        enabled: bool,
    ) -> Result<Permission, ServiceError> {
        let tool = parse_id("tool_name", tool, ToolName::new)?;
        let registry = self.shared.engine.catalog().registry();
        if !registry.contains(&tool) {
            let known: Vec<String> = registry.names().map(ToString::to_string).collect();
            return Err(ServiceError::invalid(
                "tool_name",
                format!(
                    "`{tool}` is not served by this gateway; registered tools: {}",
                    known.join(", ")
                ),
            ));
        }
        let permission = Permission {
            tenant: tenant_id(tenant)?,
            agent: optional_agent(agent)?,
            tool,
            enabled,
            updated_at: self.shared.clock.now(),
        };
        self.store()
            .put_permission(permission.clone(), &self.actor())
            .await?;
        Ok(permission)
    }

    pub(crate) async fn list_permissions(
        &self,
        tenant: &str,
        agent: &str,
    ) -> Result<Vec<Permission>, ServiceError> {
        let tenant = tenant_id(tenant)?;
        let agent = optional_agent(agent)?;
        Ok(self
            .store()
            .list_permissions(&tenant, agent.as_ref())
            .await?)
    }

    /// Sets a feature flag (the kill switch is `tool_calling_enabled`); it applies to this
    /// process at once.
    pub(crate) async fn set_flag(
        &self,
        tenant: &str,
        flag: &str,
        enabled: bool,
    ) -> Result<TenantId, ServiceError> {
        let tenant = tenant_id(tenant)?;
        check_flag_name(flag)?;
        self.shared
            .engine
            .set_flag(&tenant, flag, enabled, &self.caller.token_id)
            .await?;
        Ok(tenant)
    }

    /// A flag's value and whether it was ever set (an unset flag is off).
    pub(crate) async fn get_flag(
        &self,
        tenant: &str,
        flag: &str,
    ) -> Result<(TenantId, Option<bool>), ServiceError> {
        let tenant = tenant_id(tenant)?;
        check_flag_name(flag)?;
        let value = self.store().get_flag(&tenant, flag).await?;
        Ok((tenant, value))
    }

    /// Validates and stores a new version of a tenant's policy set.
    pub(crate) async fn put_policy(&self, tenant: &str, text: &str) -> Result<i64, ServiceError> {
        let tenant = tenant_id(tenant)?;
        Ok(self
            .shared
            .engine
            .put_policy(&tenant, text, &self.caller.token_id)
            .await?)
    }

    /// What is wrong with a policy text (each message names the line and column); empty when
    /// it validates against the registered tools.
    pub(crate) fn validate_policy(&self, text: &str) -> Result<Vec<String>, ServiceError> {
        match self.shared.engine.validate_policy(text) {
            Ok(()) => Ok(Vec::new()),
            Err(toolgate_engine::EngineError::InvalidPolicy(errors)) => Ok(errors),
            Err(other) => Err(other.into()),
        }
    }

    pub(crate) async fn get_policy(&self, tenant: &str) -> Result<PolicySetView, ServiceError> {
        let tenant = tenant_id(tenant)?;
        let (version, text, created_at) = self.shared.engine.current_policy(&tenant).await?;
        Ok(PolicySetView {
            version,
            text,
            created_at,
        })
    }

    // --- credentials ---------------------------------------------------------------------

    /// Seals `value` under the active master key and stores it.
    pub(crate) async fn put_sealed(
        &self,
        input: CredentialInput<'_>,
        value: &str,
    ) -> Result<CredentialRecord, ServiceError> {
        if value.is_empty() {
            return Err(ServiceError::invalid("value", "must not be empty"));
        }
        let record = self.credential(input)?;
        self.shared
            .keys
            .put_sealed(record, value, &self.actor())
            .await
            .map_err(ServiceError::from)
    }

    /// Stores a reference (`env:NAME`, `file:/path`) read when a tool needs it.
    pub(crate) async fn put_reference(
        &self,
        input: CredentialInput<'_>,
        reference: &str,
    ) -> Result<CredentialRecord, ServiceError> {
        let reference = toolgate_secrets::Reference::parse(reference)
            .map_err(|e| ServiceError::invalid("reference", e))?;
        let mut record = self.credential(input)?;
        record.kind = CredentialKind::Reference;
        record.value = reference.to_string();
        record.key_id = None;
        self.shared
            .keys
            .put_reference(record.clone(), &self.actor())
            .await?;
        Ok(record)
    }

    pub(crate) async fn list_credentials(
        &self,
        tenant: &str,
    ) -> Result<Vec<CredentialRecord>, ServiceError> {
        Ok(self.store().list_credentials(&tenant_id(tenant)?).await?)
    }

    pub(crate) async fn delete_credential(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<(), ServiceError> {
        let tenant = tenant_id(tenant)?;
        let name = parse_id("name", name, SecretName::new)?;
        self.shared
            .keys
            .delete(&tenant, &name, &self.actor())
            .await?;
        Ok(())
    }

    /// A credential record from the typed fields (value and kind filled in by the caller).
    fn credential(&self, input: CredentialInput<'_>) -> Result<CredentialRecord, ServiceError> {
        let metadata = if input.metadata_json.trim().is_empty() {
            serde_json::json!({})
        } else {
            let value: serde_json::Value =
                serde_json::from_str(input.metadata_json).map_err(|e| {
                    ServiceError::invalid("metadata_json", format!("not valid JSON: {e}"))
                })?;
            if !value.is_object() {
                return Err(ServiceError::invalid(
                    "metadata_json",
                    "must be a JSON object",
                ));
            }
            self.shared.engine.redactor().redact_json(&value)
        };
        let now = self.shared.clock.now();
        Ok(CredentialRecord {
            tenant: tenant_id(input.tenant)?,
            name: parse_id("name", input.name, SecretName::new)?,
            kind: CredentialKind::Sealed,
            value: String::new(),
            key_id: None,
            metadata,
            notes: input.notes,
            created_by: self.caller.token_id.clone(),
            created_at: now,
            updated_at: now,
        })
    }
}

fn check_flag_name(flag: &str) -> Result<(), ServiceError> {
    let valid = !flag.is_empty()
        && flag.len() <= 64
        && flag
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(ServiceError::invalid(
            "flag",
            format!(
                "`{}` must be 1 to 64 of a-z, 0-9 and _ (e.g. tool_calling_enabled)",
                flag.chars().take(64).collect::<String>()
            ),
        ))
    }
}
