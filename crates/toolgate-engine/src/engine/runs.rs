//! Runs: opening one (its manifest fixed from the enabled grants), reading it, and the tools
//! it may call. The pipeline reads runs through the run cache.

use std::sync::Arc;

use toolgate_core::{AgentId, RunId, TenantId, ToolName, ToolSpec};
use toolgate_ledger::{RunRecord, RunStatus};

use super::Engine;
use crate::error::EngineError;
use crate::outcome::CreateRun;

impl Engine {
    /// Opens a run. Its manifest is every enabled grant of the tenant and of the agent. A grant
    /// naming a tool this gateway does not serve is an error, so a misconfiguration is found
    /// when the run opens rather than when the LLM first reaches for the tool.
    pub async fn create_run(&self, request: CreateRun) -> Result<RunRecord, EngineError> {
        let CreateRun {
            tenant,
            agent,
            run,
            max_calls,
        } = request;
        if self.store.get_agent(&tenant, &agent).await?.is_none() {
            return Err(EngineError::NotFound(format!("agent `{agent}`")));
        }
        let run_id = match run {
            Some(id) => {
                self.refuse_secret_id("run_id", &id)
                    .map_err(EngineError::InvalidRequest)?;
                RunId::new(id).map_err(|e| EngineError::InvalidRequest(e.to_string()))?
            }
            None => RunId::new(format!("run_{}", uuid::Uuid::now_v7().simple()))
                .map_err(|e| EngineError::InvalidRequest(e.to_string()))?,
        };
        let max_calls = match max_calls {
            None | Some(0) => self.config.default_max_calls,
            Some(n) if n > self.config.max_calls_limit => {
                return Err(EngineError::InvalidRequest(format!(
                    "max_calls {n} is above this gateway's limit of {}",
                    self.config.max_calls_limit
                )));
            }
            Some(n) => n,
        };
        let manifest = self.manifest_of(&tenant, &agent).await?;
        let record = RunRecord {
            tenant: tenant.clone(),
            id: run_id.clone(),
            agent,
            manifest,
            status: RunStatus::Active,
            calls_used: 0,
            max_calls: i64::from(max_calls),
            pending_approvals: 0,
            created_at: self.clock.now(),
        };
        self.store.create_run(record.clone()).await?;
        self.caches.keep_run(Arc::new(record.clone()));
        Ok(record)
    }

    /// A run of `tenant`, fresh from the store.
    pub async fn get_run(&self, tenant: &TenantId, run: &RunId) -> Result<RunRecord, EngineError> {
        self.store
            .get_run(tenant, run)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("run `{run}`")))
    }

    /// The specs of the tools a run may call.
    pub async fn list_tools(
        &self,
        tenant: &TenantId,
        agent: Option<&AgentId>,
        run: &RunId,
    ) -> Result<Vec<Arc<ToolSpec>>, EngineError> {
        let run = self.cached_run(tenant, run).await?;
        if agent.is_some_and(|a| *a != run.agent) {
            return Err(EngineError::NotFound(format!("run `{}`", run.id)));
        }
        Ok(run
            .manifest
            .iter()
            .filter_map(|name| self.catalog.registry().get(name.as_str()).ok())
            .map(|(spec, _)| Arc::clone(spec))
            .collect())
    }

    /// A run, from the cache or else the store. What callers read of it (manifest, agent) is
    /// fixed when it opens, so a cached run never goes stale where it matters.
    pub(super) async fn cached_run(
        &self,
        tenant: &TenantId,
        run: &RunId,
    ) -> Result<Arc<RunRecord>, EngineError> {
        if let Some(found) = self.caches.run(tenant, run) {
            return Ok(found);
        }
        let record = self
            .store
            .get_run(tenant, run)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("run `{run}`")))?;
        let record = Arc::new(record);
        self.caches.keep_run(Arc::clone(&record));
        Ok(record)
    }

    /// The sorted, distinct tools of the enabled grants of `tenant` and of `agent`; a grant
    /// of a tool no connector here serves is refused, naming the tools that are served.
    async fn manifest_of(
        &self,
        tenant: &TenantId,
        agent: &AgentId,
    ) -> Result<Vec<ToolName>, EngineError> {
        let permissions = self.store.list_permissions(tenant, Some(agent)).await?;
        let mut manifest: Vec<ToolName> = Vec::new();
        for permission in permissions.into_iter().filter(|p| p.enabled) {
            if !self.catalog.registry().contains(&permission.tool) {
                let known: Vec<String> = self
                    .catalog
                    .registry()
                    .names()
                    .map(ToString::to_string)
                    .collect();
                return Err(EngineError::FailedPrecondition(format!(
                    "a permission grants `{}`, which no connector on this gateway serves (registered tools: {}); disable or delete that permission",
                    permission.tool,
                    known.join(", ")
                )));
            }
            if !manifest.contains(&permission.tool) {
                manifest.push(permission.tool);
            }
        }
        manifest.sort();
        Ok(manifest)
    }
}
