//! The operator-facing service: tenants, agents, tokens, grants, flags, policies, credentials
//! and master keys, for admin tokens. A thin adapter: the operations themselves, with their
//! checks and audit, are [`crate::admin::Admin`]'s, which the console's admin pages call too.

use tonic::{Request, Response, Status};
use toolgate_ledger::{CredentialKind, CredentialRecord, Permission};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::admin_service_server::AdminService;

use super::Shared;
use crate::admin::{Admin, CredentialInput};
use crate::auth::{Caller, caller};
use crate::convert;
use crate::status::{ServiceError, status};

/// The operator-facing service.
#[derive(Debug, Clone)]
pub(crate) struct AdminApi(pub(crate) Shared);

pub(crate) fn token_info(record: &toolgate_ledger::TokenRecord) -> pb::TokenInfo {
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
        let body = request.get_ref();
        let tenant = self
            .admin(&caller)
            .create_tenant(&body.tenant_id, &body.name)
            .await?;
        Ok(Response::new(convert::tenant(&tenant)))
    }

    async fn list_tenants(
        &self,
        request: Request<pb::ListTenantsRequest>,
    ) -> Result<Response<pb::ListTenantsResponse>, Status> {
        let caller = caller(&request)?;
        let tenants = self.admin(&caller).list_tenants().await?;
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
        let agent = self
            .admin(&caller)
            .create_agent(&body.tenant_id, &body.agent_id, body.name)
            .await?;
        Ok(Response::new(convert::agent(&agent)))
    }

    async fn list_agents(
        &self,
        request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let caller = caller(&request)?;
        let agents = self
            .admin(&caller)
            .list_agents(&request.get_ref().tenant_id)
            .await?;
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
        let issued = self
            .admin(&caller)
            .create_token(&body.role, &body.tenant_id, &body.agent_id, body.label)
            .await?;
        Ok(Response::new(pb::CreateTokenResponse {
            token_id: issued.record.id,
            token: issued.secret,
        }))
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let caller = caller(&request)?;
        let tokens = self
            .admin(&caller)
            .list_tokens(&request.get_ref().tenant_id)
            .await?;
        Ok(Response::new(pb::ListTokensResponse {
            tokens: tokens.iter().map(token_info).collect(),
        }))
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        let caller = caller(&request)?;
        self.admin(&caller)
            .revoke_token(&request.get_ref().token_id)
            .await?;
        Ok(Response::new(pb::RevokeTokenResponse {}))
    }

    async fn set_permission(
        &self,
        request: Request<pb::SetPermissionRequest>,
    ) -> Result<Response<pb::Permission>, Status> {
        let caller = caller(&request)?;
        let body = request.get_ref();
        let permission = self
            .admin(&caller)
            .set_permission(
                &body.tenant_id,
                &body.agent_id,
                &body.tool_name,
                body.enabled,
            )
            .await?;
        Ok(Response::new(permission_pb(&permission)))
    }

    async fn list_permissions(
        &self,
        request: Request<pb::ListPermissionsRequest>,
    ) -> Result<Response<pb::ListPermissionsResponse>, Status> {
        let caller = caller(&request)?;
        let body = request.get_ref();
        let permissions = self
            .admin(&caller)
            .list_permissions(&body.tenant_id, &body.agent_id)
            .await?;
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
        let tenant = self
            .admin(&caller)
            .set_flag(&body.tenant_id, &body.flag, body.enabled)
            .await?;
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
        let caller = caller(&request)?;
        let body = request.into_inner();
        let (tenant, value) = self
            .admin(&caller)
            .get_flag(&body.tenant_id, &body.flag)
            .await?;
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
        let version = self
            .admin(&caller)
            .put_policy(&body.tenant_id, &body.text)
            .await?;
        Ok(Response::new(pb::PolicySet {
            tenant_id: body.tenant_id,
            version,
            text: body.text,
            created_at_ms: self.0.clock.now().0,
        }))
    }

    async fn validate_policy(
        &self,
        request: Request<pb::ValidatePolicyRequest>,
    ) -> Result<Response<pb::ValidatePolicyResponse>, Status> {
        let caller = caller(&request)?;
        let errors = self
            .admin(&caller)
            .validate_policy(&request.get_ref().text)?;
        Ok(Response::new(pb::ValidatePolicyResponse {
            valid: errors.is_empty(),
            errors,
        }))
    }

    async fn get_policy(
        &self,
        request: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::PolicySet>, Status> {
        let caller = caller(&request)?;
        let tenant = request.into_inner().tenant_id;
        let policy = self.admin(&caller).get_policy(&tenant).await?;
        Ok(Response::new(pb::PolicySet {
            tenant_id: tenant,
            version: policy.version,
            text: policy.text,
            created_at_ms: policy.created_at.0,
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
        let input = CredentialInput {
            tenant: &body.tenant_id,
            name: &body.name,
            metadata_json: &body.metadata_json,
            notes: body.notes.clone(),
        };
        let stored = self.admin(&caller).put_sealed(input, &body.value).await?;
        Ok(Response::new(secret_info(&stored)))
    }

    async fn put_secret_reference(
        &self,
        request: Request<pb::PutSecretReferenceRequest>,
    ) -> Result<Response<pb::SecretInfo>, Status> {
        let caller = caller(&request)?;
        let body = request.into_inner();
        let input = CredentialInput {
            tenant: &body.tenant_id,
            name: &body.name,
            metadata_json: &body.metadata_json,
            notes: body.notes.clone(),
        };
        let stored = self
            .admin(&caller)
            .put_reference(input, &body.reference)
            .await?;
        Ok(Response::new(secret_info(&stored)))
    }

    async fn list_secrets(
        &self,
        request: Request<pb::ListSecretsRequest>,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        let caller = caller(&request)?;
        let records = self
            .admin(&caller)
            .list_credentials(&request.get_ref().tenant_id)
            .await?;
        Ok(Response::new(pb::ListSecretsResponse {
            secrets: records.iter().map(secret_info).collect(),
        }))
    }

    async fn delete_secret(
        &self,
        request: Request<pb::DeleteSecretRequest>,
    ) -> Result<Response<pb::DeleteSecretResponse>, Status> {
        let caller = caller(&request)?;
        let body = request.get_ref();
        self.admin(&caller)
            .delete_credential(&body.tenant_id, &body.name)
            .await?;
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
    fn admin<'a>(&'a self, caller: &'a Caller) -> Admin<'a> {
        Admin::new(&self.0, caller)
    }

    /// The calling admin token as the actor of a key ring change made now.
    fn actor(&self, caller: &Caller) -> toolgate_ledger::Actor {
        toolgate_ledger::Actor::token(caller.token_id.clone(), self.0.clock.now())
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
