//! Kill switches and policy sets: changed through the engine (the change applies to this
//! process at once), read by the pipeline through the caches (trusted for the cache TTL, and
//! dropped by `forget_cached_configuration` when another process changed them).

use std::sync::Arc;

use toolgate_core::{TenantId, Timestamp};
use toolgate_ledger::{Actor, TOOL_CALLING_ENABLED};
use toolgate_policy::CompiledPolicy;
use tracing::warn;

use super::Engine;
use super::caches::PolicyState;
use crate::error::EngineError;

impl Engine {
    /// Drops the cached kill switches and policies, so the next call reads them from the store:
    /// for a change another process made (a replica sharing the store).
    pub fn forget_cached_configuration(&self) {
        self.caches.forget_configuration();
    }

    /// Sets a tenant's feature flag and applies it to this process at once. `actor` is the
    /// acting admin token's id: the ledger records the change with its audit event.
    pub async fn set_flag(
        &self,
        tenant: &TenantId,
        flag: &str,
        enabled: bool,
        actor: &str,
    ) -> Result<(), EngineError> {
        let actor = Actor::token(actor, self.clock.now());
        self.store.set_flag(tenant, flag, enabled, &actor).await?;
        if flag == TOOL_CALLING_ENABLED {
            self.caches.keep_flag(tenant, enabled);
        }
        Ok(())
    }

    /// Checks Cedar text against the registered tools without storing it.
    pub fn validate_policy(&self, text: &str) -> Result<(), EngineError> {
        CompiledPolicy::compile(self.catalog.policy_schema(), text, 0)
            .map(|_| ())
            .map_err(policy_error)
    }

    /// Validates and stores a new version of a tenant's policy set, created by the admin token
    /// `created_by` (recorded with its audit event); it applies to this process at once (and
    /// to others within the cache TTL).
    pub async fn put_policy(
        &self,
        tenant: &TenantId,
        text: &str,
        created_by: &str,
    ) -> Result<i64, EngineError> {
        self.validate_policy(text)?;
        if self.store.get_tenant(tenant).await?.is_none() {
            return Err(EngineError::NotFound(format!("tenant `{tenant}`")));
        }
        let actor = Actor::token(created_by, self.clock.now());
        let version = self.store.put_policy_set(tenant, text, &actor).await?;
        let compiled = CompiledPolicy::compile(self.catalog.policy_schema(), text, version)
            .map_err(policy_error)?;
        self.caches
            .keep_policy(tenant, PolicyState::Ready(Arc::new(compiled)));
        Ok(version)
    }

    /// The policy text and version in force for a tenant (version 0: the generated default).
    pub async fn current_policy(
        &self,
        tenant: &TenantId,
    ) -> Result<(i64, String, Timestamp), EngineError> {
        match self.store.current_policy_set(tenant).await? {
            Some(set) => Ok((set.version, set.text, set.created_at)),
            None => Ok((0, self.catalog.default_policy().to_owned(), Timestamp(0))),
        }
    }

    /// The tenant's kill switch (`tool_calling_enabled`; off until an administrator turns it
    /// on), through the cache.
    pub(super) async fn tool_calling_enabled(
        &self,
        tenant: &TenantId,
    ) -> Result<bool, EngineError> {
        if let Some(enabled) = self.caches.flag(tenant) {
            return Ok(enabled);
        }
        let enabled = self
            .store
            .get_flag(tenant, TOOL_CALLING_ENABLED)
            .await?
            .unwrap_or(false);
        self.caches.keep_flag(tenant, enabled);
        Ok(enabled)
    }

    /// The tenant's policy in force, through the cache: its stored set, or the default when it
    /// has none. A stored set read again is compiled again only when its version changed.
    pub(super) async fn tenant_policy(
        &self,
        tenant: &TenantId,
    ) -> Result<PolicyState, EngineError> {
        if let Some(state) = self.caches.policy(tenant) {
            return Ok(state);
        }
        let state = match self.store.current_policy_set(tenant).await? {
            None => PolicyState::Ready(Arc::clone(&self.default_policy)),
            Some(set) => match self.caches.compiled_policy(tenant, set.version) {
                Some(policy) => PolicyState::Ready(policy),
                None => self.compile_stored(tenant, &set.text, set.version),
            },
        };
        self.caches.keep_policy(tenant, state.clone());
        Ok(state)
    }

    /// Compiles a stored policy set; one that no longer validates (the tools served changed)
    /// blocks every call of the tenant rather than letting anything through.
    fn compile_stored(&self, tenant: &TenantId, text: &str, version: i64) -> PolicyState {
        match CompiledPolicy::compile(self.catalog.policy_schema(), text, version) {
            Ok(policy) => PolicyState::Ready(Arc::new(policy)),
            Err(err) => {
                warn!(tenant = %tenant, version, error = %err, "stored policy set no longer validates; blocking calls");
                PolicyState::Broken(format!(
                    "the tenant's policy set (version {version}) no longer validates against the tools this gateway serves, so calls are blocked until an administrator uploads a valid one"
                ))
            }
        }
    }
}

fn policy_error(err: toolgate_policy::PolicyError) -> EngineError {
    EngineError::InvalidPolicy(vec![err.to_string()])
}
