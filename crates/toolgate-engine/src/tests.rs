//! Pipeline tests: the engine with the testkit connectors over a real ledger, a fresh SQLite
//! file per test (`ledger_test!`, see `ledgers.rs`). What only a shared PostgreSQL database
//! has (replicas) is tested in `postgres.rs`, behind the `postgres-tests` feature.

mod answers;
mod at_rest;
mod ledgers;
mod observed;
#[cfg(feature = "postgres-tests")]
mod postgres;
mod resume_promises;
mod settled;
mod unparsed;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use toolgate_core::{
    AgentId, Connector, Decision, ErrorCode, RunId, SecretError, SecretName, SecretSource,
    SecretValue, Secrets, SystemClock, TenantId, Timestamp, ToolCallId, ToolCallStatus, ToolName,
    ToolRegistry,
};
use toolgate_ledger::{
    Actor, Agent, Permission, RunRecord, RunStatus, Store, TOOL_CALLING_ENABLED, Tenant,
};

use crate::testkit::TestkitConnector;
use crate::{
    Catalog, CreateRun, Engine, EngineConfig, EngineError, ExecuteOutcome, ExecuteRequest,
};
use ledgers::{Backend, Opened, Place, ledger_test};

struct Harness {
    engine: Engine,
    store: Arc<dyn Store>,
    tenant: TenantId,
    agent: AgentId,
    /// The store by its concrete type, to close it.
    opened: Opened,
    /// Where the ledger lives, to open it again (a restart, a replica).
    place: Place,
    backend: Backend,
    config: EngineConfig,
    secrets: Option<Arc<dyn SecretSource>>,
}

/// The admin token id the tests make their administrative changes with.
const ADMIN_TOKEN: &str = "tok_admin";
/// The actor of the tests' administrative changes made on the store directly.
fn admin() -> Actor {
    Actor::token(ADMIN_TOKEN, Timestamp(1))
}

const TOOLS: &[&str] = &[
    "testkit.noop",
    "testkit.echo",
    "testkit.sleep",
    "testkit.sleep_write",
    "testkit.panic",
    "testkit.fail",
    "testkit.transfer",
    "testkit.whoami",
];

async fn harness(backend: &Backend) -> Harness {
    harness_with(backend, EngineConfig::default(), None).await
}

/// A fresh ledger on `backend` with the tenant `acme`, its agent `support`, every testkit tool
/// granted and tool calling enabled.
async fn harness_with(
    backend: &Backend,
    config: EngineConfig,
    secrets: Option<Arc<dyn SecretSource>>,
) -> Harness {
    let place = backend.fresh_place();
    let h = open_harness(backend, place, config, secrets).await;
    let store = &h.store;
    store
        .create_tenant(
            Tenant {
                id: h.tenant.clone(),
                name: "Acme".into(),
                created_at: Timestamp(1),
            },
            &admin(),
        )
        .await
        .unwrap();
    store
        .create_agent(
            Agent {
                tenant: h.tenant.clone(),
                id: h.agent.clone(),
                name: "Support".into(),
                created_at: Timestamp(1),
            },
            &admin(),
        )
        .await
        .unwrap();
    for tool in TOOLS {
        store
            .put_permission(
                Permission {
                    tenant: h.tenant.clone(),
                    agent: None,
                    tool: ToolName::new(*tool).unwrap(),
                    enabled: true,
                    updated_at: Timestamp(1),
                },
                &admin(),
            )
            .await
            .unwrap();
    }
    h.engine
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, true, ADMIN_TOKEN)
        .await
        .unwrap();
    h
}

/// An engine over a new store on `place`, whatever the ledger already holds.
async fn open_harness(
    backend: &Backend,
    place: Place,
    config: EngineConfig,
    secrets: Option<Arc<dyn SecretSource>>,
) -> Harness {
    let opened = backend.open(&place).await;
    let store = opened.store();
    let mut registry = ToolRegistry::new();
    registry
        .register(Arc::new(TestkitConnector) as Arc<dyn Connector>)
        .unwrap();
    let catalog = Arc::new(Catalog::new(registry).unwrap());
    let mut engine = Engine::new(
        Arc::clone(&store),
        catalog,
        Arc::new(SystemClock),
        config.clone(),
    )
    .unwrap();
    if let Some(source) = &secrets {
        engine = engine.with_secrets(Arc::clone(source));
    }
    // Every restart and replica of a harness seals and opens with the same master key.
    engine = engine.with_sealer(test_key_ring());
    Harness {
        engine,
        store,
        tenant: TenantId::new("acme").unwrap(),
        agent: AgentId::new("support").unwrap(),
        opened,
        place,
        backend: backend.clone(),
        config,
        secrets,
    }
}

/// The master key ring of every test ledger (one key, fixed for the test binary's life).
fn test_key_ring() -> Arc<dyn toolgate_core::Sealer> {
    static RING: std::sync::OnceLock<Arc<toolgate_secrets::KeyRing>> = std::sync::OnceLock::new();
    let ring = RING.get_or_init(|| {
        let key = toolgate_secrets::KeyRing::generate_key();
        Arc::new(
            toolgate_secrets::KeyRing::from_entries(vec![("k1".into(), key.to_string())]).unwrap(),
        )
    });
    Arc::clone(ring) as Arc<dyn toolgate_core::Sealer>
}

impl Harness {
    /// A restart: closes this store, then opens a new store and engine on the same ledger
    /// (the same SQLite file, or the same PostgreSQL schema).
    async fn restart(self) -> Harness {
        self.opened.close().await;
        open_harness(&self.backend, self.place, self.config, self.secrets).await
    }
}

impl Harness {
    async fn run(&self, max_calls: Option<u32>) -> RunId {
        self.engine
            .create_run(CreateRun {
                tenant: self.tenant.clone(),
                agent: self.agent.clone(),
                run: None,
                max_calls,
            })
            .await
            .unwrap()
            .id
    }

    fn request(&self, run: &RunId, tool: &str, arguments: &str) -> ExecuteRequest {
        ExecuteRequest {
            tenant: self.tenant.clone(),
            agent: None,
            run: run.to_string(),
            tool_use_id: String::new(),
            tool: tool.to_owned(),
            arguments_json: arguments.to_owned(),
            correlation_id: String::new(),
            timeout: None,
            deadline: None,
        }
    }

    async fn call(&self, run: &RunId, tool: &str, arguments: &str) -> ExecuteOutcome {
        self.engine
            .execute(self.request(run, tool, arguments))
            .await
            .unwrap()
    }

    async fn ledger_row(&self, outcome: &ExecuteOutcome) -> toolgate_ledger::ToolCallRecord {
        let id = outcome.tool_call_id.clone().expect("a ledger row");
        self.store
            .get_tool_call(&self.tenant, &id)
            .await
            .unwrap()
            .expect("row exists")
    }

    async fn event_kinds(&self) -> Vec<String> {
        self.store
            .list_events(&self.tenant, 0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }

    async fn call_status(&self, id: &ToolCallId) -> ToolCallStatus {
        self.store
            .get_tool_call(&self.tenant, id)
            .await
            .unwrap()
            .expect("row exists")
            .status
    }

    /// Starts a call of `testkit.sleep` that sleeps an hour (its timeout is the engine's
    /// maximum, 5 minutes) on its own task, and returns the task and the call once its
    /// `running` row is committed. Waits without a deadline: it re-reads the ledger each time
    /// the engine announces a commit, so a slow machine makes it slower, never wrong.
    async fn start_slow_call(
        self: &Arc<Self>,
        run: &RunId,
    ) -> (
        tokio::task::JoinHandle<Result<ExecuteOutcome, EngineError>>,
        toolgate_ledger::ToolCallRecord,
    ) {
        let mut committed = self.engine.subscribe_events();
        let task = {
            let h = Arc::clone(self);
            let mut request = h.request(run, "testkit.sleep", r#"{"ms": 3600000}"#);
            request.timeout = Some(h.config.max_timeout);
            tokio::spawn(async move { h.engine.execute(request).await })
        };
        loop {
            let calls = self
                .store
                .list_tool_calls(&self.tenant, run, None, 1000)
                .await
                .unwrap();
            let running = calls
                .into_iter()
                .find(|c| c.tool.as_str() == "testkit.sleep");
            if let Some(call) = running {
                assert_eq!(call.status, ToolCallStatus::Running, "{call:?}");
                return (task, call);
            }
            assert!(!task.is_finished(), "the slow call ended: {task:?}");
            committed
                .changed()
                .await
                .expect("the engine announces its commits");
        }
    }
}

async fn happy_path_returns_full_result_and_records_redacted_row(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let outcome = h
        .call(
            &run,
            "testkit.echo",
            r#"{"message": "hi", "api_token": "sk-live-123"}"#,
        )
        .await;
    assert_eq!(outcome.status, ToolCallStatus::Succeeded, "{outcome:?}");
    assert_eq!(
        outcome.result,
        Some(json!({"message": "hi", "api_token": "sk-live-123"}))
    );
    let row = h.ledger_row(&outcome).await;
    assert_eq!(row.status, ToolCallStatus::Succeeded);
    assert_eq!(
        row.input_redacted,
        json!({"message": "hi", "api_token": "[REDACTED]"})
    );
    assert_eq!(
        row.output_redacted,
        Some(json!({"message": "hi", "api_token": "[REDACTED]"}))
    );
    assert!(row.policy_decision_id.is_some());
    let kinds = h.event_kinds().await;
    assert!(
        kinds.ends_with(&[
            "tool_call.requested".to_owned(),
            "tool_call.succeeded".to_owned()
        ]),
        "{kinds:?}"
    );
    let report = h.store.verify_chains().await.unwrap();
    assert!(report.first_problem.is_none(), "{report:?}");
}
ledger_test!(happy_path_returns_full_result_and_records_redacted_row);

async fn llm_name_form_is_accepted(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let outcome = h.call(&run, "testkit__noop", "{}").await;
    assert_eq!(outcome.status, ToolCallStatus::Succeeded, "{outcome:?}");
}
ledger_test!(llm_name_form_is_accepted);

/// One refusal case: the tool and arguments, the expected status, code and a message fragment.
struct Refusal {
    tool: &'static str,
    arguments: String,
    status: ToolCallStatus,
    code: ErrorCode,
    message: &'static str,
}

async fn refusals_are_recorded_with_their_codes(backend: Backend) {
    let h = harness_with(
        &backend,
        EngineConfig {
            max_argument_bytes: 1024,
            ..EngineConfig::default()
        },
        None,
    )
    .await;
    let forbid = r#"
        @id("allow-all") permit(principal, action, resource);
        @id("no-paris") forbid(principal, action == Toolgate::Action::"testkit.transfer", resource)
            when { context.args.region == "eu-west-3" };
    "#;
    h.engine
        .put_policy(&h.tenant, forbid, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let cases = [
        Refusal {
            tool: "testkit.nope",
            arguments: "{}".into(),
            status: ToolCallStatus::Blocked,
            code: ErrorCode::NotInManifest,
            message: "testkit.echo",
        },
        Refusal {
            tool: "not a tool",
            arguments: "{}".into(),
            status: ToolCallStatus::Blocked,
            code: ErrorCode::NotInManifest,
            message: "not allowed",
        },
        Refusal {
            tool: "testkit.echo",
            arguments: r#"{"count": 1}"#.into(),
            status: ToolCallStatus::Failed,
            code: ErrorCode::InvalidArguments,
            message: "message",
        },
        Refusal {
            tool: "testkit.echo",
            arguments: r#"{"message": 5}"#.into(),
            status: ToolCallStatus::Failed,
            code: ErrorCode::InvalidArguments,
            message: "/message",
        },
        Refusal {
            tool: "testkit.echo",
            arguments: r#"{"message": "x""#.into(),
            status: ToolCallStatus::Failed,
            code: ErrorCode::InvalidArguments,
            message: "not valid JSON",
        },
        Refusal {
            tool: "testkit.echo",
            arguments: "[1]".into(),
            status: ToolCallStatus::Failed,
            code: ErrorCode::InvalidArguments,
            message: "JSON object",
        },
        Refusal {
            tool: "testkit.echo",
            arguments: format!(r#"{{"message": "{}"}}"#, "a".repeat(2000)),
            status: ToolCallStatus::Failed,
            code: ErrorCode::InvalidArguments,
            message: "limit of 1024 bytes",
        },
        Refusal {
            tool: "testkit.transfer",
            arguments: r#"{"amount": 5, "region": "eu-west-3", "account": "x"}"#.into(),
            status: ToolCallStatus::Blocked,
            code: ErrorCode::PolicyBlocked,
            message: "",
        },
    ];
    for case in cases {
        let outcome = h.call(&run, case.tool, &case.arguments).await;
        let label = format!(
            "{} {}",
            case.tool,
            case.arguments.chars().take(60).collect::<String>()
        );
        assert_eq!(outcome.status, case.status, "{label}: {outcome:?}");
        let error = outcome.error.clone().expect("an error");
        assert_eq!(error.code, case.code, "{label}: {error:?}");
        assert!(
            error.message.contains(case.message),
            "{label}: {}",
            error.message
        );
        let row = h.ledger_row(&outcome).await;
        assert_eq!(
            (row.status, row.error_code),
            (case.status, Some(case.code)),
            "{label}"
        );
    }
    let run_after = h.engine.get_run(&h.tenant, &run).await.unwrap();
    assert_eq!(
        run_after.calls_used, 0,
        "refused calls do not use the budget"
    );
    let blocked = h
        .event_kinds()
        .await
        .iter()
        .filter(|k| *k == "tool_call.blocked")
        .count();
    assert_eq!(blocked, 3);
}
ledger_test!(refusals_are_recorded_with_their_codes);

async fn kill_switch_blocks_before_anything_else(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    h.engine
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, false, ADMIN_TOKEN)
        .await
        .unwrap();
    let outcome = h.call(&run, "testkit.echo", "{}").await;
    assert_eq!(outcome.status, ToolCallStatus::Blocked);
    assert_eq!(outcome.error_code(), Some(ErrorCode::FeatureDisabled));
    assert!(
        outcome
            .error
            .unwrap()
            .message
            .contains("tool_calling_enabled")
    );
}
ledger_test!(kill_switch_blocks_before_anything_else);

async fn new_tenants_start_with_tool_calling_disabled(backend: Backend) {
    let h = harness(&backend).await;
    let other = TenantId::new("globex").unwrap();
    h.store
        .create_tenant(
            Tenant {
                id: other.clone(),
                name: "Globex".into(),
                created_at: Timestamp(1),
            },
            &admin(),
        )
        .await
        .unwrap();
    h.store
        .create_agent(
            Agent {
                tenant: other.clone(),
                id: h.agent.clone(),
                name: "x".into(),
                created_at: Timestamp(1),
            },
            &admin(),
        )
        .await
        .unwrap();
    let run = h
        .engine
        .create_run(CreateRun {
            tenant: other.clone(),
            agent: h.agent.clone(),
            run: None,
            max_calls: None,
        })
        .await
        .unwrap();
    let mut request = h.request(&run.id, "testkit.noop", "{}");
    request.tenant = other;
    let outcome = h.engine.execute(request).await.unwrap();
    assert_eq!(outcome.error_code(), Some(ErrorCode::FeatureDisabled));
}
ledger_test!(new_tenants_start_with_tool_calling_disabled);

async fn unknown_tool_lists_registered_tools(backend: Backend) {
    let h = harness(&backend).await;
    let run = RunId::new("run-stale").unwrap();
    h.store
        .create_run(RunRecord {
            tenant: h.tenant.clone(),
            id: run.clone(),
            agent: h.agent.clone(),
            manifest: vec![ToolName::new("gone.tool").unwrap()],
            status: RunStatus::Active,
            calls_used: 0,
            max_calls: 10,
            pending_approvals: 0,
            created_at: Timestamp(1),
        })
        .await
        .unwrap();
    let outcome = h.call(&run, "gone.tool", "{}").await;
    assert_eq!(outcome.error_code(), Some(ErrorCode::UnknownTool));
    let message = outcome.error.unwrap().message;
    assert!(
        message.contains("gone.tool") && message.contains("testkit.echo"),
        "{message}"
    );
}
ledger_test!(unknown_tool_lists_registered_tools);

async fn argument_condition_suspends_the_call(backend: Backend) {
    let h = harness(&backend).await;
    let policy = r#"
        @id("transfers") permit(principal, action == Toolgate::Action::"testkit.transfer", resource);
        @id("big-transfers") @decision("require_expert_approval") @risk("high")
        permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
            when { context.args.amount > 1000 };
    "#;
    h.engine
        .put_policy(&h.tenant, policy, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let small = h
        .call(
            &run,
            "testkit.transfer",
            r#"{"amount": 10, "region": "us-east-1", "account": "a"}"#,
        )
        .await;
    assert_eq!(small.status, ToolCallStatus::Succeeded, "{small:?}");
    let big = h
        .call(
            &run,
            "testkit.transfer",
            r#"{"amount": 1500, "region": "us-east-1", "account": "a"}"#,
        )
        .await;
    assert_eq!(big.status, ToolCallStatus::WaitingApproval, "{big:?}");
    assert!(big.pending_invocation_id.is_some());
    assert_eq!(big.risk, Some(toolgate_core::RiskLevel::High));
    let row = h.ledger_row(&big).await;
    assert_eq!(row.status, ToolCallStatus::WaitingApproval);
    let run_after = h.engine.get_run(&h.tenant, &run).await.unwrap();
    assert_eq!(run_after.pending_approvals, 1);
    assert_eq!(run_after.status, RunStatus::WaitingApproval);
    assert!(
        h.event_kinds()
            .await
            .contains(&"tool_call.approval_requested".to_owned())
    );
}
ledger_test!(argument_condition_suspends_the_call);

async fn a_connector_that_never_answers_times_out_on_the_engines_clock(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let mut request = h.request(&run, "testkit.sleep", r#"{"ms": 60000}"#);
    request.timeout = Some(Duration::from_millis(200));
    let outcome = h.engine.execute(request).await.unwrap();
    // The connector would answer (succeed) after 60 s: a timed-out outcome is the deadline's.
    // No upper bound on the time taken, which would only measure the machine's load.
    assert_eq!(outcome.status, ToolCallStatus::TimedOut, "{outcome:?}");
    assert_eq!(outcome.error_code(), Some(ErrorCode::Timeout));
    assert!(
        outcome.duration >= Duration::from_millis(200),
        "never before the deadline: {:?}",
        outcome.duration
    );
    assert_eq!(
        h.ledger_row(&outcome).await.status,
        ToolCallStatus::TimedOut
    );
    assert!(
        h.event_kinds()
            .await
            .contains(&"tool_call.timed_out".to_owned())
    );
}
ledger_test!(a_connector_that_never_answers_times_out_on_the_engines_clock);

async fn a_non_idempotent_timeout_is_an_unknown_outcome(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let mut request = h.request(&run, "testkit.sleep_write", r#"{"ms": 60000}"#);
    request.timeout = Some(Duration::from_millis(100));
    let outcome = h.engine.execute(request).await.unwrap();
    assert_eq!(outcome.status, ToolCallStatus::OutcomeUnknown);
    assert_eq!(outcome.error_code(), Some(ErrorCode::OutcomeUnknown));
    assert!(outcome.error.unwrap().message.contains("may or may not"));
}
ledger_test!(a_non_idempotent_timeout_is_an_unknown_outcome);

async fn timeout_override_is_bounded_by_the_maximum(backend: Backend) {
    let h = harness_with(
        &backend,
        EngineConfig {
            max_timeout: Duration::from_millis(150),
            ..EngineConfig::default()
        },
        None,
    )
    .await;
    let run = h.run(None).await;
    let mut request = h.request(&run, "testkit.sleep", r#"{"ms": 60000}"#);
    request.timeout = Some(Duration::from_secs(3600));
    let outcome = h.engine.execute(request).await.unwrap();
    // Unbounded, the call would wait out the hour-long timeout, and the connector would
    // succeed after 60 s: timing out is the 150 ms maximum's doing.
    assert_eq!(outcome.status, ToolCallStatus::TimedOut, "{outcome:?}");
}
ledger_test!(timeout_override_is_bounded_by_the_maximum);

async fn the_callers_deadline_caps_the_timeout(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let mut request = h.request(&run, "testkit.sleep", r#"{"ms": 60000}"#);
    request.timeout = Some(Duration::from_secs(3600));
    request.deadline = Some(tokio::time::Instant::now() + Duration::from_millis(150));
    let outcome = h.engine.execute(request).await.unwrap();
    // Without the deadline the hour-long timeout would let the connector succeed after 60 s.
    assert_eq!(outcome.status, ToolCallStatus::TimedOut, "{outcome:?}");
    assert_eq!(
        h.ledger_row(&outcome).await.status,
        ToolCallStatus::TimedOut
    );
    // A deadline later than the timeout changes nothing.
    let mut request = h.request(&run, "testkit.sleep", r#"{"ms": 10}"#);
    request.deadline = Some(tokio::time::Instant::now() + Duration::from_secs(3600));
    let outcome = h.engine.execute(request).await.unwrap();
    assert_eq!(outcome.status, ToolCallStatus::Succeeded, "{outcome:?}");
}
ledger_test!(the_callers_deadline_caps_the_timeout);

async fn a_panicking_connector_fails_only_its_call(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let outcome = h.call(&run, "testkit.panic", "{}").await;
    assert_eq!(outcome.status, ToolCallStatus::Failed);
    assert_eq!(outcome.error_code(), Some(ErrorCode::Internal));
    assert!(
        !outcome
            .error
            .unwrap()
            .message
            .contains("testkit.panic was called"),
        "panic text must not leak"
    );
    let next = h.call(&run, "testkit.noop", "{}").await;
    assert_eq!(next.status, ToolCallStatus::Succeeded);
}
ledger_test!(a_panicking_connector_fails_only_its_call);

async fn connector_errors_are_sanitized_outcomes(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let outcome = h
        .call(&run, "testkit.fail", r#"{"code": "VENDOR_RATE_LIMITED", "message": "slow down, token xoxb-1234567890-abcdefghij"}"#)
        .await;
    assert_eq!(outcome.status, ToolCallStatus::Failed);
    assert_eq!(outcome.error_code(), Some(ErrorCode::VendorRateLimited));
    let message = outcome.error.unwrap().message;
    assert!(!message.contains("xoxb-"), "{message}");
}
ledger_test!(connector_errors_are_sanitized_outcomes);

async fn the_budget_is_enforced(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(Some(2)).await;
    for _ in 0..2 {
        assert_eq!(
            h.call(&run, "testkit.noop", "{}").await.status,
            ToolCallStatus::Succeeded
        );
    }
    let third = h.call(&run, "testkit.noop", "{}").await;
    assert_eq!(third.status, ToolCallStatus::Blocked);
    assert_eq!(third.error_code(), Some(ErrorCode::BudgetExceeded));
}
ledger_test!(the_budget_is_enforced);

async fn a_repeated_tool_use_id_replays_and_never_executes_twice(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let mut request = h.request(&run, "testkit.echo", r#"{"message": "once"}"#);
    request.tool_use_id = "toolu_1".into();
    let first = h.engine.execute(request.clone()).await.unwrap();
    let again = h.engine.execute(request.clone()).await.unwrap();
    assert!(!first.replayed && again.replayed);
    assert_eq!(first.tool_call_id, again.tool_call_id);
    let calls = h
        .store
        .list_tool_calls(&h.tenant, &run, None, 100)
        .await
        .unwrap();
    assert_eq!(calls.len(), 1);
    let mut reordered = request.clone();
    reordered.arguments_json = r#"{ "message" :"once" }"#.into();
    assert!(
        h.engine.execute(reordered).await.unwrap().replayed,
        "same arguments, other spelling"
    );
    request.arguments_json = r#"{"message": "twice"}"#.into();
    let err = h.engine.execute(request).await.unwrap_err();
    assert!(
        matches!(err, EngineError::Conflict(ref m) if m.contains("different arguments")),
        "{err}"
    );
}
ledger_test!(a_repeated_tool_use_id_replays_and_never_executes_twice);

async fn malformed_requests_are_refused_and_audited(backend: Backend) {
    let h = harness(&backend).await;
    let mut request = h.request(&RunId::new("x").unwrap(), "testkit.noop", "{}");
    request.run = String::new();
    assert!(matches!(
        h.engine.execute(request.clone()).await,
        Err(EngineError::InvalidRequest(_))
    ));
    request.run = "r".repeat(500);
    assert!(matches!(
        h.engine.execute(request.clone()).await,
        Err(EngineError::InvalidRequest(_))
    ));
    request.run = "no-such-run".into();
    assert!(matches!(
        h.engine.execute(request).await,
        Err(EngineError::NotFound(_))
    ));
    let rejected = h
        .event_kinds()
        .await
        .iter()
        .filter(|k| *k == "request.rejected")
        .count();
    assert_eq!(rejected, 3);
}
ledger_test!(malformed_requests_are_refused_and_audited);

async fn a_run_refuses_permissions_for_unserved_tools(backend: Backend) {
    let h = harness(&backend).await;
    h.store
        .put_permission(
            Permission {
                tenant: h.tenant.clone(),
                agent: Some(h.agent.clone()),
                tool: ToolName::new("shopify.order_lookup").unwrap(),
                enabled: true,
                updated_at: Timestamp(1),
            },
            &admin(),
        )
        .await
        .unwrap();
    let err = h
        .engine
        .create_run(CreateRun {
            tenant: h.tenant.clone(),
            agent: h.agent.clone(),
            run: None,
            max_calls: None,
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("shopify.order_lookup"), "{err}");
}
ledger_test!(a_run_refuses_permissions_for_unserved_tools);

#[derive(Debug)]
struct OneSecretPerTenant;

#[async_trait::async_trait]
impl SecretSource for OneSecretPerTenant {
    async fn resolve(
        &self,
        tenant: &TenantId,
        names: &[SecretName],
    ) -> Result<Secrets, SecretError> {
        let mut secrets = Secrets::empty();
        for name in names {
            if tenant.as_str() != "acme" {
                return Err(SecretError::Missing(name.clone()));
            }
            secrets.insert(name.clone(), SecretValue::new("twelve chars"));
        }
        Ok(secrets)
    }
}

async fn declared_secrets_reach_the_connector_and_missing_ones_fail_clearly(backend: Backend) {
    let without = harness(&backend).await;
    let run = without.run(None).await;
    let outcome = without.call(&run, "testkit.whoami", "{}").await;
    assert_eq!(
        outcome.error_code(),
        Some(ErrorCode::CredentialsUnavailable)
    );
    assert_eq!(
        without.ledger_row(&outcome).await.status,
        ToolCallStatus::Failed
    );

    let with = harness_with(
        &backend,
        EngineConfig::default(),
        Some(Arc::new(OneSecretPerTenant)),
    )
    .await;
    let run = with.run(None).await;
    let outcome = with.call(&run, "testkit.whoami", "{}").await;
    assert_eq!(
        outcome.result,
        Some(json!({"tenant": "acme", "key_len": 12})),
        "{outcome:?}"
    );
}
ledger_test!(declared_secrets_reach_the_connector_and_missing_ones_fail_clearly);

/// A secret source that finds the secret but cannot read it (a ciphertext that does not
/// decrypt, a credential store that is down).
#[derive(Debug)]
struct UnreadableSecrets;

#[async_trait::async_trait]
impl SecretSource for UnreadableSecrets {
    async fn resolve(
        &self,
        _tenant: &TenantId,
        names: &[SecretName],
    ) -> Result<Secrets, SecretError> {
        Err(SecretError::Unavailable {
            name: names[0].clone(),
            reason: "it could not be decrypted".to_owned(),
        })
    }
}

async fn unreadable_secrets_are_unavailable_not_missing(backend: Backend) {
    let h = harness_with(
        &backend,
        EngineConfig::default(),
        Some(Arc::new(UnreadableSecrets)),
    )
    .await;
    let run = h.run(None).await;
    let outcome = h.call(&run, "testkit.whoami", "{}").await;
    assert_eq!(
        outcome.error_code(),
        Some(ErrorCode::CredentialsUnavailable),
        "{outcome:?}"
    );
    let message = &outcome.error.as_ref().expect("an error").message;
    assert!(message.contains("could not be decrypted"), "{message}");
    assert_eq!(h.ledger_row(&outcome).await.status, ToolCallStatus::Failed);
}
ledger_test!(unreadable_secrets_are_unavailable_not_missing);

async fn invalid_policies_are_refused_with_the_problem(backend: Backend) {
    let h = harness(&backend).await;
    let cases = [
        (
            "permit(principal, action, resource) when { context.args.amout > 1 };",
            "amout",
        ),
        (
            "permit(principal, action == Toolgate::Action::\"testkit.nosuch\", resource);",
            "testkit.nosuch",
        ),
        ("permit(principal, action, resource", ""),
    ];
    for (text, fragment) in cases {
        let err = h
            .engine
            .put_policy(&h.tenant, text, "test")
            .await
            .unwrap_err();
        assert!(
            matches!(err, EngineError::InvalidPolicy(_)),
            "{text}: {err}"
        );
        assert!(err.to_string().contains(fragment), "{text}: {err}");
    }
    let (version, _, _) = h.engine.current_policy(&h.tenant).await.unwrap();
    assert_eq!(version, 0, "nothing was stored");
}
ledger_test!(invalid_policies_are_refused_with_the_problem);

async fn concurrent_calls_all_land_in_the_ledger(backend: Backend) {
    let h = Arc::new(harness(&backend).await);
    let run = h.run(Some(1000)).await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let h = Arc::clone(&h);
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            h.call(&run, "testkit.echo", &format!(r#"{{"message": "m{i}"}}"#))
                .await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().status, ToolCallStatus::Succeeded);
    }
    let calls = h
        .store
        .list_tool_calls(&h.tenant, &run, None, 1000)
        .await
        .unwrap();
    assert_eq!(calls.len(), 200);
    assert!(calls.iter().all(|c| c.status == ToolCallStatus::Succeeded));
    let run_after = h.engine.get_run(&h.tenant, &run).await.unwrap();
    assert_eq!(run_after.calls_used, 200);
    assert!(
        h.store
            .verify_chains()
            .await
            .unwrap()
            .first_problem
            .is_none()
    );
}
ledger_test!(concurrent_calls_all_land_in_the_ledger);

#[test]
fn argument_hashes_ignore_key_order() {
    let a: Value = serde_json::from_str(r#"{"b": [1, {"y": 2, "x": 1}], "a": "s"}"#).unwrap();
    let b: Value = serde_json::from_str(r#"{"a": "s", "b": [1, {"x": 1, "y": 2}]}"#).unwrap();
    let c: Value = serde_json::from_str(r#"{"a": "s", "b": [{"x": 1, "y": 2}, 1]}"#).unwrap();
    assert_eq!(crate::engine::hash_json(&a), crate::engine::hash_json(&b));
    assert_ne!(crate::engine::hash_json(&a), crate::engine::hash_json(&c));
}

/// A crash while a call runs: the process dies with the call unfinished; the next process on
/// the same ledger (SQLite: the same file reopened; PostgreSQL: the same schema, connected
/// again) settles it as `outcome_unknown` and never runs it again.
async fn calls_interrupted_by_a_crash_become_outcome_unknown_and_never_rerun(backend: Backend) {
    let h = Arc::new(harness(&backend).await);
    let run = h.run(None).await;
    let done = h.call(&run, "testkit.noop", "{}").await;
    let (in_flight, running) = h.start_slow_call(&run).await;
    assert_eq!(
        h.engine.recover_interrupted_calls().await.unwrap(),
        0,
        "a call this process is still running was not interrupted"
    );
    assert_eq!(h.call_status(&running.id).await, ToolCallStatus::Running);

    // The crash: the call dies with the process, unfinished.
    in_flight.abort();
    assert!(in_flight.await.unwrap_err().is_cancelled());
    let h = Arc::into_inner(h)
        .expect("the aborted call released the harness")
        .restart()
        .await;

    let settled = h.engine.recover_interrupted_calls().await.unwrap();
    assert_eq!(settled, 1);
    let row = h
        .store
        .get_tool_call(&h.tenant, &running.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status, ToolCallStatus::OutcomeUnknown);
    assert_eq!(row.error_code, Some(ErrorCode::OutcomeUnknown));
    assert_eq!(
        h.ledger_row(&done).await.status,
        ToolCallStatus::Succeeded,
        "finished calls untouched"
    );
    assert!(
        h.event_kinds()
            .await
            .contains(&"tool_call.outcome_unknown".to_owned())
    );
    assert_eq!(
        h.engine.recover_interrupted_calls().await.unwrap(),
        0,
        "idempotent"
    );
    assert!(
        h.store
            .verify_chains()
            .await
            .unwrap()
            .first_problem
            .is_none()
    );
}
ledger_test!(calls_interrupted_by_a_crash_become_outcome_unknown_and_never_rerun);

async fn personal_data_in_outputs_is_redacted_in_the_ledger_only(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let message = "ship to jane.doe@example.com, order 1001";
    let outcome = h
        .call(
            &run,
            "testkit.echo",
            &json!({"message": message}).to_string(),
        )
        .await;
    assert_eq!(
        outcome.result,
        Some(json!({"message": message})),
        "the agent gets everything"
    );
    let row = h.ledger_row(&outcome).await;
    let stored = row.output_redacted.unwrap().to_string();
    assert!(!stored.contains("jane.doe@example.com"), "{stored}");
    assert!(stored.contains("order 1001"), "{stored}");
}
ledger_test!(personal_data_in_outputs_is_redacted_in_the_ledger_only);

const APPROVAL_POLICY: &str = r#"
    @id("base") permit(principal, action, resource);
    @id("big") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
    @id("failing-needs-approval") @decision("require_client_approval")
    permit(principal, action == Toolgate::Action::"testkit.fail", resource);
    @id("no-paris") forbid(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.region == "eu-west-3" };
"#;

fn resume_request(
    h: &Harness,
    run: &RunId,
    invocation: &str,
    decision: crate::ResumeDecision,
    who: &str,
) -> crate::ResumeRequest {
    crate::ResumeRequest {
        tenant: h.tenant.clone(),
        approver: who.to_owned(),
        run: run.to_string(),
        invocation: invocation.to_owned(),
        decision,
        reason: "checked with the customer".to_owned(),
    }
}

async fn suspended(h: &Harness, run: &RunId, arguments: &str) -> String {
    let outcome = h.call(run, "testkit.transfer", arguments).await;
    assert_eq!(
        outcome.status,
        ToolCallStatus::WaitingApproval,
        "{outcome:?}"
    );
    outcome.pending_invocation_id.unwrap()
}

async fn of_concurrent_approvals_exactly_one_executes(backend: Backend) {
    let h = Arc::new(harness(&backend).await);
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let pending = suspended(
        &h,
        &run,
        r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#,
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..10 {
        let h = Arc::clone(&h);
        let request = resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Approve,
            &format!("approver-{i}"),
        );
        tasks.push(tokio::spawn(async move {
            h.engine.resume(request).await.unwrap()
        }));
    }
    let (mut executed, mut lost) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            crate::ResumeOutcome::Executed(outcome) => {
                assert_eq!(outcome.status, ToolCallStatus::Succeeded, "{outcome:?}");
                executed += 1;
            }
            crate::ResumeOutcome::ClaimLost => lost += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((executed, lost), (1, 9));
    let kinds = h.event_kinds().await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "tool_call.succeeded").count(),
        1,
        "executed once"
    );
    assert_eq!(
        kinds.iter().filter(|k| *k == "tool_call.approved").count(),
        1
    );
    let run_after = h.engine.get_run(&h.tenant, &run).await.unwrap();
    assert_eq!(
        (run_after.pending_approvals, run_after.status),
        (0, RunStatus::Active)
    );
    assert!(
        h.store
            .verify_chains()
            .await
            .unwrap()
            .first_problem
            .is_none()
    );
}
ledger_test!(of_concurrent_approvals_exactly_one_executes);

async fn a_rejection_ends_the_call_and_later_decisions_lose(backend: Backend) {
    let h = harness(&backend).await;
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let pending = suspended(
        &h,
        &run,
        r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#,
    )
    .await;
    let rejected = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Reject,
            "alice",
        ))
        .await
        .unwrap();
    let crate::ResumeOutcome::Rejected {
        tool_call_id,
        expired: false,
    } = rejected
    else {
        panic!("{rejected:?}");
    };
    let row = h
        .store
        .get_tool_call(&h.tenant, &tool_call_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.status, row.error_code),
        (ToolCallStatus::Blocked, Some(ErrorCode::ExpertRejected))
    );
    let again = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Approve,
            "bob",
        ))
        .await
        .unwrap();
    assert_eq!(again, crate::ResumeOutcome::ClaimLost);
    let other_run = h.run(None).await;
    let wrong_run = h
        .engine
        .resume(resume_request(
            &h,
            &other_run,
            &pending,
            crate::ResumeDecision::Approve,
            "bob",
        ))
        .await;
    assert!(matches!(wrong_run, Err(EngineError::NotFound(_))));
}
ledger_test!(a_rejection_ends_the_call_and_later_decisions_lose);

async fn an_expired_invocation_resolves_as_rejected(backend: Backend) {
    let config = EngineConfig {
        pending_expiry: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = harness_with(&backend, config, None).await;
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let pending = suspended(
        &h,
        &run,
        r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#,
    )
    .await;
    let outcome = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Approve,
            "alice",
        ))
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            crate::ResumeOutcome::Rejected { expired: true, .. }
        ),
        "{outcome:?}"
    );
    assert!(
        h.event_kinds()
            .await
            .contains(&"tool_call.rejected".to_owned())
    );
}
ledger_test!(an_expired_invocation_resolves_as_rejected);

async fn a_failed_approved_execution_asks_again(backend: Backend) {
    let h = harness(&backend).await;
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let first = h
        .call(&run, "testkit.fail", r#"{"code": "VENDOR_ERROR"}"#)
        .await;
    assert_eq!(first.status, ToolCallStatus::WaitingApproval);
    let pending = first.pending_invocation_id.unwrap();
    let outcome = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Approve,
            "alice",
        ))
        .await
        .unwrap();
    let crate::ResumeOutcome::Executed(executed) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(executed.error_code(), Some(ErrorCode::VendorError));
    let open = h
        .store
        .list_pending(&h.tenant, &toolgate_ledger::PendingFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(
        open[0].origin,
        toolgate_ledger::PendingOrigin::ExecutionFailed
    );
    assert_ne!(open[0].id, pending);
    // The operator's further decision: reject it, which closes the run's last open approval.
    let rejected = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &open[0].id,
            crate::ResumeDecision::Reject,
            "bob",
        ))
        .await
        .unwrap();
    assert!(matches!(rejected, crate::ResumeOutcome::Rejected { .. }));
    assert_eq!(
        h.engine
            .get_run(&h.tenant, &run)
            .await
            .unwrap()
            .pending_approvals,
        0
    );
}
ledger_test!(a_failed_approved_execution_asks_again);

async fn approving_a_policy_denial_is_refused_and_the_row_stays(backend: Backend) {
    let h = harness(&backend).await;
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let blocked = h
        .call(
            &run,
            "testkit.transfer",
            r#"{"amount": 5, "region": "eu-west-3", "account": "a"}"#,
        )
        .await;
    assert_eq!(blocked.error_code(), Some(ErrorCode::PolicyBlocked));
    let pending = blocked.pending_invocation_id.expect("a POLICY_DENIED row");
    let refused = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Approve,
            "alice",
        ))
        .await
        .unwrap();
    assert_eq!(refused, crate::ResumeOutcome::PolicyDenialTerminal);
    assert!(
        h.event_kinds()
            .await
            .contains(&"tool_call.override_rejected".to_owned())
    );
    let row = h
        .store
        .get_pending(&h.tenant, &pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.state,
        toolgate_ledger::PendingState::Pending,
        "the row stays"
    );
    let rejected = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Reject,
            "alice",
        ))
        .await
        .unwrap();
    assert!(matches!(rejected, crate::ResumeOutcome::Rejected { .. }));
    let after = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Approve,
            "bob",
        ))
        .await
        .unwrap();
    assert_eq!(after, crate::ResumeOutcome::ClaimLost);
}
ledger_test!(approving_a_policy_denial_is_refused_and_the_row_stays);

async fn continue_resolves_without_executing_and_races_fairly(backend: Backend) {
    let h = Arc::new(harness(&backend).await);
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let pending = suspended(
        &h,
        &run,
        r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#,
    )
    .await;
    // Approvals and continues at once: exactly one decision wins.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let decision = if i % 2 == 0 {
            crate::ResumeDecision::Continue
        } else {
            crate::ResumeDecision::Approve
        };
        let request = resume_request(&h, &run, &pending, decision, &format!("approver-{i}"));
        let h = Arc::clone(&h);
        tasks.push(tokio::spawn(async move {
            h.engine.resume(request).await.unwrap()
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            crate::ResumeOutcome::ClaimLost => {}
            other => winners.push(other),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let kinds = h.event_kinds().await;
    let decided = kinds
        .iter()
        .filter(|k| *k == "tool_call.continued" || *k == "tool_call.approved")
        .count();
    assert_eq!(decided, 1, "{kinds:?}");
    let row = h
        .store
        .get_pending(&h.tenant, &pending)
        .await
        .unwrap()
        .unwrap();
    match &winners[0] {
        crate::ResumeOutcome::Continued { tool_call_id } => {
            assert_eq!(row.state, toolgate_ledger::PendingState::Continued);
            let call = h
                .store
                .get_tool_call(&h.tenant, tool_call_id)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(call.status, ToolCallStatus::Blocked);
            assert_eq!(call.error_code, Some(ErrorCode::Skipped));
            assert!(
                !kinds.contains(&"tool_call.succeeded".to_owned()),
                "{kinds:?}"
            );
        }
        crate::ResumeOutcome::Executed(outcome) => {
            assert_eq!(row.state, toolgate_ledger::PendingState::Approved);
            assert_eq!(outcome.status, ToolCallStatus::Succeeded);
        }
        other => panic!("unexpected {other:?}"),
    }
    let run_after = h.engine.get_run(&h.tenant, &run).await.unwrap();
    assert_eq!(
        (run_after.pending_approvals, run_after.status),
        (0, RunStatus::Active)
    );
}
ledger_test!(continue_resolves_without_executing_and_races_fairly);

async fn continue_resolves_a_policy_denial(backend: Backend) {
    let h = harness(&backend).await;
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let blocked = h
        .call(
            &run,
            "testkit.transfer",
            r#"{"amount": 5, "region": "eu-west-3", "account": "a"}"#,
        )
        .await;
    let pending = blocked.pending_invocation_id.expect("a POLICY_DENIED row");
    let continued = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Continue,
            "alice",
        ))
        .await
        .unwrap();
    assert!(
        matches!(continued, crate::ResumeOutcome::Continued { .. }),
        "{continued:?}"
    );
    let row = h
        .store
        .get_pending(&h.tenant, &pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, toolgate_ledger::PendingState::Continued);
    assert!(
        !h.event_kinds()
            .await
            .contains(&"tool_call.succeeded".to_owned())
    );
    let again = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            crate::ResumeDecision::Continue,
            "bob",
        ))
        .await
        .unwrap();
    assert_eq!(again, crate::ResumeOutcome::ClaimLost);
}
ledger_test!(continue_resolves_a_policy_denial);

async fn expired_invocations_are_swept_as_rejected(backend: Backend) {
    let config = EngineConfig {
        pending_expiry: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = harness_with(&backend, config, None).await;
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let pending = suspended(
        &h,
        &run,
        r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#,
    )
    .await;
    assert_eq!(h.engine.expire_pending().await.unwrap(), 1);
    assert_eq!(
        h.engine.expire_pending().await.unwrap(),
        0,
        "nothing left to expire"
    );
    let row = h
        .store
        .get_pending(&h.tenant, &pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, toolgate_ledger::PendingState::Rejected);
    let call = h
        .store
        .get_tool_call(&h.tenant, &row.tool_call_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (call.status, call.error_code),
        (ToolCallStatus::Blocked, Some(ErrorCode::ExpertRejected))
    );
    assert_eq!(
        h.engine
            .get_run(&h.tenant, &run)
            .await
            .unwrap()
            .pending_approvals,
        0
    );
    assert!(
        h.event_kinds()
            .await
            .contains(&"tool_call.rejected".to_owned())
    );
}
ledger_test!(expired_invocations_are_swept_as_rejected);

/// A configuration with a cache TTL no test outlasts: what the engine caches holds until it
/// is dropped.
fn long_cache() -> EngineConfig {
    EngineConfig {
        cache_ttl: Duration::from_secs(3600),
        ..EngineConfig::default()
    }
}

/// A kill switch thrown behind this engine's back (on the store, as another process sharing
/// it does) is not seen while the cached flag is trusted, and holds as soon as the engine
/// drops its cached configuration (which the gateway does on the store's configuration feed).
async fn a_kill_switch_thrown_elsewhere_holds_once_the_cache_is_dropped(backend: Backend) {
    let h = harness_with(&backend, long_cache(), None).await;
    let run = h.run(None).await;
    let warm = h.call(&run, "testkit.echo", r#"{"message": "on"}"#).await;
    assert_eq!(warm.status, ToolCallStatus::Succeeded, "{warm:?}");
    h.store
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, false, &admin())
        .await
        .unwrap();
    let cached = h
        .call(&run, "testkit.echo", r#"{"message": "cached"}"#)
        .await;
    assert_eq!(cached.status, ToolCallStatus::Succeeded, "{cached:?}");
    h.engine.forget_cached_configuration();
    let after = h.call(&run, "testkit.echo", r#"{"message": "off"}"#).await;
    assert_eq!(
        after.error_code(),
        Some(ErrorCode::FeatureDisabled),
        "{after:?}"
    );
    // Switched on again through the engine: this process sees it at once.
    h.engine
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, true, ADMIN_TOKEN)
        .await
        .unwrap();
    let again = h
        .call(&run, "testkit.echo", r#"{"message": "on again"}"#)
        .await;
    assert_eq!(again.status, ToolCallStatus::Succeeded, "{again:?}");
}
ledger_test!(a_kill_switch_thrown_elsewhere_holds_once_the_cache_is_dropped);

/// A policy set stored behind this engine's back applies once the engine drops its cached
/// configuration; one uploaded through the engine applies at once.
async fn a_policy_stored_elsewhere_applies_once_the_cache_is_dropped(backend: Backend) {
    let h = harness_with(&backend, long_cache(), None).await;
    let run = h.run(None).await;
    let forbid_echo = r#"
        @id("allow-all") permit(principal, action, resource);
        @id("no-echo") forbid(principal, action == Toolgate::Action::"testkit.echo", resource);
    "#;
    let warm = h.call(&run, "testkit.echo", r#"{"message": "a"}"#).await;
    assert_eq!(warm.status, ToolCallStatus::Succeeded, "{warm:?}");
    h.store
        .put_policy_set(&h.tenant, forbid_echo, &admin())
        .await
        .unwrap();
    let cached = h.call(&run, "testkit.echo", r#"{"message": "b"}"#).await;
    assert_eq!(cached.status, ToolCallStatus::Succeeded, "{cached:?}");
    h.engine.forget_cached_configuration();
    let blocked = h.call(&run, "testkit.echo", r#"{"message": "c"}"#).await;
    assert_eq!(
        blocked.error_code(),
        Some(ErrorCode::PolicyBlocked),
        "{blocked:?}"
    );
    h.engine
        .put_policy(&h.tenant, "permit(principal, action, resource);", "test")
        .await
        .unwrap();
    let allowed = h.call(&run, "testkit.echo", r#"{"message": "d"}"#).await;
    assert_eq!(allowed.status, ToolCallStatus::Succeeded, "{allowed:?}");
}
ledger_test!(a_policy_stored_elsewhere_applies_once_the_cache_is_dropped);

/// With a cache TTL of zero nothing is trusted: a change made behind the engine's back holds
/// at the next call, without dropping anything.
async fn with_no_cache_ttl_changes_made_elsewhere_hold_at_once(backend: Backend) {
    let config = EngineConfig {
        cache_ttl: Duration::ZERO,
        ..EngineConfig::default()
    };
    let h = harness_with(&backend, config, None).await;
    let run = h.run(None).await;
    let warm = h.call(&run, "testkit.noop", "{}").await;
    assert_eq!(warm.status, ToolCallStatus::Succeeded, "{warm:?}");
    h.store
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, false, &admin())
        .await
        .unwrap();
    let after = h.call(&run, "testkit.noop", "{}").await;
    assert_eq!(
        after.error_code(),
        Some(ErrorCode::FeatureDisabled),
        "{after:?}"
    );
}
ledger_test!(with_no_cache_ttl_changes_made_elsewhere_hold_at_once);
