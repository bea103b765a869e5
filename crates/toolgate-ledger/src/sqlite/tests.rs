//! Tests of the SQLite store, each on a fresh database file in a temporary directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions, Connection, Executor};
use tempfile::TempDir;
use toolgate_core::{
    AgentId, CorrelationId, Decision, ErrorCode, RiskLevel, RunId, TenantId, Timestamp, ToolCallId,
    ToolCallStatus, ToolName, ToolUseId,
};

use super::SqliteStore;
use crate::chain::event_hash;
use crate::error::LedgerError;
use crate::model::*;
use crate::store::Store;

// --- fixtures ------------------------------------------------------------------------------

const T0: Timestamp = Timestamp(1_700_000_000_000);

struct Db {
    dir: TempDir,
    store: SqliteStore,
}

impl Db {
    async fn new() -> Db {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(&dir.path().join("ledger.db"))
            .await
            .expect("open store");
        Db { dir, store }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("ledger.db")
    }

    /// Closes the store and opens the same file again.
    async fn reopen(self) -> Db {
        self.store.close().await;
        let store = SqliteStore::open(&self.path()).await.expect("reopen store");
        Db {
            dir: self.dir,
            store,
        }
    }
}

fn tenant_id(id: &str) -> TenantId {
    TenantId::new(id).unwrap()
}

fn agent_id(id: &str) -> AgentId {
    AgentId::new(id).unwrap()
}

fn run_id(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

fn call_id(id: &str) -> ToolCallId {
    ToolCallId::new(id).unwrap()
}

fn tool(name: &str) -> ToolName {
    ToolName::new(name).unwrap()
}

fn tenant(id: &str) -> Tenant {
    Tenant {
        id: tenant_id(id),
        name: format!("{id} inc"),
        created_at: T0,
    }
}

fn agent(tenant: &str, id: &str) -> Agent {
    Agent {
        tenant: tenant_id(tenant),
        id: agent_id(id),
        name: format!("agent {id}"),
        created_at: T0,
    }
}

fn run(tenant: &str, id: &str, max_calls: i64) -> RunRecord {
    RunRecord {
        tenant: tenant_id(tenant),
        id: run_id(id),
        agent: agent_id("bot"),
        manifest: vec![tool("slack.post_message"), tool("aws.ec2_inventory")],
        status: RunStatus::Active,
        calls_used: 0,
        max_calls,
        pending_approvals: 0,
        created_at: T0,
    }
}

fn event(tenant: &str, kind: &str, run: &str, call: &str) -> NewAuditEvent {
    NewAuditEvent {
        tenant: tenant_id(tenant),
        kind: kind.to_owned(),
        run: Some(run_id(run)),
        tool_call_id: Some(call_id(call)),
        payload: json!({ "tool": "slack.post_message", "call": call }),
        at: T0,
    }
}

/// A `running` call with one `tool_call.requested` event, counted against the budget.
fn new_call(tenant: &str, run: &str, id: &str, tool_use_id: Option<&str>) -> NewCall {
    NewCall {
        call: ToolCallRecord {
            id: call_id(id),
            tenant: tenant_id(tenant),
            run: run_id(run),
            agent: agent_id("bot"),
            tool: "slack.post_message".to_owned(),
            action: Some("post_message".to_owned()),
            tool_use_id: tool_use_id.map(|id| ToolUseId::new(id).unwrap()),
            correlation_id: CorrelationId::new("corr-1").unwrap(),
            status: ToolCallStatus::Running,
            args_hash: "ab".repeat(32),
            input_redacted: json!({ "channel": "#ops", "text": "[REDACTED]" }),
            output_redacted: None,
            error_code: None,
            error_text: None,
            policy_decision_id: Some(format!("dec-{id}")),
            risk_level: Some(RiskLevel::Medium),
            duration_ms: None,
            attempts: 0,
            created_at: T0,
            updated_at: T0,
        },
        count_against_budget: true,
        decision: Some(PolicyDecisionRecord {
            id: format!("dec-{id}"),
            tenant: tenant_id(tenant),
            tool_call_id: call_id(id),
            tool: tool("slack.post_message"),
            decision: Decision::Allow,
            risk: RiskLevel::Medium,
            policy_ids: vec!["p1".to_owned()],
            policy_version: 1,
            created_at: T0,
        }),
        pending: None,
        events: vec![event(tenant, "tool_call.requested", run, id)],
    }
}

fn finish(tenant: &str, id: &str) -> FinishCall {
    FinishCall {
        tenant: tenant_id(tenant),
        id: call_id(id),
        status: ToolCallStatus::Succeeded,
        output_redacted: Some(json!({ "ok": true, "ts": "1.2" })),
        error_code: None,
        error_text: None,
        duration_ms: 12,
        attempts: 1,
        at: T0.plus_ms(12),
        events: vec![event(tenant, "tool_call.succeeded", "run-1", id)],
    }
}

/// A store with tenant `acme`, its agent `bot` and run `run-1` (budget `max_calls`).
async fn seeded(max_calls: i64) -> Db {
    let db = Db::new().await;
    db.store.create_tenant(tenant("acme")).await.unwrap();
    db.store.create_agent(agent("acme", "bot")).await.unwrap();
    db.store
        .create_run(run("acme", "run-1", max_calls))
        .await
        .unwrap();
    db
}

async fn events_of(store: &SqliteStore, tenant: &str) -> Vec<AuditEvent> {
    store
        .list_events(&tenant_id(tenant), 0, 10_000)
        .await
        .unwrap()
}

async fn raw_connection(path: &Path) -> SqliteConnection {
    SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .expect("raw connection")
}

fn assert_not_found(result: Result<(), LedgerError>, what: &str) {
    match result {
        Err(LedgerError::NotFound(message)) => {
            assert!(message.contains(what), "`{message}` should name {what}");
        }
        other => panic!("expected NotFound({what}), got {other:?}"),
    }
}

fn assert_exists(result: Result<(), LedgerError>, what: &str) {
    match result {
        Err(LedgerError::AlreadyExists(message)) => {
            assert!(message.contains(what), "`{message}` should name {what}");
        }
        other => panic!("expected AlreadyExists({what}), got {other:?}"),
    }
}

// --- tenants, agents, tokens, configuration -------------------------------------------------

#[tokio::test]
async fn tenants_and_agents() {
    let db = Db::new().await;
    let store = &db.store;
    store.create_tenant(tenant("beta")).await.unwrap();
    store.create_tenant(tenant("acme")).await.unwrap();
    assert_exists(store.create_tenant(tenant("acme")).await, "tenant acme");
    assert_eq!(
        store.get_tenant(&tenant_id("acme")).await.unwrap(),
        Some(tenant("acme"))
    );
    assert_eq!(store.get_tenant(&tenant_id("nope")).await.unwrap(), None);
    let ids: Vec<String> = store
        .list_tenants()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id.to_string())
        .collect();
    assert_eq!(ids, ["acme", "beta"]);

    store.create_agent(agent("acme", "bot")).await.unwrap();
    store.create_agent(agent("acme", "analyst")).await.unwrap();
    store.create_agent(agent("beta", "bot")).await.unwrap();
    assert_exists(
        store.create_agent(agent("acme", "bot")).await,
        "agent acme/bot",
    );
    assert_not_found(
        store.create_agent(agent("nope", "bot")).await,
        "tenant nope",
    );
    assert_eq!(
        store
            .get_agent(&tenant_id("acme"), &agent_id("bot"))
            .await
            .unwrap(),
        Some(agent("acme", "bot"))
    );
    assert_eq!(
        store
            .get_agent(&tenant_id("acme"), &agent_id("ghost"))
            .await
            .unwrap(),
        None
    );
    let acme_agents: Vec<String> = store
        .list_agents(&tenant_id("acme"))
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id.to_string())
        .collect();
    assert_eq!(acme_agents, ["analyst", "bot"]);
}

#[tokio::test]
async fn tokens() {
    let db = seeded(10).await;
    let store = &db.store;
    let token = |id: &str, role: Role, tenant: Option<&str>, agent: Option<&str>| TokenRecord {
        id: id.to_owned(),
        hash: format!("{:0>64}", id),
        role,
        tenant: tenant.map(tenant_id),
        agent: agent.map(agent_id),
        label: format!("label of {id}"),
        created_at: T0,
        revoked: false,
    };
    let admin = token("tok-admin", Role::Admin, None, None);
    let runtime = token("tok-agent", Role::Agent, Some("acme"), Some("bot"));
    let approver = token("tok-approver", Role::Approver, Some("acme"), None);
    for record in [&admin, &runtime, &approver] {
        store.create_token(record.clone()).await.unwrap();
    }

    let cases: Vec<(TokenRecord, &str)> = vec![
        (token("t1", Role::Agent, Some("nope"), None), "tenant nope"),
        (
            token("t2", Role::Agent, Some("acme"), Some("ghost")),
            "agent acme/ghost",
        ),
    ];
    for (record, missing) in cases {
        assert_not_found(store.create_token(record).await, missing);
    }
    // A taken id, and a taken hash: the error never repeats the hash.
    assert_exists(store.create_token(admin.clone()).await, "token tok-admin");
    let same_secret = TokenRecord {
        id: "tok-other".into(),
        ..runtime.clone()
    };
    let error = store.create_token(same_secret).await.unwrap_err();
    assert!(matches!(error, LedgerError::AlreadyExists(_)), "{error:?}");
    assert!(!error.to_string().contains(&runtime.hash), "{error}");

    assert_eq!(
        store.find_token(&runtime.hash).await.unwrap(),
        Some(runtime.clone())
    );
    assert_eq!(store.find_token(&"f".repeat(64)).await.unwrap(), None);
    let admins = store.list_tokens(None).await.unwrap();
    assert_eq!(admins, vec![admin.clone()]);
    let acme: Vec<String> = store
        .list_tokens(Some(&tenant_id("acme")))
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(acme, ["tok-agent", "tok-approver"]);

    store.revoke_token("tok-agent").await.unwrap();
    let revoked = store.find_token(&runtime.hash).await.unwrap().unwrap();
    assert!(revoked.revoked);
    assert_not_found(store.revoke_token("tok-ghost").await, "token tok-ghost");
}

#[tokio::test]
async fn permissions_flags_and_policy_sets() {
    let db = seeded(10).await;
    let store = &db.store;
    let acme = tenant_id("acme");
    let grant = |agent: Option<&str>, name: &str, enabled: bool, at: i64| Permission {
        tenant: acme.clone(),
        agent: agent.map(agent_id),
        tool: tool(name),
        enabled,
        updated_at: Timestamp(at),
    };
    store
        .put_permission(grant(None, "slack.post_message", true, 1))
        .await
        .unwrap();
    // An upsert of the tenant-wide grant, not a second row.
    store
        .put_permission(grant(None, "slack.post_message", false, 2))
        .await
        .unwrap();
    store
        .put_permission(grant(Some("bot"), "slack.post_message", true, 3))
        .await
        .unwrap();
    store
        .put_permission(grant(Some("bot"), "aws.ec2_inventory", true, 4))
        .await
        .unwrap();
    store
        .put_permission(grant(Some("bot"), "aws.ec2_inventory", true, 5))
        .await
        .unwrap();
    assert_not_found(
        store
            .put_permission(grant(Some("ghost"), "aws.ec2_inventory", true, 6))
            .await,
        "agent acme/ghost",
    );
    let mut elsewhere = grant(None, "aws.ec2_inventory", true, 7);
    elsewhere.tenant = tenant_id("nope");
    assert_not_found(store.put_permission(elsewhere).await, "tenant nope");

    assert_eq!(
        store.list_permissions(&acme, None).await.unwrap(),
        vec![grant(None, "slack.post_message", false, 2)]
    );
    assert_eq!(
        store
            .list_permissions(&acme, Some(&agent_id("bot")))
            .await
            .unwrap(),
        vec![
            grant(Some("bot"), "aws.ec2_inventory", true, 5),
            grant(None, "slack.post_message", false, 2),
            grant(Some("bot"), "slack.post_message", true, 3),
        ]
    );
    assert_eq!(
        store.granted_tools(&acme).await.unwrap(),
        vec![tool("aws.ec2_inventory"), tool("slack.post_message")]
    );

    assert_eq!(
        store.get_flag(&acme, TOOL_CALLING_ENABLED).await.unwrap(),
        None
    );
    for enabled in [true, false] {
        store
            .set_flag(&acme, TOOL_CALLING_ENABLED, enabled, T0)
            .await
            .unwrap();
        assert_eq!(
            store.get_flag(&acme, TOOL_CALLING_ENABLED).await.unwrap(),
            Some(enabled)
        );
    }
    assert_not_found(
        store
            .set_flag(&tenant_id("nope"), TOOL_CALLING_ENABLED, true, T0)
            .await,
        "tenant nope",
    );

    assert_eq!(store.current_policy_set(&acme).await.unwrap(), None);
    for (expected, text) in [
        (1, "permit(principal, action, resource);"),
        (2, "forbid(principal, action, resource);"),
    ] {
        let version = store
            .put_policy_set(&acme, text, "tok-admin", T0.plus_ms(expected))
            .await
            .unwrap();
        assert_eq!(version, expected);
    }
    let current = store.current_policy_set(&acme).await.unwrap().unwrap();
    assert_eq!(
        (
            current.version,
            current.text.as_str(),
            current.created_by.as_str()
        ),
        (2, "forbid(principal, action, resource);", "tok-admin")
    );
    let missing = store
        .put_policy_set(&tenant_id("nope"), "x", "tok-admin", T0)
        .await
        .map(|_| ());
    assert_not_found(missing, "tenant nope");
}

#[tokio::test]
async fn runs() {
    let db = seeded(3).await;
    let store = &db.store;
    db.store.create_tenant(tenant("beta")).await.unwrap();
    assert_eq!(
        store
            .get_run(&tenant_id("acme"), &run_id("run-1"))
            .await
            .unwrap(),
        Some(run("acme", "run-1", 3))
    );
    // Another tenant's run is invisible.
    assert_eq!(
        store
            .get_run(&tenant_id("beta"), &run_id("run-1"))
            .await
            .unwrap(),
        None
    );
    assert_exists(store.create_run(run("acme", "run-1", 3)).await, "run run-1");
    let mut orphan = run("acme", "run-2", 3);
    orphan.agent = agent_id("ghost");
    assert_not_found(store.create_run(orphan).await, "agent acme/ghost");
    assert_not_found(
        store.create_run(run("nope", "run-3", 3)).await,
        "tenant nope",
    );
}

// --- calls -----------------------------------------------------------------------------------

#[tokio::test]
async fn record_call_outcomes_and_budget() {
    let db = seeded(2).await;
    let store = &db.store;
    let acme = tenant_id("acme");

    for id in ["call-1", "call-2"] {
        let outcome = store
            .record_call(new_call("acme", "run-1", id, Some(&format!("use-{id}"))))
            .await
            .unwrap();
        assert_eq!(outcome, RecordOutcome::Recorded);
    }
    let first = store
        .get_tool_call(&acme, &call_id("call-1"))
        .await
        .unwrap();
    assert_eq!(
        first,
        Some(new_call("acme", "run-1", "call-1", Some("use-call-1")).call)
    );

    // The same tool_use_id again: the recorded call comes back and nothing is written.
    let events_before = events_of(store, "acme").await.len();
    let retry = new_call("acme", "run-1", "call-1-retry", Some("use-call-1"));
    let outcome = store.record_call(retry).await.unwrap();
    assert_eq!(outcome, RecordOutcome::Duplicate(first.clone().unwrap()));
    assert_eq!(events_of(store, "acme").await.len(), events_before);
    assert_eq!(
        store
            .get_tool_call(&acme, &call_id("call-1-retry"))
            .await
            .unwrap(),
        None
    );

    // The third counted call is over the budget of 2: blocked, with its requested event and a
    // blocked event; the decision, the pending invocation and other events are dropped.
    let mut third = new_call("acme", "run-1", "call-3", Some("use-call-3"));
    third.events.push(event(
        "acme",
        "tool_call.approval_requested",
        "run-1",
        "call-3",
    ));
    third.pending = Some(pending("acme", "call-3"));
    let outcome = store.record_call(third).await.unwrap();
    let RecordOutcome::BudgetExceeded(blocked) = outcome else {
        panic!("expected BudgetExceeded, got {outcome:?}");
    };
    assert_eq!(blocked.status, ToolCallStatus::Blocked);
    assert_eq!(blocked.error_code, Some(ErrorCode::BudgetExceeded));
    assert_eq!(
        blocked.error_text.as_deref(),
        Some("the run has used its budget of 2 tool calls")
    );
    assert_eq!(blocked.policy_decision_id, None);
    assert_eq!(
        store
            .get_tool_call(&acme, &call_id("call-3"))
            .await
            .unwrap(),
        Some(blocked)
    );
    let kinds: Vec<String> = events_of(store, "acme")
        .await
        .into_iter()
        .skip(events_before)
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["tool_call.requested", "tool_call.blocked"]);
    let blocked_event = events_of(store, "acme").await.pop().unwrap();
    assert_eq!(
        blocked_event.payload,
        json!({ "reason": "budget_exceeded" })
    );
    let run_now = store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((run_now.calls_used, run_now.pending_approvals), (2, 0));
    assert_eq!(run_now.status, RunStatus::Active);

    // A call that does not count still goes through.
    let mut free = new_call("acme", "run-1", "call-4", None);
    free.count_against_budget = false;
    assert_eq!(
        store.record_call(free).await.unwrap(),
        RecordOutcome::Recorded
    );

    // A taken call id (without a tool_use_id to match) and a missing run.
    let taken = store
        .record_call(new_call("acme", "run-1", "call-4", None))
        .await
        .map(|_| ());
    assert_exists(taken, "tool call call-4");
    let missing = store
        .record_call(new_call("acme", "run-404", "call-5", None))
        .await
        .map(|_| ());
    assert_not_found(missing, "run run-404");

    let page: Vec<String> = store
        .list_tool_calls(&acme, &run_id("run-1"), None, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(page, ["call-1", "call-2"]);
    let next: Vec<String> = store
        .list_tool_calls(&acme, &run_id("run-1"), Some(&call_id("call-2")), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(next, ["call-3", "call-4"]);
    assert_eq!(
        store
            .find_tool_call_by_use_id(
                &acme,
                &run_id("run-1"),
                &ToolUseId::new("use-call-2").unwrap()
            )
            .await
            .unwrap()
            .map(|c| c.id),
        Some(call_id("call-2"))
    );
    assert!(store.verify_chains().await.unwrap().first_problem.is_none());
}

fn pending(tenant: &str, call: &str) -> PendingInvocation {
    PendingInvocation {
        id: format!("pend-{call}"),
        tenant: tenant_id(tenant),
        run: run_id("run-1"),
        tool_call_id: call_id(call),
        tool: tool("slack.post_message"),
        arguments: json!({ "channel": "#ops", "text": "deploy" }),
        args_hash: "cd".repeat(32),
        manifest: vec![tool("slack.post_message")],
        policy_version: 1,
        origin: PendingOrigin::ApprovalRequired,
        decision: Decision::RequireExpertApproval,
        state: PendingState::Pending,
        version: 1,
        expires_at: T0.plus_ms(3_600_000),
        created_at: T0,
    }
}

#[tokio::test]
async fn pending_invocation_marks_the_run_waiting() {
    let db = seeded(5).await;
    let store = &db.store;
    let acme = tenant_id("acme");
    let mut call = new_call("acme", "run-1", "call-1", Some("use-1"));
    call.call.status = ToolCallStatus::WaitingApproval;
    call.decision.as_mut().unwrap().decision = Decision::RequireExpertApproval;
    call.pending = Some(pending("acme", "call-1"));
    call.events.push(event(
        "acme",
        "tool_call.approval_requested",
        "run-1",
        "call-1",
    ));
    assert_eq!(
        store.record_call(call).await.unwrap(),
        RecordOutcome::Recorded
    );

    let run_now = store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run_now.status, RunStatus::WaitingApproval);
    assert_eq!((run_now.pending_approvals, run_now.calls_used), (1, 1));
    let recorded = store
        .get_tool_call(&acme, &call_id("call-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recorded.status, ToolCallStatus::WaitingApproval);
    let kinds: Vec<String> = events_of(store, "acme")
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        ["tool_call.requested", "tool_call.approval_requested"]
    );

    // A waiting call is not running: finishing it changes nothing.
    assert!(!store.finish_call(finish("acme", "call-1")).await.unwrap());
}

#[tokio::test]
async fn finish_call_only_from_running() {
    let db = seeded(5).await;
    let store = &db.store;
    let acme = tenant_id("acme");
    store
        .record_call(new_call("acme", "run-1", "call-1", None))
        .await
        .unwrap();

    // Another tenant cannot finish it.
    assert!(!store.finish_call(finish("beta", "call-1")).await.unwrap());
    assert!(store.finish_call(finish("acme", "call-1")).await.unwrap());
    let done = store
        .get_tool_call(&acme, &call_id("call-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, ToolCallStatus::Succeeded);
    assert_eq!(
        done.output_redacted,
        Some(json!({ "ok": true, "ts": "1.2" }))
    );
    assert_eq!((done.duration_ms, done.attempts), (Some(12), 1));
    assert_eq!(done.updated_at, T0.plus_ms(12));
    let events_after_first = events_of(store, "acme").await.len();
    assert_eq!(events_after_first, 2);

    let mut again = finish("acme", "call-1");
    again.status = ToolCallStatus::Failed;
    assert!(!store.finish_call(again).await.unwrap());
    assert_eq!(events_of(store, "acme").await.len(), events_after_first);
    let still = store
        .get_tool_call(&acme, &call_id("call-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(still.status, ToolCallStatus::Succeeded);
    assert!(!store.finish_call(finish("acme", "call-404")).await.unwrap());
}

// --- group commit ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_commits() {
    let db = seeded(1_000).await;
    let store = Arc::new(db.store);
    let before = store.stats();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let id = format!("call-{i}");
                store
                    .record_call(new_call("acme", "run-1", &id, Some(&format!("use-{i}"))))
                    .await
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), RecordOutcome::Recorded);
    }
    let after = store.stats();
    let ops = after.ops - before.ops;
    let commits = after.commits - before.commits;
    assert_eq!(ops, 200);
    assert!(
        commits < ops,
        "200 writes took {commits} commits: nothing was batched"
    );
    assert_eq!(
        after.step_by_step, 0,
        "every call took the one-round-trip path"
    );

    let acme = tenant_id("acme");
    let run_now = store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run_now.calls_used, 200);
    let report = store.verify_chains().await.unwrap();
    assert_eq!((report.events_checked, report.first_problem), (200, None));
}

/// An operation that fails after writing rows is rolled back alone (the batch is replayed with
/// savepoints), while the operations around it commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_operation_is_rolled_back_alone() {
    let db = seeded(1_000).await;
    let store = Arc::new(db.store);
    store
        .record_call(new_call("acme", "run-1", "call-0", None))
        .await
        .unwrap();
    let tasks: Vec<_> = (1..=20)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut call = new_call("acme", "run-1", &format!("call-{i}"), None);
                if i % 5 == 0 {
                    // The call row and the budget update succeed, then the decision id clashes.
                    call.decision.as_mut().unwrap().id = "dec-call-0".into();
                }
                (i, store.record_call(call).await)
            })
        })
        .collect();
    for task in tasks {
        let (i, result) = task.await.unwrap();
        if i % 5 == 0 {
            assert!(
                matches!(&result, Err(LedgerError::AlreadyExists(what)) if what.contains("dec-call-0")),
                "{i}: {result:?}"
            );
        } else {
            assert_eq!(result.unwrap(), RecordOutcome::Recorded, "{i}");
        }
    }
    assert!(store.stats().step_by_step >= 4);
    let acme = tenant_id("acme");
    assert_eq!(
        store
            .get_tool_call(&acme, &call_id("call-5"))
            .await
            .unwrap(),
        None
    );
    let run_now = store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run_now.calls_used, 17);
    let report = store.verify_chains().await.unwrap();
    assert_eq!((report.events_checked, report.first_problem), (17, None));
}

/// One write of a batch built by [`one_batch`].
type Write = Box<dyn FnOnce(Arc<SqliteStore>) -> tokio::task::JoinHandle<Answer> + Send>;

/// What a write of [`one_batch`] answered.
#[allow(clippy::large_enum_variant)] // A handful of test values; boxing would obscure the tables.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Recorded(Result<RecordOutcome, String>),
    Finished(Result<bool, String>),
    Appended(Result<(), String>),
}

fn record(call: NewCall) -> Write {
    Box::new(move |store| {
        tokio::spawn(async move {
            Answer::Recorded(store.record_call(call).await.map_err(|e| e.to_string()))
        })
    })
}

fn finishing(call: FinishCall) -> Write {
    Box::new(move |store| {
        tokio::spawn(async move {
            Answer::Finished(store.finish_call(call).await.map_err(|e| e.to_string()))
        })
    })
}

fn appending(events: Vec<NewAuditEvent>) -> Write {
    Box::new(move |store| {
        tokio::spawn(async move {
            Answer::Appended(store.append_events(events).await.map_err(|e| e.to_string()))
        })
    })
}

/// Reopens `db` with a paused writer, queues `writes` in order, then lets the writer run: they
/// are committed as one batch. Returns the answers in order and the writer's counters.
async fn one_batch(db: Db, writes: Vec<Write>) -> (Db, Vec<Answer>, super::WriterStats) {
    db.store.close().await;
    let (store, start) = SqliteStore::open_paused(&db.path()).await.unwrap();
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for (queued, write) in writes.into_iter().enumerate() {
        tasks.push(write(Arc::clone(&store)));
        // Wait until this write is queued, so the batch keeps the given order.
        while store.queued() <= queued {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
    start.send(()).unwrap();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let stats = store.stats();
    let store = Arc::into_inner(store).expect("no other owner");
    (Db { dir: db.dir, store }, answers, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_hot_writes_is_written_in_bulk() {
    let db = seeded(100).await;
    db.store.create_tenant(tenant("beta")).await.unwrap();
    for id in ["old-1", "old-2"] {
        db.store
            .record_call(new_call("acme", "run-1", id, None))
            .await
            .unwrap();
    }
    assert!(db.store.finish_call(finish("acme", "old-2")).await.unwrap());

    let mut waiting = new_call("acme", "run-1", "call-w", Some("use-w"));
    waiting.call.status = ToolCallStatus::WaitingApproval;
    waiting.pending = Some(pending("acme", "call-w"));
    waiting.events.push(event(
        "acme",
        "tool_call.approval_requested",
        "run-1",
        "call-w",
    ));
    let mut writes: Vec<Write> = (1..=4)
        .map(|i| {
            record(new_call(
                "acme",
                "run-1",
                &format!("call-{i}"),
                Some(&format!("use-{i}")),
            ))
        })
        .collect();
    writes.push(record(waiting));
    writes.push(finishing(finish("acme", "old-1")));
    writes.push(finishing(finish("acme", "old-1")));
    writes.push(finishing(finish("acme", "old-2")));
    writes.push(appending(vec![
        NewAuditEvent {
            run: None,
            tool_call_id: None,
            ..event("beta", "admin.note", "run-1", "x")
        };
        2
    ]));
    let (db, answers, stats) = one_batch(db, writes).await;

    let mut expected = vec![Answer::Recorded(Ok(RecordOutcome::Recorded)); 5];
    expected.extend([
        Answer::Finished(Ok(true)),
        Answer::Finished(Ok(false)),
        Answer::Finished(Ok(false)),
        Answer::Appended(Ok(())),
    ]);
    assert_eq!(answers, expected);
    assert_eq!(
        (
            stats.commits,
            stats.ops,
            stats.bulk_fallbacks,
            stats.step_by_step
        ),
        (1, 9, 0, 0)
    );

    let acme = tenant_id("acme");
    let run_now = db
        .store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((run_now.calls_used, run_now.pending_approvals), (7, 1));
    assert_eq!(run_now.status, RunStatus::WaitingApproval);
    let old = db
        .store
        .get_tool_call(&acme, &call_id("old-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((old.status, old.attempts), (ToolCallStatus::Succeeded, 1));
    let decision = db
        .store
        .get_tool_call(&acme, &call_id("call-3"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(decision.policy_decision_id.as_deref(), Some("dec-call-3"));
    // 3 before (2 requested, 1 succeeded); then 4 requested, 2 for the waiting call, 1 for
    // the finish.
    let kinds: Vec<String> = events_of(&db.store, "acme")
        .await
        .into_iter()
        .skip(3)
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.approval_requested",
            "tool_call.succeeded",
        ]
    );
    assert_eq!(events_of(&db.store, "beta").await.len(), 2);
    let report = db.store.verify_chains().await.unwrap();
    assert_eq!((report.events_checked, report.first_problem), (12, None));

    // The chain heads moved with the batch: a later append continues both chains.
    db.store
        .append_events(vec![event("acme", "admin.note", "run-1", "x")])
        .await
        .unwrap();
    assert_eq!(db.store.verify_chains().await.unwrap().first_problem, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bulk_write_falls_back_to_one_by_one() {
    let db = seeded(4).await;
    db.store
        .record_call(new_call("acme", "run-1", "old-1", Some("use-old")))
        .await
        .unwrap();
    let old = db
        .store
        .get_tool_call(&tenant_id("acme"), &call_id("old-1"))
        .await
        .unwrap()
        .unwrap();

    // Budget 4 with 1 used: calls 1 to 3 fit, call 4 does not; the retry is a duplicate.
    let mut writes: Vec<Write> = (1..=4)
        .map(|i| {
            record(new_call(
                "acme",
                "run-1",
                &format!("call-{i}"),
                Some(&format!("use-{i}")),
            ))
        })
        .collect();
    writes.push(record(new_call(
        "acme",
        "run-1",
        "old-1-retry",
        Some("use-old"),
    )));
    writes.push(finishing(finish("acme", "old-1")));
    writes.push(record(new_call("acme", "run-404", "call-x", None)));
    let (db, answers, stats) = one_batch(db, writes).await;

    assert_eq!(
        answers[..3],
        vec![Answer::Recorded(Ok(RecordOutcome::Recorded)); 3]
    );
    let Answer::Recorded(Ok(RecordOutcome::BudgetExceeded(blocked))) = &answers[3] else {
        panic!("call 4 should be over budget: {:?}", answers[3]);
    };
    assert_eq!(blocked.id, call_id("call-4"));
    assert_eq!(
        answers[4],
        Answer::Recorded(Ok(RecordOutcome::Duplicate(old)))
    );
    assert_eq!(answers[5], Answer::Finished(Ok(true)));
    assert!(
        matches!(&answers[6], Answer::Recorded(Err(message)) if message.contains("run run-404")),
        "{:?}",
        answers[6]
    );
    assert_eq!((stats.commits, stats.ops, stats.bulk_fallbacks), (1, 7, 1));
    assert!(stats.step_by_step >= 3, "{stats:?}");

    let acme = tenant_id("acme");
    let run_now = db
        .store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run_now.calls_used, 4);
    let report = db.store.verify_chains().await.unwrap();
    assert_eq!(report.first_problem, None);
    // 1 before; 3 requested, requested + blocked for call 4, succeeded for old-1.
    assert_eq!(report.events_checked, 7);
}

// --- durability --------------------------------------------------------------------------------

#[tokio::test]
async fn writes_survive_reopening() {
    let db = seeded(10).await;
    db.store
        .record_call(new_call("acme", "run-1", "call-1", Some("use-1")))
        .await
        .unwrap();
    assert!(
        db.store
            .finish_call(finish("acme", "call-1"))
            .await
            .unwrap()
    );
    let db = db.reopen().await;
    let acme = tenant_id("acme");
    let call = db
        .store
        .get_tool_call(&acme, &call_id("call-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(call.status, ToolCallStatus::Succeeded);
    assert_eq!(events_of(&db.store, "acme").await.len(), 2);

    // The chain continues from the stored head.
    db.store
        .record_call(new_call("acme", "run-1", "call-2", Some("use-2")))
        .await
        .unwrap();
    let events = events_of(&db.store, "acme").await;
    assert_eq!(events.last().map(|e| e.chain_seq), Some(3));
    assert_eq!(db.store.verify_chains().await.unwrap().first_problem, None);

    // Dropping the store (no close) still leaves every acknowledged write in the file.
    let path = db.path();
    db.store
        .append_events(vec![event("acme", "admin.note", "run-1", "call-2")])
        .await
        .unwrap();
    drop(db.store);
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(events_of(&store, "acme").await.len(), 4);
    store.close().await;
    let closed = store.create_tenant(tenant("late")).await;
    assert!(matches!(closed, Err(LedgerError::Closed)), "{closed:?}");
    drop(db.dir);
}

// --- audit chain -------------------------------------------------------------------------------

/// `acme` gets 5 events and `beta` 3, interleaved.
async fn two_chains() -> Db {
    let db = seeded(100).await;
    let store = &db.store;
    store.create_tenant(tenant("beta")).await.unwrap();
    for i in 1..=5 {
        let call = format!("a-{i}");
        store
            .append_events(vec![NewAuditEvent {
                payload: json!({ "n": i }),
                at: T0.plus_ms(i),
                ..event("acme", "admin.note", "run-1", &call)
            }])
            .await
            .unwrap();
        if i <= 3 {
            store
                .append_events(vec![NewAuditEvent {
                    run: None,
                    tool_call_id: None,
                    payload: json!({ "n": i }),
                    ..event("beta", "admin.note", "run-1", "x")
                }])
                .await
                .unwrap();
        }
    }
    db
}

#[tokio::test]
async fn clean_chains_verify() {
    let db = two_chains().await;
    let report = db.store.verify_chains().await.unwrap();
    assert_eq!(
        report,
        VerifyReport {
            events_checked: 8,
            chains_checked: 2,
            first_problem: None,
        }
    );
    let events = events_of(&db.store, "acme").await;
    assert_eq!(
        events.iter().map(|e| e.chain_seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(events[0].prev_hash, crate::GENESIS_HASH);
    for pair in events.windows(2) {
        assert_eq!(pair[1].prev_hash, pair[0].hash);
    }
}

#[tokio::test]
async fn appending_events() {
    let db = seeded(10).await;
    let store = &db.store;
    store.append_events(Vec::new()).await.unwrap();
    // More events than one round trip carries go statement by statement.
    let many: Vec<NewAuditEvent> = (0..10)
        .map(|i| NewAuditEvent {
            payload: json!({ "i": i }),
            ..event("acme", "admin.note", "run-1", "x")
        })
        .collect();
    store.append_events(many).await.unwrap();
    assert_eq!(store.stats().step_by_step, 1);
    let seqs: Vec<i64> = events_of(store, "acme")
        .await
        .into_iter()
        .map(|e| e.chain_seq)
        .collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());

    // An unknown tenant has no chain to join; nothing of the request is written.
    let stray = vec![
        event("acme", "admin.note", "run-1", "x"),
        event("nope", "admin.note", "run-1", "x"),
    ];
    assert_not_found(store.append_events(stray).await, "tenant nope");
    assert_eq!(events_of(store, "acme").await.len(), 10);
    let report = store.verify_chains().await.unwrap();
    assert_eq!((report.events_checked, report.first_problem), (10, None));
}

#[tokio::test]
async fn audit_events_are_append_only() {
    let db = two_chains().await;
    let mut conn = raw_connection(&db.path()).await;
    for sql in [
        "UPDATE audit_events SET payload = '{}' WHERE chain_seq = 1",
        "DELETE FROM audit_events WHERE chain_seq = 5",
        "DELETE FROM audit_heads",
        "UPDATE audit_heads SET chain_seq = 1",
    ] {
        let error = conn.execute(sql).await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("append-only") || message.contains("audit chain heads"),
            "{sql}: {message}"
        );
    }
    conn.close().await.unwrap();
    assert_eq!(db.store.verify_chains().await.unwrap().first_problem, None);
}

/// The SQL an attacker with file access runs after dropping the triggers. `{hash3}` and
/// `{hash5}` stand for hashes recomputed the way the ledger computes them, for rewrites that
/// keep an event self-consistent.
struct Tamper {
    name: &'static str,
    sql: &'static [&'static str],
    tenant: &'static str,
    kind: ChainProblemKind,
    chain_seq: i64,
    /// A phrase the problem's detail must contain.
    detail: &'static str,
}

const TAMPERS: &[Tamper] = &[
    Tamper {
        name: "edit a payload",
        sql: &[
            "UPDATE audit_events SET payload = '{\"n\":33}' WHERE tenant = 'acme' AND chain_seq = 3",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Edited,
        chain_seq: 3,
        detail: "event 3 does not match its hash",
    },
    Tamper {
        name: "edit a timestamp",
        sql: &["UPDATE audit_events SET at = at + 1 WHERE tenant = 'acme' AND chain_seq = 1"],
        tenant: "acme",
        kind: ChainProblemKind::Edited,
        chain_seq: 1,
        detail: "event 1 does not match its hash",
    },
    Tamper {
        name: "delete a middle event",
        sql: &["DELETE FROM audit_events WHERE tenant = 'acme' AND chain_seq = 3"],
        tenant: "acme",
        kind: ChainProblemKind::Deleted,
        chain_seq: 3,
        detail: "event 3 is missing: the chain goes from event 2 to 4",
    },
    Tamper {
        name: "delete the first event",
        sql: &["DELETE FROM audit_events WHERE tenant = 'beta' AND chain_seq = 1"],
        tenant: "beta",
        kind: ChainProblemKind::Deleted,
        chain_seq: 1,
        detail: "event 1 is missing: the chain starts at event 2",
    },
    Tamper {
        name: "delete the newest event",
        sql: &["DELETE FROM audit_events WHERE tenant = 'acme' AND chain_seq = 5"],
        tenant: "acme",
        kind: ChainProblemKind::Deleted,
        chain_seq: 5,
        detail: "the head records 5 events but the chain ends at 4",
    },
    Tamper {
        name: "delete the newest events and the head",
        sql: &[
            "DELETE FROM audit_events WHERE tenant = 'beta' AND chain_seq = 3",
            "DELETE FROM audit_heads WHERE tenant = 'beta'",
        ],
        tenant: "beta",
        kind: ChainProblemKind::Deleted,
        chain_seq: 3,
        detail: "no head record",
    },
    Tamper {
        name: "swap two events' positions",
        sql: &[
            "UPDATE audit_events SET chain_seq = 1000 WHERE tenant = 'acme' AND chain_seq = 2",
            "UPDATE audit_events SET chain_seq = 2 WHERE tenant = 'acme' AND chain_seq = 3",
            "UPDATE audit_events SET chain_seq = 3 WHERE tenant = 'acme' AND chain_seq = 1000",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Reordered,
        chain_seq: 2,
        detail: "belongs at position 3",
    },
    Tamper {
        name: "swap two events' insertion order",
        sql: &[
            "CREATE TEMP TABLE original AS SELECT chain_seq, seq FROM audit_events \
             WHERE tenant = 'acme' AND chain_seq IN (2, 3)",
            "UPDATE audit_events SET seq = -seq WHERE tenant = 'acme' AND chain_seq IN (2, 3)",
            "UPDATE audit_events SET seq = (SELECT seq FROM original \
             WHERE original.chain_seq = 5 - audit_events.chain_seq) \
             WHERE tenant = 'acme' AND chain_seq IN (2, 3)",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Reordered,
        chain_seq: 3,
        detail: "rows were shuffled",
    },
    Tamper {
        name: "rewrite a middle event with a recomputed hash",
        sql: &[
            "UPDATE audit_events SET payload = '{\"n\":33}', hash = '{hash3}' WHERE tenant = 'acme' AND chain_seq = 3",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Edited,
        chain_seq: 3,
        detail: "event 3 is not the event that event 4 was chained to",
    },
    Tamper {
        name: "rewrite the newest event with a recomputed hash",
        sql: &[
            "UPDATE audit_events SET payload = '{\"n\":55}', hash = '{hash5}' WHERE tenant = 'acme' AND chain_seq = 5",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Edited,
        chain_seq: 5,
        detail: "event 5 is not the event the head records",
    },
    Tamper {
        name: "roll the head back",
        sql: &["UPDATE audit_heads SET chain_seq = 2 WHERE tenant = 'beta'"],
        tenant: "beta",
        kind: ChainProblemKind::Edited,
        chain_seq: 3,
        detail: "beyond the head",
    },
];

/// Opens a fresh pair of chains, applies `tamper` behind the store's back and checks what
/// `verify_chains` reports.
async fn check(tamper: &Tamper) {
    let db = two_chains().await;
    let acme = events_of(&db.store, "acme").await;
    let rehash = |event: &AuditEvent, payload: &str| {
        event_hash(
            &event.prev_hash,
            event.tenant.as_str(),
            event.chain_seq,
            &event.kind,
            event.run.as_ref().map(|r| r.as_str()),
            event.tool_call_id.as_ref().map(|c| c.as_str()),
            payload,
            event.at.0,
        )
    };
    let hash3 = rehash(&acme[2], "{\"n\":33}");
    let hash5 = rehash(&acme[4], "{\"n\":55}");
    db.store.close().await;

    let mut conn = raw_connection(&db.path()).await;
    for trigger in [
        "audit_events_no_update",
        "audit_events_no_delete",
        "audit_heads_forward_only",
        "audit_heads_no_delete",
    ] {
        conn.execute(sqlx::AssertSqlSafe(format!("DROP TRIGGER {trigger}")))
            .await
            .unwrap();
    }
    for sql in tamper.sql {
        let sql = sql.replace("{hash3}", &hash3).replace("{hash5}", &hash5);
        conn.execute(sqlx::AssertSqlSafe(sql)).await.unwrap();
    }
    conn.close().await.unwrap();

    let store = SqliteStore::open(&db.path()).await.unwrap();
    let report = store.verify_chains().await.unwrap();
    let problem = report
        .first_problem
        .unwrap_or_else(|| panic!("{}: tampering went unnoticed", tamper.name));
    assert_eq!(
        (problem.tenant.as_str(), problem.kind, problem.chain_seq),
        (tamper.tenant, tamper.kind, tamper.chain_seq),
        "{}: {}",
        tamper.name,
        problem.detail
    );
    assert!(
        problem.detail.contains(tamper.detail),
        "{}: `{}` should say `{}`",
        tamper.name,
        problem.detail,
        tamper.detail
    );
    assert_eq!(report.chains_checked, 2, "{}", tamper.name);
    store.close().await;
}

#[tokio::test]
async fn tampering_is_detected() {
    for tamper in TAMPERS {
        check(tamper).await;
    }
}

#[tokio::test]
async fn the_first_broken_chain_is_reported() {
    // Both chains broken: the lower tenant id wins.
    let both = Tamper {
        name: "both chains",
        sql: &[
            "DELETE FROM audit_events WHERE tenant = 'beta' AND chain_seq = 2",
            "UPDATE audit_events SET kind = 'x' WHERE tenant = 'acme' AND chain_seq = 4",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Edited,
        chain_seq: 4,
        detail: "event 4 does not match its hash",
    };
    check(&both).await;
}

#[tokio::test]
async fn credentials_are_stored_listed_replaced_and_deleted() {
    use crate::model::{CredentialKind, CredentialRecord};
    use toolgate_core::SecretName;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("ledger.db"))
        .await
        .unwrap();
    let acme = TenantId::new("acme").unwrap();
    store
        .create_tenant(Tenant {
            id: acme.clone(),
            name: "Acme".into(),
            created_at: Timestamp(1),
        })
        .await
        .unwrap();
    let name = SecretName::new("slack_default").unwrap();
    let sealed = |value: &str, key: &str, at: i64| CredentialRecord {
        tenant: acme.clone(),
        name: name.clone(),
        kind: CredentialKind::Sealed,
        value: value.into(),
        key_id: Some(key.into()),
        metadata: serde_json::json!({"team": "support"}),
        notes: "bot token".into(),
        created_by: "tok_1".into(),
        created_at: Timestamp(at),
        updated_at: Timestamp(at),
    };
    store
        .put_credential(sealed("tgs1.k1.AAA", "k1", 10))
        .await
        .unwrap();
    store
        .put_credential(sealed("tgs1.k1.BBB", "k1", 20))
        .await
        .unwrap();
    let stored = store.get_credential(&acme, &name).await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_str(), stored.created_at, stored.updated_at),
        ("tgs1.k1.BBB", Timestamp(10), Timestamp(20))
    );
    assert_eq!(
        store.sealed_key_usage().await.unwrap(),
        vec![("k1".to_owned(), 1)]
    );
    assert_eq!(
        store.list_sealed_not_under("k2", 10).await.unwrap().len(),
        1
    );
    assert!(
        store
            .list_sealed_not_under("k1", 10)
            .await
            .unwrap()
            .is_empty()
    );
    // A rewrap loses to a concurrent update: the expected value no longer matches.
    assert!(
        !store
            .replace_sealed(
                &acme,
                &name,
                "tgs1.k1.AAA",
                "tgs1.k2.CCC",
                "k2",
                Timestamp(30)
            )
            .await
            .unwrap()
    );
    assert!(
        store
            .replace_sealed(
                &acme,
                &name,
                "tgs1.k1.BBB",
                "tgs1.k2.CCC",
                "k2",
                Timestamp(30)
            )
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .get_credential(&acme, &name)
            .await
            .unwrap()
            .unwrap()
            .key_id
            .as_deref(),
        Some("k2")
    );
    assert_eq!(store.list_credentials(&acme).await.unwrap().len(), 1);
    let mut orphan = sealed("x", "k1", 1);
    orphan.tenant = TenantId::new("nobody").unwrap();
    assert!(matches!(
        store.put_credential(orphan).await,
        Err(LedgerError::NotFound(_))
    ));
    store.delete_credential(&acme, &name).await.unwrap();
    assert!(matches!(
        store.delete_credential(&acme, &name).await,
        Err(LedgerError::NotFound(_))
    ));
    assert!(store.get_credential(&acme, &name).await.unwrap().is_none());
}

#[tokio::test]
async fn of_concurrent_decisions_on_one_pending_row_exactly_one_claims_it() {
    use crate::model::{PendingFilter, ResolvePending};
    let db = std::sync::Arc::new(seeded(10).await);
    let mut suspended = new_call("acme", "run-1", "call-p", Some("use-p"));
    suspended.call.status = ToolCallStatus::WaitingApproval;
    suspended.pending = Some(pending("acme", "call-p"));
    assert_eq!(
        db.store.record_call(suspended).await.unwrap(),
        RecordOutcome::Recorded
    );
    let acme = tenant_id("acme");
    let listed = db
        .store
        .list_pending(&acme, &PendingFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].arguments,
        json!({ "channel": "#ops", "text": "deploy" })
    );
    let filtered = PendingFilter {
        run: Some(run_id("other")),
        ..PendingFilter::default()
    };
    assert!(
        db.store
            .list_pending(&acme, &filtered, 10)
            .await
            .unwrap()
            .is_empty()
    );

    let observed = listed[0].version;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let db = std::sync::Arc::clone(&db);
        let acme = acme.clone();
        tasks.push(tokio::spawn(async move {
            let approve = i % 2 == 0;
            db.store
                .resolve_pending(ResolvePending {
                    tenant: acme.clone(),
                    id: "pend-call-p".into(),
                    observed_version: observed,
                    state: if approve {
                        PendingState::Approved
                    } else {
                        PendingState::Rejected
                    },
                    decided_by: format!("approver-{i}"),
                    reason: "looks fine".into(),
                    at: T0,
                    call_status: if approve {
                        ToolCallStatus::Running
                    } else {
                        ToolCallStatus::Blocked
                    },
                    error_code: None,
                    error_text: None,
                    events: vec![event("acme", "tool_call.approved", "run-1", "call-p")],
                })
                .await
                .unwrap()
        }));
    }
    let mut claimed = 0;
    for task in tasks {
        if task.await.unwrap() {
            claimed += 1;
        }
    }
    assert_eq!(claimed, 1, "exactly one decision claims the row");
    let row = db
        .store
        .get_pending(&acme, "pend-call-p")
        .await
        .unwrap()
        .unwrap();
    assert_ne!(row.state, PendingState::Pending);
    assert_eq!(row.version, observed + 1);
    assert_eq!(
        row.arguments,
        serde_json::Value::Null,
        "arguments are dropped once decided"
    );
    assert!(
        db.store
            .list_pending(&acme, &PendingFilter::default(), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let run = db
        .store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (run.pending_approvals, run.status),
        (0, crate::model::RunStatus::Active)
    );
    let approvals = events_of(&db.store, "acme")
        .await
        .into_iter()
        .filter(|e| e.kind == "tool_call.approved")
        .count();
    assert_eq!(approvals, 1, "losers wrote no events");
    assert!(
        db.store
            .verify_chains()
            .await
            .unwrap()
            .first_problem
            .is_none()
    );
}
