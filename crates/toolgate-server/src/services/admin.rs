//! The operator-facing service: tenants, agents, tokens, grants, flags, policies, credentials
//! and master keys, for admin tokens. Every change is audited with the calling token's id.

use tonic::{Request, Response, Status};
use toolgate_core::{AgentId, SecretName, TenantId, ToolName};
use toolgate_ledger::{Actor, Agent, CredentialKind, CredentialRecord, Permission, Role, Tenant};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::admin_service_server::AdminService;

use super::Shared;
use crate::auth::{Caller, caller, issue_token};
use crate::convert::{self, parse_id};
use crate::status::{ServiceError, status};

/// The operator-facing service.
#[derive(Debug, Clone)]
pub(crate) struct AdminApi(pub(crate) Shared);

fn tenant_id(value: &str) -> Result<TenantId, ServiceError> {
    parse_id("tenant_id", value, TenantId::new)
}

fn optional_agent(value: &str) -> Result<Option<AgentId>, ServiceError> {
    if value.is_empty() {
        Ok(None)
    } else {
        parse_id("agent_id", value, AgentId::new).map(Some)
    }
}

fn token_info(record: &toolgate_ledger::TokenRecord) -> pb::TokenInfo {
    pb::TokenInfo {
        token_id: record.id.clone(),
        role: record.role.as_str().to_owned(),
        tenant_id: record
            .tenant
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        agent_id: record
            .agent
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        label: record.label.clone(),
        created_at_ms: record.created_at.0,
        revoked: record.revoked,
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn create_tenant(
        &self,
        request: Request<pb::CreateTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        let id = tenant_id(&body.tenant_id)?;
        let name = if body.name.trim().is_empty() {
            id.to_string()
        } else {
            body.name
        };
        let tenant = Tenant {
            id,
            name,
            created_at: self.0.clock.now(),
        };
        self.0
            .engine
            .store()
            .create_tenant(tenant.clone(), &self.actor(&caller))
            .await
            .map_err(status)?;
        Ok(Response::new(convert::tenant(&tenant)))
    }

    async fn list_tenants(
        &self,
        _request: Request<pb::ListTenantsRequest>,
    ) -> Result<Response<pb::ListTenantsResponse>, Status> {
        let tenants = self.0.engine.store().list_tenants().await.map_err(status)?;
        Ok(Response::new(pb::ListTenantsResponse {
            tenants: tenants.iter().map(convert::tenant).collect(),
        }))
    }

    async fn create_agent(
        &self,
        request: Request<pb::CreateAgentRequest>,
    ) -> Result<Response<pb::Agent>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        let agent = Agent {
            tenant: tenant_id(&body.tenant_id)?,
            id: parse_id("agent_id", &body.agent_id, AgentId::new)?,
            name: body.name,
            created_at: self.0.clock.now(),
        };
        self.0
            .engine
            .store()
            .create_agent(agent.clone(), &self.actor(&caller))
            .await
            .map_err(status)?;
        Ok(Response::new(convert::agent(&agent)))
    }

    async fn list_agents(
        &self,
        request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let tenant = tenant_id(&request.get_ref().tenant_id)?;
        let agents = self
            .0
            .engine
            .store()
            .list_agents(&tenant)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ListAgentsResponse {
            agents: agents.iter().map(convert::agent).collect(),
        }))
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        let role = Role::parse(&body.role).ok_or_else(|| {
            ServiceError::invalid(
                "role",
                format!("`{}` is not one of agent, approver, admin", body.role),
            )
        })?;
        let (tenant, agent) = match role {
            Role::Admin => {
                if !body.tenant_id.is_empty() || !body.agent_id.is_empty() {
                    return Err(ServiceError::InvalidArgument(
                        "admin tokens belong to no tenant: leave tenant_id and agent_id empty"
                            .to_owned(),
                    )
                    .into());
                }
                (None, None)
            }
            Role::Agent => (
                Some(tenant_id(&body.tenant_id)?),
                optional_agent(&body.agent_id)?,
            ),
            Role::Approver => {
                if !body.agent_id.is_empty() {
                    return Err(ServiceError::invalid(
                        "agent_id",
                        "approver tokens are not bound to an agent",
                    )
                    .into());
                }
                (Some(tenant_id(&body.tenant_id)?), None)
            }
        };
        let issued = issue_token(role, tenant, agent, body.label, self.0.clock.now());
        self.0
            .engine
            .store()
            .create_token(issued.record.clone(), &self.actor(&caller))
            .await
            .map_err(status)?;
        Ok(Response::new(pb::CreateTokenResponse {
            token_id: issued.record.id,
            token: issued.secret,
        }))
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let tenant = match request.get_ref().tenant_id.as_str() {
            "" => None,
            id => Some(tenant_id(id)?),
        };
        let tokens = self
            .0
            .engine
            .store()
            .list_tokens(tenant.as_ref())
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ListTokensResponse {
            tokens: tokens.iter().map(token_info).collect(),
        }))
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        let caller = caller(&request)?;
        let id = request.into_inner().token_id;
        if id.is_empty() {
            return Err(ServiceError::invalid("token_id", "required").into());
        }
        self.0
            .engine
            .store()
            .revoke_token(&id, &self.actor(&caller))
            .await
            .map_err(status)?;
        self.0.auth.forget_token(&id);
        Ok(Response::new(pb::RevokeTokenResponse {}))
    }

    async fn set_permission(
        &self,
        request: Request<pb::SetPermissionRequest>,
    ) -> Result<Response<pb::Permission>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        let tool = parse_id("tool_name", &body.tool_name, ToolName::new)?;
        if !self.0.engine.catalog().registry().contains(&tool) {
            let known: Vec<String> = self
                .0
                .engine
                .catalog()
                .registry()
                .names()
                .map(ToString::to_string)
                .collect();
            return Err(ServiceError::invalid(
                "tool_name",
                format!(
                    "`{tool}` is not served by this gateway; registered tools: {}",
                    known.join(", ")
                ),
            )
            .into());
        }
        let permission = Permission {
            tenant: tenant_id(&body.tenant_id)?,
            agent: optional_agent(&body.agent_id)?,
            tool,
            enabled: body.enabled,
            updated_at: self.0.clock.now(),
        };
        self.0
            .engine
            .store()
            .put_permission(permission.clone(), &self.actor(&caller))
            .await
            .map_err(status)?;
        Ok(Response::new(permission_pb(&permission)))
    }

    async fn list_permissions(
        &self,
        request: Request<pb::ListPermissionsRequest>,
    ) -> Result<Response<pb::ListPermissionsResponse>, Status> {
        let body = request.into_inner();
        let tenant = tenant_id(&body.tenant_id)?;
        let agent = optional_agent(&body.agent_id)?;
        let permissions = self
            .0
            .engine
            .store()
            .list_permissions(&tenant, agent.as_ref())
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ListPermissionsResponse {
            permissions: permissions.iter().map(permission_pb).collect(),
        }))
    }

    async fn set_feature_flag(
        &self,
        request: Request<pb::SetFeatureFlagRequest>,
    ) -> Result<Response<pb::FeatureFlag>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        let tenant = tenant_id(&body.tenant_id)?;
        check_flag_name(&body.flag)?;
        self.0
            .engine
            .set_flag(&tenant, &body.flag, body.enabled, &caller.token_id)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::FeatureFlag {
            tenant_id: tenant.to_string(),
            flag: body.flag,
            enabled: body.enabled,
            explicitly_set: true,
        }))
    }

    async fn get_feature_flag(
        &self,
        request: Request<pb::GetFeatureFlagRequest>,
    ) -> Result<Response<pb::FeatureFlag>, Status> {
        let body = request.into_inner();
        let tenant = tenant_id(&body.tenant_id)?;
        check_flag_name(&body.flag)?;
        let value = self
            .0
            .engine
            .store()
            .get_flag(&tenant, &body.flag)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::FeatureFlag {
            tenant_id: tenant.to_string(),
            flag: body.flag,
            enabled: value.unwrap_or(false),
            explicitly_set: value.is_some(),
        }))
    }

    async fn put_policy(
        &self,
        request: Request<pb::PutPolicyRequest>,
    ) -> Result<Response<pb::PolicySet>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        let tenant = tenant_id(&body.tenant_id)?;
        let version = self
            .0
            .engine
            .put_policy(&tenant, &body.text, &caller.token_id)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::PolicySet {
            tenant_id: tenant.to_string(),
            version,
            text: body.text,
            created_at_ms: self.0.clock.now().0,
        }))
    }

    async fn validate_policy(
        &self,
        request: Request<pb::ValidatePolicyRequest>,
    ) -> Result<Response<pb::ValidatePolicyResponse>, Status> {
        let errors = match self.0.engine.validate_policy(&request.get_ref().text) {
            Ok(()) => Vec::new(),
            Err(toolgate_engine::EngineError::InvalidPolicy(errors)) => errors,
            Err(other) => return Err(status(other)),
        };
        Ok(Response::new(pb::ValidatePolicyResponse {
            valid: errors.is_empty(),
            errors,
        }))
    }

    async fn get_policy(
        &self,
        request: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::PolicySet>, Status> {
        let tenant = tenant_id(&request.get_ref().tenant_id)?;
        let (version, text, at) = self
            .0
            .engine
            .current_policy(&tenant)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::PolicySet {
            tenant_id: tenant.to_string(),
            version,
            text,
            created_at_ms: at.0,
        }))
    }

    async fn get_policy_schema(
        &self,
        _request: Request<pb::GetPolicySchemaRequest>,
    ) -> Result<Response<pb::GetPolicySchemaResponse>, Status> {
        Ok(Response::new(pb::GetPolicySchemaResponse {
            cedar_schema: self.0.engine.catalog().policy_schema().cedar_schema_text(),
        }))
    }

    async fn verify_ledger(
        &self,
        _request: Request<pb::VerifyLedgerRequest>,
    ) -> Result<Response<pb::VerifyLedgerResponse>, Status> {
        let report = self
            .0
            .engine
            .store()
            .verify_chains()
            .await
            .map_err(status)?;
        Ok(Response::new(verify_response(&report)))
    }

    async fn put_secret(
        &self,
        request: Request<pb::PutSecretRequest>,
    ) -> Result<Response<pb::SecretInfo>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        if body.value.is_empty() {
            return Err(ServiceError::invalid("value", "must not be empty").into());
        }
        let record = self.credential(
            &caller,
            &body.tenant_id,
            &body.name,
            &body.metadata_json,
            body.notes,
        )?;
        let stored = self
            .0
            .keys
            .put_sealed(record, &body.value, &self.actor(&caller))
            .await
            .map_err(status)?;
        Ok(Response::new(secret_info(&stored)))
    }

    async fn put_secret_reference(
        &self,
        request: Request<pb::PutSecretReferenceRequest>,
    ) -> Result<Response<pb::SecretInfo>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        let reference = toolgate_secrets::Reference::parse(&body.reference)
            .map_err(|e| ServiceError::invalid("reference", e))?;
        let mut record = self.credential(
            &caller,
            &body.tenant_id,
            &body.name,
            &body.metadata_json,
            body.notes,
        )?;
        record.kind = CredentialKind::Reference;
        record.value = reference.to_string();
        record.key_id = None;
        self.0
            .keys
            .put_reference(record.clone(), &self.actor(&caller))
            .await
            .map_err(status)?;
        Ok(Response::new(secret_info(&record)))
    }

    async fn list_secrets(
        &self,
        request: Request<pb::ListSecretsRequest>,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        let tenant = tenant_id(&request.get_ref().tenant_id)?;
        let records = self
            .0
            .engine
            .store()
            .list_credentials(&tenant)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ListSecretsResponse {
            secrets: records.iter().map(secret_info).collect(),
        }))
    }

    async fn delete_secret(
        &self,
        request: Request<pb::DeleteSecretRequest>,
    ) -> Result<Response<pb::DeleteSecretResponse>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        let tenant = tenant_id(&body.tenant_id)?;
        let name = parse_id("name", &body.name, SecretName::new)?;
        self.0
            .keys
            .delete(&tenant, &name, &self.actor(&caller))
            .await
            .map_err(status)?;
        Ok(Response::new(pb::DeleteSecretResponse {}))
    }

    async fn rotate_key(
        &self,
        request: Request<pb::RotateKeyRequest>,
    ) -> Result<Response<pb::KeyRingInfo>, Status> {
        let caller = caller(&request)?;
        let ring = self
            .0
            .keys
            .rotate(&self.actor(&caller))
            .await
            .map_err(key_status)?;
        Ok(Response::new(key_ring_info(&ring)))
    }

    async fn rewrap_secrets(
        &self,
        request: Request<pb::RewrapSecretsRequest>,
    ) -> Result<Response<pb::RewrapSecretsResponse>, Status> {
        let caller = caller(&request)?;
        let (rewrapped, skipped) = self
            .0
            .keys
            .rewrap(&self.actor(&caller), &self.0.engine)
            .await
            .map_err(key_status)?;
        Ok(Response::new(pb::RewrapSecretsResponse {
            rewrapped,
            skipped,
            active_key_id: self.0.keys.vault().key_ring().active().to_string(),
        }))
    }

    async fn retire_key(
        &self,
        request: Request<pb::RetireKeyRequest>,
    ) -> Result<Response<pb::KeyRingInfo>, Status> {
        let caller = caller(&request)?;
        let id = request.into_inner().key_id;
        let ring = self
            .0
            .keys
            .retire(&id, &self.actor(&caller))
            .await
            .map_err(key_status)?;
        Ok(Response::new(key_ring_info(&ring)))
    }
}

impl AdminApi {
    /// The calling admin token as the actor of a change made now: the ledger records it (its
    /// id, never the token) in the change's audit event.
    fn actor(&self, caller: &Caller) -> Actor {
        Actor::token(caller.token_id.clone(), self.0.clock.now())
    }

    /// A credential record from request fields (value and kind filled in by the caller).
    fn credential(
        &self,
        caller: &Caller,
        tenant: &str,
        name: &str,
        metadata_json: &str,
        notes: String,
    ) -> Result<CredentialRecord, ServiceError> {
        let metadata = if metadata_json.trim().is_empty() {
            serde_json::json!({})
        } else {
            let value: serde_json::Value = serde_json::from_str(metadata_json).map_err(|e| {
                ServiceError::invalid("metadata_json", format!("not valid JSON: {e}"))
            })?;
            if !value.is_object() {
                return Err(ServiceError::invalid(
                    "metadata_json",
                    "must be a JSON object",
                ));
            }
            self.0.engine.redactor().redact_json(&value)
        };
        let now = self.0.clock.now();
        Ok(CredentialRecord {
            tenant: tenant_id(tenant)?,
            name: parse_id("name", name, SecretName::new)?,
            kind: CredentialKind::Sealed,
            value: String::new(),
            key_id: None,
            metadata,
            notes,
            created_by: caller.token_id.clone(),
            created_at: now,
            updated_at: now,
        })
    }
}

/// A key ring change that failed: a store failure by its kind (no SQL text), anything else
/// (a key that is in use, keys from the environment) as FAILED_PRECONDITION with its message.
fn key_status(error: anyhow::Error) -> Status {
    match error.downcast::<toolgate_ledger::LedgerError>() {
        Ok(ledger) => status(ledger),
        Err(other) => status(ServiceError::FailedPrecondition(format!("{other:#}"))),
    }
}

fn secret_info(record: &CredentialRecord) -> pb::SecretInfo {
    pb::SecretInfo {
        tenant_id: record.tenant.to_string(),
        name: record.name.to_string(),
        kind: record.kind.as_str().to_owned(),
        key_id: record.key_id.clone().unwrap_or_default(),
        reference: match record.kind {
            CredentialKind::Reference => record.value.clone(),
            CredentialKind::Sealed => String::new(),
        },
        metadata_json: record.metadata.to_string(),
        notes: record.notes.clone(),
        created_by: record.created_by.clone(),
        created_at_ms: record.created_at.0,
        updated_at_ms: record.updated_at.0,
    }
}

fn key_ring_info(ring: &toolgate_secrets::KeyRing) -> pb::KeyRingInfo {
    pb::KeyRingInfo {
        active_key_id: ring.active().to_string(),
        key_ids: ring.key_ids().map(ToString::to_string).collect(),
    }
}

fn verify_response(report: &toolgate_ledger::VerifyReport) -> pb::VerifyLedgerResponse {
    let problem = report.first_problem.as_ref();
    pb::VerifyLedgerResponse {
        ok: problem.is_none(),
        events_checked: report.events_checked,
        chains_checked: report.chains_checked,
        problem_tenant_id: problem.map(|p| p.chain.to_string()).unwrap_or_default(),
        problem_chain_seq: problem.map_or(0, |p| p.chain_seq),
        problem_kind: problem
            .map(|p| p.kind.as_str().to_owned())
            .unwrap_or_default(),
        problem_detail: problem.map(|p| p.detail.clone()).unwrap_or_default(),
    }
}

fn permission_pb(p: &Permission) -> pb::Permission {
    pb::Permission {
        tenant_id: p.tenant.to_string(),
        agent_id: p
            .agent
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        tool_name: p.tool.to_string(),
        enabled: p.enabled,
        updated_at_ms: p.updated_at.0,
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
