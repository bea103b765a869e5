//! The engine: runs, tool listing, and the execution pipeline.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use toolgate_core::{
    AgentId, Clock, Connector, CorrelationId, Decision, ErrorCode, InvocationContext, Redactor,
    RiskLevel, RunId, Sealer, SecretError, SecretSource, Secrets, TenantId, Timestamp, ToolCallId,
    ToolCallStatus, ToolError, ToolName, ToolSpec, ToolUseId,
};
use toolgate_ledger::{
    Actor, FinishCall, NewAuditEvent, NewCall, PendingArguments, PendingInvocation, PendingOrigin,
    PendingState, PolicyDecisionRecord, RunRecord, RunStatus, Store, TOOL_CALLING_ENABLED,
    ToolCallRecord,
};
use toolgate_policy::{CompiledPolicy, PolicyDecision, PolicyRequest};
use tracing::{debug, warn};

mod answers;
mod resume;

use crate::catalog::{Catalog, parse_llm_tool_name};
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::invoke::{Invocation, invoke};
use crate::outcome::{CreateRun, ExecuteOutcome, ExecuteRequest};

/// Longest tool name kept verbatim in the ledger for a call naming an unknown tool.
const MAX_RECORDED_NAME: usize = 128;

/// How many characters of arguments that are not JSON the ledger keeps (redacted).
const UNPARSED_EXCERPT_CHARS: usize = 1024;

/// A decision and risk level, as reported in outcomes.
type Verdict = (Decision, RiskLevel);

/// The chokepoint. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Engine {
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
    redactor: Redactor,
    secrets: Option<Arc<dyn SecretSource>>,
    /// Seals each call's full answer for replays; without one, replays get the ledger's
    /// redacted copy.
    sealer: Option<Arc<dyn Sealer>>,
    config: EngineConfig,
    default_policy: Arc<CompiledPolicy>,
    runs: RwLock<HashMap<(TenantId, RunId), Arc<RunRecord>>>,
    flags: RwLock<HashMap<TenantId, (bool, Instant)>>,
    policies: RwLock<HashMap<TenantId, (PolicyState, Instant)>>,
    /// Bumped after every write that appends run events, so watchers re-read at once instead
    /// of waiting for their next poll; also on every commit of another process sharing the
    /// store, when the store reports those (PostgreSQL).
    events_written: Arc<tokio::sync::watch::Sender<u64>>,
}

/// A tenant's policy as loaded: compiled, or refused (then every call is blocked, fail closed).
#[derive(Clone)]
enum PolicyState {
    Ready(Arc<CompiledPolicy>),
    Broken(String),
}

/// The most runs kept in the in-memory run cache before it is emptied.
const RUN_CACHE_LIMIT: usize = 100_000;

impl Engine {
    /// An engine over `store` serving the tools of `catalog`.
    pub fn new(
        store: Arc<dyn Store>,
        catalog: Arc<Catalog>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let default_policy =
            CompiledPolicy::compile(catalog.policy_schema(), catalog.default_policy(), 0).map_err(
                |err| {
                    EngineError::FailedPrecondition(format!(
                        "the generated default policy does not validate: {err}"
                    ))
                },
            )?;
        Ok(Engine::forward_store_commits(Engine {
            store,
            catalog,
            clock,
            redactor: Redactor::new(),
            secrets: None,
            sealer: None,
            config,
            default_policy: Arc::new(default_policy),
            runs: RwLock::new(HashMap::new()),
            flags: RwLock::new(HashMap::new()),
            policies: RwLock::new(HashMap::new()),
            events_written: Arc::new(tokio::sync::watch::Sender::new(0)),
        }))
    }

    /// Sets where tenant secrets come from. Without one, a tool that declares secrets fails
    /// with `CREDENTIALS_UNAVAILABLE`.
    #[must_use]
    pub fn with_secrets(mut self, secrets: Arc<dyn SecretSource>) -> Engine {
        self.secrets = Some(secrets);
        self
    }

    /// Sets what seals each call's full answer (the key ring), kept for replays for
    /// `EngineConfig::answer_retention`.
    #[must_use]
    pub fn with_sealer(mut self, sealer: Arc<dyn Sealer>) -> Engine {
        self.sealer = Some(sealer);
        self
    }

    /// The tools served.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Relays the store's commit notifications (other replicas' writes) to watchers, for as
    /// long as both the engine and the store's feed live. Needs a Tokio runtime; without one
    /// watchers still see other processes' events by polling.
    fn forward_store_commits(self) -> Engine {
        if let Some(mut commits) = self.store.subscribe_commits()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let announce = Arc::downgrade(&self.events_written);
            runtime.spawn(async move {
                while commits.changed().await.is_ok() {
                    let Some(sender) = announce.upgrade() else {
                        return;
                    };
                    sender.send_modify(|count| *count = count.wrapping_add(1));
                }
            });
        }
        self
    }

    /// Drops the cached kill switches and policies, so the next call reads them from the store:
    /// for a change another process made (a replica sharing the store).
    pub fn forget_cached_configuration(&self) {
        self.flags.write().expect("flag cache lock").clear();
        self.policies.write().expect("policy cache lock").clear();
    }

    /// Changes whenever this engine has committed run events: a cue for watchers to re-read
    /// the ledger (which stays the source of truth, also for events of other processes).
    pub fn subscribe_events(&self) -> tokio::sync::watch::Receiver<u64> {
        self.events_written.subscribe()
    }

    fn announce_events(&self) {
        self.events_written
            .send_modify(|count| *count = count.wrapping_add(1));
    }

    /// The redactor everything stored passes through.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    // --- runs ----------------------------------------------------------------------------

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
        let permissions = self.store.list_permissions(&tenant, Some(&agent)).await?;
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
        self.cache_run(Arc::new(record.clone()));
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

    async fn cached_run(
        &self,
        tenant: &TenantId,
        run: &RunId,
    ) -> Result<Arc<RunRecord>, EngineError> {
        let key = (tenant.clone(), run.clone());
        if let Some(found) = self.runs.read().expect("run cache lock").get(&key) {
            return Ok(Arc::clone(found));
        }
        let record = self
            .store
            .get_run(tenant, run)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("run `{run}`")))?;
        let record = Arc::new(record);
        self.cache_run(Arc::clone(&record));
        Ok(record)
    }

    fn cache_run(&self, run: Arc<RunRecord>) {
        let mut runs = self.runs.write().expect("run cache lock");
        if runs.len() >= RUN_CACHE_LIMIT {
            runs.clear();
        }
        runs.insert((run.tenant.clone(), run.id.clone()), run);
    }

    // --- flags and policies ----------------------------------------------------------------

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
            self.flags
                .write()
                .expect("flag cache lock")
                .insert(tenant.clone(), (enabled, Instant::now()));
        }
        Ok(())
    }

    async fn tool_calling_enabled(&self, tenant: &TenantId) -> Result<bool, EngineError> {
        if let Some((enabled, at)) = self.flags.read().expect("flag cache lock").get(tenant)
            && at.elapsed() < self.config.cache_ttl
        {
            return Ok(*enabled);
        }
        let enabled = self
            .store
            .get_flag(tenant, TOOL_CALLING_ENABLED)
            .await?
            .unwrap_or(false);
        self.flags
            .write()
            .expect("flag cache lock")
            .insert(tenant.clone(), (enabled, Instant::now()));
        Ok(enabled)
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
        self.policies.write().expect("policy cache lock").insert(
            tenant.clone(),
            (PolicyState::Ready(Arc::new(compiled)), Instant::now()),
        );
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

    async fn policy(&self, tenant: &TenantId) -> Result<PolicyState, EngineError> {
        if let Some((state, at)) = self.policies.read().expect("policy cache lock").get(tenant)
            && at.elapsed() < self.config.cache_ttl
        {
            return Ok(state.clone());
        }
        let state = match self.store.current_policy_set(tenant).await? {
            None => PolicyState::Ready(Arc::clone(&self.default_policy)),
            Some(set) => {
                let cached_version =
                    match self.policies.read().expect("policy cache lock").get(tenant) {
                        Some((PolicyState::Ready(policy), _))
                            if policy.version() == set.version =>
                        {
                            Some(Arc::clone(policy))
                        }
                        _ => None,
                    };
                match cached_version {
                    Some(policy) => PolicyState::Ready(policy),
                    None => match CompiledPolicy::compile(
                        self.catalog.policy_schema(),
                        &set.text,
                        set.version,
                    ) {
                        Ok(policy) => PolicyState::Ready(Arc::new(policy)),
                        Err(err) => {
                            warn!(tenant = %tenant, version = set.version, error = %err, "stored policy set no longer validates; blocking calls");
                            PolicyState::Broken(format!(
                                "the tenant's policy set (version {}) no longer validates against the tools this gateway serves, so calls are blocked until an administrator uploads a valid one",
                                set.version
                            ))
                        }
                    },
                }
            }
        };
        self.policies
            .write()
            .expect("policy cache lock")
            .insert(tenant.clone(), (state.clone(), Instant::now()));
        Ok(state)
    }

    // --- recovery --------------------------------------------------------------------------

    /// Settles the calls a crash interrupted: every call still `running` whose gateway process
    /// is gone (see `Store::list_running_calls`) becomes `outcome_unknown` (audited), because
    /// the vendor may or may not have acted. Nothing is executed again automatically. Call at
    /// start-up before serving, and periodically when replicas share the store.
    pub async fn recover_interrupted_calls(&self) -> Result<u64, EngineError> {
        const PAGE: u32 = 500;
        let mut settled = 0;
        loop {
            let running = self.store.list_running_calls(PAGE).await?;
            if running.is_empty() {
                return Ok(settled);
            }
            let mut progressed = false;
            for call in running {
                let error = ToolError::new(
                    ErrorCode::OutcomeUnknown,
                    "the gateway stopped while this call was running: the vendor may or may not have acted, so check before retrying",
                );
                let event = self.event(
                    &call,
                    "tool_call.outcome_unknown",
                    json!({"tool": call.tool, "reason": "gateway_restarted"}),
                );
                let finish = FinishCall {
                    tenant: call.tenant.clone(),
                    id: call.id.clone(),
                    status: ToolCallStatus::OutcomeUnknown,
                    output_redacted: None,
                    error_code: Some(error.code),
                    error_text: Some(error.message),
                    duration_ms: 0,
                    attempts: call.attempts,
                    at: self.clock.now(),
                    answer: None,
                    events: vec![event],
                };
                if self.store.finish_call(finish).await? {
                    settled += 1;
                    progressed = true;
                    warn!(tool_call_id = %call.id, tool = %call.tool, "interrupted call marked outcome_unknown");
                }
            }
            if !progressed {
                return Ok(settled);
            }
        }
    }

    // --- calls -----------------------------------------------------------------------------

    /// One recorded call of `tenant`.
    pub async fn get_tool_call(
        &self,
        tenant: &TenantId,
        id: &ToolCallId,
    ) -> Result<ToolCallRecord, EngineError> {
        self.store
            .get_tool_call(tenant, id)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("tool call `{id}`")))
    }

    /// Executes one tool call through the whole pipeline.
    ///
    /// Tool failures (refusals, invalid arguments, vendor errors, timeouts) are `Ok` outcomes:
    /// they are normal results the LLM can explain. `Err` means the request itself could not
    /// be served (malformed ids, an unknown run, a reused tool_use_id, the ledger failing).
    pub async fn execute(&self, request: ExecuteRequest) -> Result<ExecuteOutcome, EngineError> {
        let requested_at = self.clock.now();
        let ids = match self.parse_ids(&request) {
            Ok(ids) => ids,
            Err(message) => {
                self.audit_rejected(&request, &message, requested_at)
                    .await?;
                return Err(EngineError::InvalidRequest(message));
            }
        };
        let run = match self.cached_run(&request.tenant, &ids.run).await {
            Ok(run) if request.agent.as_ref().is_none_or(|a| *a == run.agent) => run,
            Ok(_) | Err(EngineError::NotFound(_)) => {
                let message = format!("run `{}` not found", ids.run);
                self.audit_rejected(&request, &message, requested_at)
                    .await?;
                return Err(EngineError::NotFound(format!("run `{}`", ids.run)));
            }
            Err(other) => return Err(other),
        };

        // A name the redactor would change is no tool's name (it may be a credential pasted
        // in the wrong place): it is recorded redacted, and the call refused as not allowed.
        let parsed_name = parse_llm_tool_name(&request.tool)
            .filter(|name| self.redactor.redact_text(name.as_str()) == name.as_str());
        let recorded_name = match &parsed_name {
            Some(name) => name.to_string(),
            None => self.recorded_text(&request.tool, MAX_RECORDED_NAME),
        };
        let arguments = self.parse_arguments(&request.arguments_json);
        let (args_hash, input_redacted) = match &arguments {
            Ok(value) => (hash_json(value), self.redactor.redact_json(value)),
            Err(_) => (
                String::new(),
                self.redacted_raw_arguments(&request.arguments_json),
            ),
        };
        let call_id = ToolCallId::new(format!("tc_{}", uuid::Uuid::now_v7().simple()))
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let mut call = ToolCallRecord {
            id: call_id.clone(),
            tenant: request.tenant.clone(),
            run: run.id.clone(),
            agent: run.agent.clone(),
            tool: recorded_name.clone(),
            action: parsed_name.as_ref().map(|n| n.action().to_owned()),
            tool_use_id: ids.tool_use_id.clone(),
            correlation_id: ids.correlation_id.clone(),
            status: ToolCallStatus::Running,
            args_hash,
            input_redacted,
            output_redacted: None,
            error_code: None,
            error_text: None,
            policy_decision_id: None,
            risk_level: None,
            duration_ms: None,
            attempts: 0,
            evaluation: 1,
            created_at: requested_at,
            updated_at: requested_at,
        };
        // Step 1: the request is audited in the same transaction as whatever happens to it.
        let requested = self.event(
            &call,
            "tool_call.requested",
            json!({
                "tool": recorded_name,
                "tool_use_id": ids.tool_use_id.as_ref().map(ToString::to_string),
                "correlation_id": ids.correlation_id.to_string(),
            }),
        );

        // Step 2: the tenant's kill switch.
        if !self.tool_calling_enabled(&request.tenant).await? {
            let error = ToolError::new(
                ErrorCode::FeatureDisabled,
                "tool execution is not enabled for this organization; an administrator can turn on the `tool_calling_enabled` flag",
            );
            return self
                .refuse(
                    call,
                    requested,
                    ToolCallStatus::Blocked,
                    error,
                    "feature_disabled",
                    None,
                    None,
                )
                .await;
        }

        // Step 3: the run's manifest.
        let in_manifest = parsed_name
            .as_ref()
            .is_some_and(|name| run.manifest.contains(name));
        if !in_manifest {
            let available: Vec<&str> = run.manifest.iter().map(ToolName::as_str).collect();
            let error = ToolError::new(
                ErrorCode::NotInManifest,
                format!(
                    "tool `{}` is not allowed in this run; allowed tools: {}",
                    recorded_name,
                    if available.is_empty() {
                        "none".to_owned()
                    } else {
                        available.join(", ")
                    }
                ),
            );
            return self
                .refuse(
                    call,
                    requested,
                    ToolCallStatus::Blocked,
                    error,
                    "not_in_manifest",
                    None,
                    None,
                )
                .await;
        }
        let Some(name) = parsed_name else {
            // Unreachable in practice: an unparsable name is never in a manifest.
            return Err(EngineError::InvalidRequest(format!(
                "invalid tool name `{recorded_name}`"
            )));
        };

        // Step 4: resolve the tool to a connector.
        let (spec, connector) = match self.catalog.registry().get(name.as_str()) {
            Ok((spec, connector)) => (Arc::clone(spec), Arc::clone(connector)),
            Err(unknown) => {
                let error = ToolError::new(ErrorCode::UnknownTool, unknown.to_string());
                return self
                    .refuse(
                        call,
                        requested,
                        ToolCallStatus::Failed,
                        error,
                        "unknown_tool",
                        None,
                        None,
                    )
                    .await;
            }
        };

        // Step 5: the arguments.
        let arguments = match arguments {
            Ok(value) => value,
            Err(message) => {
                let error = ToolError::new(ErrorCode::InvalidArguments, message);
                return self
                    .refuse(
                        call,
                        requested,
                        ToolCallStatus::Failed,
                        error,
                        "invalid_arguments",
                        None,
                        None,
                    )
                    .await;
            }
        };
        if let Err(message) = self.catalog.validate(&name, &arguments) {
            let error = ToolError::new(ErrorCode::InvalidArguments, message);
            return self
                .refuse(
                    call,
                    requested,
                    ToolCallStatus::Failed,
                    error,
                    "invalid_arguments",
                    None,
                    None,
                )
                .await;
        }

        // Step 6: policy.
        let policy = match self.policy(&request.tenant).await? {
            PolicyState::Ready(policy) => policy,
            PolicyState::Broken(reason) => {
                let error = ToolError::new(ErrorCode::PolicyBlocked, reason);
                return self
                    .refuse(
                        call,
                        requested,
                        ToolCallStatus::Blocked,
                        error,
                        "policy_unavailable",
                        None,
                        None,
                    )
                    .await;
            }
        };
        let decision = policy.evaluate(&PolicyRequest {
            tenant: &request.tenant,
            agent: &run.agent,
            run: &run.id,
            tool: &spec,
            arguments: &arguments,
        });
        let decision_record = self.decision_record(&call, &name, &decision);
        call.policy_decision_id = Some(decision_record.id.clone());
        call.risk_level = Some(decision.risk);

        // The per-call timeout the agent asked for (`None`: the tool's default), kept with a
        // suspended call so that its approved execution honours it.
        let requested_timeout = request
            .timeout
            .filter(|t| !t.is_zero())
            .map(|t| t.min(self.config.max_timeout));
        if decision.decision == Decision::Block {
            let denied = self.pending_for(
                &call,
                &run,
                &name,
                arguments,
                &decision,
                PendingOrigin::PolicyDenied,
                requested_timeout,
            );
            let error = ToolError::new(
                ErrorCode::PolicyBlocked,
                format!("policy blocked this call: {}", decision.reason),
            );
            return self
                .refuse(
                    call,
                    requested,
                    ToolCallStatus::Blocked,
                    error,
                    "policy_blocked",
                    Some((decision_record, &decision)),
                    Some(denied),
                )
                .await;
        }

        // Step 7: suspend calls that need a human.
        if decision.decision.needs_approval() {
            return self
                .suspend(
                    call,
                    requested,
                    decision_record,
                    &decision,
                    &run,
                    &name,
                    arguments,
                    requested_timeout,
                )
                .await;
        }

        // Step 8: the `running` row, durable before the connector is called.
        call.status = ToolCallStatus::Running;
        let new_call = NewCall {
            call: call.clone(),
            count_against_budget: true,
            decision: Some(decision_record),
            pending: None,
            events: vec![requested],
        };
        if let Some(answer) = self.record(new_call, &mut call).await? {
            return answer;
        }

        let timeout = request
            .timeout
            .filter(|t| !t.is_zero())
            .unwrap_or(spec.default_timeout)
            .min(self.config.max_timeout);
        self.run_connector(
            &call,
            &spec,
            connector,
            arguments,
            timeout,
            (decision.decision, decision.risk),
        )
        .await
    }

    /// Steps 9 to 13 for a call whose `running` row is committed: credentials, the connector
    /// under the deadline, normalization, the terminal record.
    async fn run_connector(
        &self,
        call: &ToolCallRecord,
        spec: &ToolSpec,
        connector: Arc<dyn Connector>,
        arguments: Value,
        timeout: Duration,
        verdict: Verdict,
    ) -> Result<ExecuteOutcome, EngineError> {
        // Step 9: credentials, only those the tool declares, for this tenant.
        let secrets = match self.resolve_secrets(&call.tenant, spec).await {
            Ok(secrets) => secrets,
            Err(err) => {
                // Absent is not the same as unreadable (undecryptable, unresolved, store down).
                let code = match err {
                    SecretError::Missing(_) => ErrorCode::CredentialsNotFound,
                    _ => ErrorCode::CredentialsUnavailable,
                };
                let error = ToolError::new(code, err.to_string());
                return self
                    .finish(
                        call,
                        ToolCallStatus::Failed,
                        None,
                        Some(error),
                        Duration::ZERO,
                        0,
                        "credentials_missing",
                        verdict,
                    )
                    .await;
            }
        };

        // Step 10: the connector, under the engine's deadline.
        let ctx = InvocationContext {
            tenant: call.tenant.clone(),
            agent: call.agent.clone(),
            run: call.run.clone(),
            tool_call_id: call.id.clone(),
            correlation_id: call.correlation_id.clone(),
            tool: spec.name.clone(),
            deadline: Instant::now() + timeout,
            secrets,
        };
        let started = Instant::now();
        let invocation = invoke(connector, ctx, spec.name.clone(), arguments, timeout).await;
        let elapsed = started.elapsed();

        // Steps 11-13: normalize, record, return.
        match invocation {
            Invocation::Answered(Ok(output)) => {
                self.finish(
                    call,
                    ToolCallStatus::Succeeded,
                    Some(output.result),
                    None,
                    elapsed,
                    output.attempts,
                    "succeeded",
                    verdict,
                )
                .await
            }
            Invocation::Answered(Err(error)) => {
                // The connector's code says how the call ended: a transport failure after a
                // post was sent is `OUTCOME_UNKNOWN` (the vendor may have acted), which must
                // not read as a plain failure that is safe to repeat.
                let status = match error.code {
                    ErrorCode::OutcomeUnknown => ToolCallStatus::OutcomeUnknown,
                    ErrorCode::Timeout => ToolCallStatus::TimedOut,
                    _ => ToolCallStatus::Failed,
                };
                // A connector that does not count its attempts was invoked once.
                let attempts = error.attempts.unwrap_or(1);
                let sanitized = ToolError::new(
                    error.code,
                    self.redactor.redact_text(&error.message).into_owned(),
                );
                self.finish(
                    call,
                    status,
                    None,
                    Some(sanitized),
                    elapsed,
                    attempts,
                    "connector_error",
                    verdict,
                )
                .await
            }
            Invocation::TimedOut if spec.idempotent => {
                let error = ToolError::new(
                    ErrorCode::Timeout,
                    format!("the tool did not answer within {} ms", timeout.as_millis()),
                );
                self.finish(
                    call,
                    ToolCallStatus::TimedOut,
                    None,
                    Some(error),
                    elapsed,
                    1,
                    "timeout",
                    verdict,
                )
                .await
            }
            Invocation::TimedOut => {
                let error = ToolError::new(
                    ErrorCode::OutcomeUnknown,
                    format!(
                        "the tool did not answer within {} ms and is not idempotent: the vendor may or may not have acted, so do not retry without checking",
                        timeout.as_millis()
                    ),
                );
                self.finish(
                    call,
                    ToolCallStatus::OutcomeUnknown,
                    None,
                    Some(error),
                    elapsed,
                    1,
                    "timeout_not_idempotent",
                    verdict,
                )
                .await
            }
            Invocation::Panicked => {
                warn!(tool = %spec.name, tool_call_id = %call.id, "connector panicked");
                let error = ToolError::new(
                    ErrorCode::Internal,
                    "the tool failed unexpectedly and the call was not completed",
                );
                self.finish(
                    call,
                    ToolCallStatus::Failed,
                    None,
                    Some(error),
                    elapsed,
                    1,
                    "connector_panicked",
                    verdict,
                )
                .await
            }
        }
    }

    // --- pipeline helpers --------------------------------------------------------------------

    fn parse_ids(&self, request: &ExecuteRequest) -> Result<ParsedIds, String> {
        self.refuse_secret_id("run_id", &request.run)?;
        self.refuse_secret_id("tool_use_id", &request.tool_use_id)?;
        self.refuse_secret_id("correlation_id", &request.correlation_id)?;
        let run = RunId::new(request.run.clone()).map_err(|e| e.to_string())?;
        let tool_use_id = if request.tool_use_id.is_empty() {
            None
        } else {
            Some(ToolUseId::new(request.tool_use_id.clone()).map_err(|e| e.to_string())?)
        };
        let correlation_id = if request.correlation_id.is_empty() {
            CorrelationId::new(format!("corr_{}", uuid::Uuid::now_v7().simple()))
        } else {
            CorrelationId::new(request.correlation_id.clone())
        }
        .map_err(|e| e.to_string())?;
        Ok(ParsedIds {
            run,
            tool_use_id,
            correlation_id,
        })
    }

    /// Refuses an identifier the redactor would change: ids are stored and logged verbatim
    /// (they are what calls are found by), so one that holds a credential is refused rather
    /// than kept, and the message does not repeat it.
    fn refuse_secret_id(&self, field: &str, value: &str) -> Result<(), String> {
        if self.redactor.redact_text(value) == value {
            return Ok(());
        }
        Err(format!(
            "`{field}` looks like it holds a credential or personal data; send an opaque identifier"
        ))
    }

    /// What the ledger keeps of free text the caller sent where a name was expected: redacted
    /// first, then cut to `max` characters (so a cut never leaves part of a secret), with
    /// control characters replaced.
    fn recorded_text(&self, text: &str, max: usize) -> String {
        self.redactor
            .redact_text(text)
            .chars()
            .map(|c| if c.is_control() { '\u{fffd}' } else { c })
            .take(max)
            .collect()
    }

    fn parse_arguments(&self, text: &str) -> Result<Value, String> {
        decode_arguments(text, self.config.max_argument_bytes)
    }

    /// What the ledger keeps of arguments that did not parse: an excerpt of the redacted text
    /// (redacted whole, then cut between words, so no part of a secret survives the cut),
    /// nothing at all when they were oversize.
    fn redacted_raw_arguments(&self, raw: &str) -> Value {
        if raw.len() > self.config.max_argument_bytes {
            return json!({"_unparsed": format!("[{} bytes omitted]", raw.len())});
        }
        json!({"_unparsed": self.redactor.redact_excerpt(raw, UNPARSED_EXCERPT_CHARS)})
    }

    fn event(&self, call: &ToolCallRecord, kind: &str, payload: Value) -> NewAuditEvent {
        NewAuditEvent {
            tenant: call.tenant.clone(),
            kind: kind.to_owned(),
            run: Some(call.run.clone()),
            tool_call_id: Some(call.id.clone()),
            payload,
            at: self.clock.now(),
        }
    }

    fn decision_record(
        &self,
        call: &ToolCallRecord,
        tool: &ToolName,
        decision: &PolicyDecision,
    ) -> PolicyDecisionRecord {
        PolicyDecisionRecord {
            id: format!("pd_{}", uuid::Uuid::now_v7().simple()),
            tenant: call.tenant.clone(),
            tool_call_id: call.id.clone(),
            tool: tool.clone(),
            decision: decision.decision,
            risk: decision.risk,
            policy_ids: decision.policy_ids.clone(),
            policy_version: decision.policy_version,
            created_at: self.clock.now(),
        }
    }

    /// A pending invocation bound to this exact call: tool, arguments (and their hash), the
    /// run's manifest, the policy version that decided and the timeout the agent asked for.
    #[allow(
        clippy::too_many_arguments,
        reason = "the call, its run, and the parts of the suspended request"
    )]
    fn pending_for(
        &self,
        call: &ToolCallRecord,
        run: &RunRecord,
        tool: &ToolName,
        arguments: Value,
        decision: &PolicyDecision,
        origin: PendingOrigin,
        timeout: Option<Duration>,
    ) -> PendingInvocation {
        let now = self.clock.now();
        let expiry_ms = i64::try_from(self.config.pending_expiry.as_millis()).unwrap_or(i64::MAX);
        // Approval can never run a policy denial, so its arguments are not kept at all.
        let arguments = match origin {
            PendingOrigin::PolicyDenied => PendingArguments::Dropped,
            PendingOrigin::ApprovalRequired | PendingOrigin::ExecutionFailed => {
                self.seal_pending_arguments(call, &arguments)
            }
        };
        PendingInvocation {
            id: format!("pi_{}", uuid::Uuid::now_v7().simple()),
            tenant: call.tenant.clone(),
            run: run.id.clone(),
            tool_call_id: call.id.clone(),
            tool: tool.clone(),
            arguments,
            args_hash: call.args_hash.clone(),
            manifest: run.manifest.clone(),
            policy_version: decision.policy_version,
            origin,
            decision: decision.decision,
            state: PendingState::Pending,
            version: 1,
            expires_at: now.plus_ms(expiry_ms),
            created_at: now,
            timeout,
        }
    }

    /// Records a call that stops before execution, with its audit trail, and answers with it.
    /// A policy block also leaves a POLICY_DENIED pending invocation (`denied`), which only a
    /// Reject resolves.
    #[allow(
        clippy::too_many_arguments,
        reason = "the refused call, its audit event, outcome, reason, decision and denial row"
    )]
    async fn refuse(
        &self,
        mut call: ToolCallRecord,
        requested: NewAuditEvent,
        status: ToolCallStatus,
        error: ToolError,
        reason: &str,
        decision: Option<(PolicyDecisionRecord, &PolicyDecision)>,
        denied: Option<PendingInvocation>,
    ) -> Result<ExecuteOutcome, EngineError> {
        let kind = if status == ToolCallStatus::Blocked {
            "tool_call.blocked"
        } else {
            "tool_call.failed"
        };
        let mut payload = json!({"reason": reason, "error_code": error.code.as_str()});
        if let Some((_, decision)) = &decision {
            payload["decision"] = json!(decision.decision.as_str());
            payload["policy_ids"] = json!(decision.policy_ids);
            payload["policy_version"] = json!(decision.policy_version);
        }
        let terminal = self.event(&call, kind, payload);
        call.status = status;
        call.error_code = Some(error.code);
        call.error_text = Some(self.redactor.redact_text(&error.message).into_owned());
        let outcome_decision = decision.as_ref().map(|(_, d)| (d.decision, d.risk));
        let new_call = NewCall {
            call: call.clone(),
            count_against_budget: false,
            decision: decision.map(|(record, _)| record),
            pending: denied.clone(),
            events: vec![requested, terminal],
        };
        if let Some(answer) = self.record(new_call, &mut call).await? {
            return answer;
        }
        debug!(tool = %call.tool, code = %error.code, reason, "tool call refused");
        Ok(ExecuteOutcome {
            tool_call_id: Some(call.id),
            status,
            result: None,
            error: Some(error),
            duration: Duration::ZERO,
            attempts: 0,
            decision: outcome_decision.map(|(d, _)| d),
            risk: outcome_decision.map(|(_, r)| r),
            pending_invocation_id: denied.map(|pending| pending.id),
            replayed: false,
            redacted: false,
        })
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one call site; the fields are distinct parts of the suspended call"
    )]
    async fn suspend(
        &self,
        mut call: ToolCallRecord,
        requested: NewAuditEvent,
        decision_record: PolicyDecisionRecord,
        decision: &PolicyDecision,
        run: &RunRecord,
        tool: &ToolName,
        arguments: Value,
        timeout: Option<Duration>,
    ) -> Result<ExecuteOutcome, EngineError> {
        let pending = self.pending_for(
            &call,
            run,
            tool,
            arguments,
            decision,
            PendingOrigin::ApprovalRequired,
            timeout,
        );
        let approval = self.event(
            &call,
            "tool_call.approval_requested",
            json!({
                "pending_invocation_id": pending.id,
                "decision": decision.decision.as_str(),
                "risk": decision.risk.as_str(),
                "policy_ids": decision.policy_ids,
                "policy_version": decision.policy_version,
            }),
        );
        call.status = ToolCallStatus::WaitingApproval;
        let pending_id = pending.id.clone();
        let new_call = NewCall {
            call: call.clone(),
            count_against_budget: true,
            decision: Some(decision_record),
            pending: Some(pending),
            events: vec![requested, approval],
        };
        if let Some(answer) = self.record(new_call, &mut call).await? {
            return answer;
        }
        let who = if decision.decision == Decision::RequireClientApproval {
            "the client"
        } else {
            "an expert"
        };
        Ok(ExecuteOutcome {
            tool_call_id: Some(call.id),
            status: ToolCallStatus::WaitingApproval,
            result: None,
            error: None,
            duration: Duration::ZERO,
            attempts: 0,
            decision: Some(decision.decision),
            risk: Some(decision.risk),
            pending_invocation_id: Some(pending_id),
            replayed: false,
            redacted: false,
        })
        .inspect(|_| debug!(tool = %tool, approver = who, "tool call awaits approval"))
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the terminal record has this many independent parts"
    )]
    async fn finish(
        &self,
        call: &ToolCallRecord,
        status: ToolCallStatus,
        result: Option<Value>,
        error: Option<ToolError>,
        elapsed: Duration,
        attempts: u32,
        reason: &str,
        verdict: Verdict,
    ) -> Result<ExecuteOutcome, EngineError> {
        let duration_ms = i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX);
        let kind = match status {
            ToolCallStatus::Succeeded => "tool_call.succeeded",
            ToolCallStatus::TimedOut => "tool_call.timed_out",
            ToolCallStatus::OutcomeUnknown => "tool_call.outcome_unknown",
            _ => "tool_call.failed",
        };
        let mut payload =
            json!({"tool": call.tool, "duration_ms": duration_ms, "attempts": attempts});
        if let Some(error) = &error {
            payload["reason"] = json!(reason);
            payload["error_code"] = json!(error.code.as_str());
        }
        // Outputs lose personal data as well as secrets before they are stored.
        let output_redacted = result.as_ref().map(|r| self.redactor.redact_output_json(r));
        let error_text = error
            .as_ref()
            .map(|e| self.redactor.redact_output_text(&e.message).into_owned());
        let outcome = ExecuteOutcome {
            tool_call_id: Some(call.id.clone()),
            status,
            result,
            error,
            duration: elapsed,
            attempts,
            decision: Some(verdict.0),
            risk: Some(verdict.1),
            pending_invocation_id: None,
            replayed: false,
            redacted: false,
        };
        let finish = FinishCall {
            tenant: call.tenant.clone(),
            id: call.id.clone(),
            status,
            output_redacted,
            error_code: outcome.error_code(),
            error_text,
            duration_ms,
            attempts: i64::from(attempts),
            at: self.clock.now(),
            answer: self.seal_answer(call, &outcome),
            events: vec![self.event(call, kind, payload)],
        };
        let finished = self.store.finish_call(finish).await?;
        self.announce_events();
        if !finished {
            // Someone else settled the call first (another replica took this one for dead, or
            // recovery ran): the agent is told what the ledger says, never what it does not.
            warn!(tool_call_id = %call.id, %status, "call was no longer running when it finished; answering what the ledger recorded");
            let recorded = self
                .store
                .get_tool_call(&call.tenant, &call.id)
                .await?
                .ok_or_else(|| EngineError::NotFound(format!("tool call `{}`", call.id)))?;
            return Ok(ExecuteOutcome {
                decision: Some(verdict.0),
                ..outcome_from_record(&recorded, false)
            });
        }
        Ok(outcome)
    }

    async fn resolve_secrets(
        &self,
        tenant: &TenantId,
        spec: &ToolSpec,
    ) -> Result<Secrets, SecretError> {
        if spec.required_secrets.is_empty() {
            return Ok(Secrets::empty());
        }
        match &self.secrets {
            Some(source) => source.resolve(tenant, &spec.required_secrets).await,
            None => Err(SecretError::Unavailable {
                name: spec.required_secrets[0].clone(),
                reason: "this gateway has no credential store configured".to_owned(),
            }),
        }
    }

    /// Audits a request refused before a call row could exist (malformed ids, unknown run).
    async fn audit_rejected(
        &self,
        request: &ExecuteRequest,
        message: &str,
        at: Timestamp,
    ) -> Result<(), EngineError> {
        let tool = self.recorded_text(&request.tool, MAX_RECORDED_NAME);
        // The run is named only when it is a valid id that holds nothing secret.
        let run = RunId::new(request.run.clone())
            .ok()
            .filter(|_| self.refuse_secret_id("run_id", &request.run).is_ok());
        let event = NewAuditEvent {
            tenant: request.tenant.clone(),
            kind: "request.rejected".into(),
            run,
            tool_call_id: None,
            payload: json!({
                "operation": "execute_tool",
                "tool": tool,
                "reason": self.redactor.redact_text(message),
            }),
            at,
        };
        self.store.append_events(vec![event]).await?;
        Ok(())
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("catalog", &self.catalog)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

struct ParsedIds {
    run: RunId,
    tool_use_id: Option<ToolUseId>,
    correlation_id: CorrelationId,
}

fn policy_error(err: toolgate_policy::PolicyError) -> EngineError {
    EngineError::InvalidPolicy(vec![err.to_string()])
}

/// Hex SHA-256 of a JSON value's canonical text: object keys sorted at every level, so two
/// spellings of the same arguments hash alike (serde_json may preserve insertion order).
pub(crate) fn hash_json(value: &Value) -> String {
    let mut hasher = Sha256::new();
    write_canonical(value, &mut hasher);
    hex::encode(hasher.finalize())
}

fn write_canonical(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            hasher.update(b"{");
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                hasher.update(Value::String(key.clone()).to_string().as_bytes());
                hasher.update(b":");
                write_canonical(&map[key.as_str()], hasher);
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                write_canonical(item, hasher);
            }
            hasher.update(b"]");
        }
        scalar => hasher.update(scalar.to_string().as_bytes()),
    }
}

/// An outcome rebuilt from the ledger (for replays and budget refusals).
fn outcome_from_record(record: &ToolCallRecord, replayed: bool) -> ExecuteOutcome {
    let error = record
        .error_code
        .map(|code| ToolError::new(code, record.error_text.clone().unwrap_or_default()));
    ExecuteOutcome {
        tool_call_id: Some(record.id.clone()),
        status: record.status,
        result: record.output_redacted.clone(),
        error,
        duration: Duration::from_millis(
            u64::try_from(record.duration_ms.unwrap_or(0)).unwrap_or(0),
        ),
        attempts: u32::try_from(record.attempts).unwrap_or(u32::MAX),
        decision: None,
        risk: record.risk_level,
        pending_invocation_id: None,
        replayed,
        redacted: false,
    }
}

/// Decodes a call's `arguments_json` as the pipeline does (step 5, before the schema): at most
/// `max_bytes`, JSON, an object (blank text is `{}`). The message says what is wrong without
/// echoing the text.
pub fn decode_arguments(text: &str, max_bytes: usize) -> Result<Value, String> {
    if text.len() > max_bytes {
        return Err(format!(
            "the arguments are {} bytes, more than the limit of {max_bytes} bytes",
            text.len()
        ));
    }
    let text = if text.trim().is_empty() { "{}" } else { text };
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("the arguments are not valid JSON: {e}"))?;
    if !value.is_object() {
        return Err("the arguments must be a JSON object".to_owned());
    }
    Ok(value)
}
