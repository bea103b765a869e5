//! The contract's promises about runs and repeats, as an agent runtime meets them over a real
//! socket: run ids are per tenant, a repeated `tool_use_id` answers with the original answer
//! in full (sealed at rest, redacted once its retention ends), the outcome of an approved call
//! can be collected with `AwaitToolCall` or a replay, and a refused call is evaluated again
//! when it is repeated. Each runs on SQLite (one gateway) and on PostgreSQL (two replicas
//! sharing a schema: the repeat reaches the other replica).

use std::time::Duration;

use sqlx::Connection as _;
use toolgate_e2e::{
    BIG_TRANSFERS_NEED_APPROVAL, Backend, Cluster, ExecutionLog, Gateway, Tenant, authed, execute,
};
use toolgate_proto::v1 as pb;

const TOOLS: &[&str] = &["testkit.echo", "testkit.transfer"];

const SECRET: &str = "sk-live-5b1f0c9e2d7a4c3b8e6f";

/// One or two gateways on one ledger, a tenant `acme` (agent `support`) with the policy of the
/// approval tests.
async fn start(backend: Backend, env: &[(&str, &str)]) -> Cluster {
    let acme = Tenant::setup("acme")
        .tools(TOOLS)
        .policy(BIG_TRANSFERS_NEED_APPROVAL);
    Cluster::start(backend, env, acme).await
}

/// How many times `tool` was executed, counted outside the gateways.
fn executions(log: &ExecutionLog, tool: &str) -> usize {
    log.entries()
        .iter()
        .filter(|(name, _)| name == tool)
        .count()
}

fn keyed(run: &str, tool: &str, arguments: &str, key: &str) -> pb::ExecuteToolRequest {
    pb::ExecuteToolRequest {
        tool_use_id: key.into(),
        ..execute(run, tool, arguments)
    }
}

fn echo_with_secret() -> String {
    serde_json::json!({"message": "order 1001", "api_token": SECRET}).to_string()
}

/// Opens the run `run_id` (chosen by the caller).
async fn open_run(gateway: &Gateway, token: &str, run_id: &str) -> Result<pb::Run, tonic::Status> {
    gateway
        .agent()
        .await
        .create_run(authed(
            pb::CreateRunRequest {
                agent_id: "support".into(),
                run_id: run_id.into(),
                max_calls: 0,
            },
            token,
        ))
        .await
        .map(tonic::Response::into_inner)
}

async fn run_ids_are_per_tenant(backend: Backend) {
    let setup = start(backend, &[]).await;
    let other = setup.gateway(1).tenant("globex", "support", TOOLS).await;
    let ours = open_run(setup.gateway(0), &setup.tenant.token, "run-shared")
        .await
        .unwrap();
    // For another tenant the id is as free as any other, and its run is its own.
    let theirs = open_run(setup.gateway(1), &other, "run-shared")
        .await
        .unwrap();
    assert_eq!(
        (ours.tenant_id.as_str(), theirs.tenant_id.as_str()),
        ("acme", "globex")
    );
    let taken = open_run(setup.gateway(1), &setup.tenant.token, "run-shared")
        .await
        .unwrap_err();
    assert_eq!(taken.code(), tonic::Code::AlreadyExists, "{taken:?}");

    // The same tool_use_id in each tenant's run is two calls; neither sees the other's.
    let arguments = r#"{"message": "hi"}"#;
    let acme = setup
        .execute(0, keyed("run-shared", "testkit.echo", arguments, "tu-1"))
        .await;
    let globex = setup
        .gateway(1)
        .execute(
            &other,
            keyed("run-shared", "testkit.echo", arguments, "tu-1"),
        )
        .await;
    assert!(!acme.replayed && !globex.replayed, "{acme:?} {globex:?}");
    assert_ne!(acme.tool_call_id, globex.tool_call_id);
    let calls = setup.gateway(0).tool_calls(&other, "run-shared").await;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].tool_call_id, globex.tool_call_id);
    assert_eq!(executions(&setup.log, "testkit.echo"), 2);
}

async fn a_replay_is_the_original_answer_in_full(backend: Backend) {
    let setup = start(backend, &[]).await;
    let run = setup.open_run(0).await;
    let request = keyed(&run, "testkit.echo", &echo_with_secret(), "toolu_01");
    let first = setup.execute(0, request.clone()).await;
    assert_eq!(first.status(), pb::ToolCallStatus::Succeeded, "{first:?}");
    let again = setup.execute(1, request).await;
    assert!(again.replayed && !again.redacted, "{again:?}");
    assert_eq!(
        pb::ToolCallResult {
            replayed: false,
            ..again.clone()
        },
        first,
        "every field of the original answer"
    );
    assert!(again.result_json.contains(SECRET), "{}", again.result_json);
    assert_eq!(executions(&setup.log, "testkit.echo"), 1);
    // The ledger's own copy stays redacted.
    let recorded = setup.gateway(1).tool_calls(&setup.tenant.token, &run).await;
    assert!(!recorded[0].output_redacted_json.contains(SECRET));
}

async fn an_approved_call_is_collected_in_full(backend: Backend) {
    let setup = start(backend, &[]).await;
    let run = setup.open_run(0).await;
    let arguments = r#"{"amount": 5000, "region": "us-east-1", "account": "a-1"}"#;
    let request = keyed(&run, "testkit.transfer", arguments, "toolu_02");
    let first = setup.execute(0, request.clone()).await;
    assert_eq!(
        first.status(),
        pb::ToolCallStatus::WaitingApproval,
        "{first:?}"
    );

    // A replay while it waits names the pending invocation and the decision.
    let waiting = setup.execute(1, request.clone()).await;
    assert!(waiting.replayed);
    assert_eq!(waiting.pending_invocation_id, first.pending_invocation_id);
    assert_eq!(waiting.decision, "require_expert_approval");

    // AwaitToolCall with a short wait answers with the call as it stands.
    let mut agent = setup.gateway(1).agent().await;
    let await_request = |timeout_ms: u64| pb::AwaitToolCallRequest {
        tool_call_id: first.tool_call_id.clone(),
        timeout_ms,
    };
    let early = agent
        .await_tool_call(authed(await_request(100), &setup.tenant.token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(early.status(), pb::ToolCallStatus::WaitingApproval);
    assert_eq!(early.pending_invocation_id, first.pending_invocation_id);

    // An agent waiting on one replica while an approver decides on the other gets the result.
    let waiter = {
        let mut agent = agent.clone();
        let request = authed(await_request(60_000), &setup.tenant.token);
        tokio::spawn(async move { agent.await_tool_call(request).await })
    };
    let approver = setup.gateway(0).approver_token("acme").await;
    let resumed = setup
        .gateway(0)
        .resume(
            &approver,
            &run,
            &first.pending_invocation_id,
            pb::ResumeDecision::Approve,
            "customer confirmed",
        )
        .await;
    assert_eq!(
        resumed.outcome(),
        pb::ResumeOutcome::Executed,
        "{resumed:?}"
    );
    let collected = waiter.await.unwrap().unwrap().into_inner();
    assert_eq!(
        collected.status(),
        pb::ToolCallStatus::Succeeded,
        "{collected:?}"
    );
    let result: serde_json::Value = serde_json::from_str(&collected.result_json).unwrap();
    assert_eq!(
        result,
        serde_json::json!({"transferred": 5000, "status": "done"})
    );
    assert_eq!(collected.tool_call_id, first.tool_call_id);

    // The replay of the same tool_use_id is that outcome too; nothing ran twice.
    let replayed = setup.execute(1, request).await;
    assert!(replayed.replayed);
    assert_eq!(replayed.result_json, collected.result_json);
    assert_eq!(executions(&setup.log, "testkit.transfer"), 1);

    // Another tenant's token cannot wait on it.
    let other = setup.gateway(0).tenant("globex", "support", TOOLS).await;
    let stranger = agent
        .await_tool_call(authed(await_request(0), &other))
        .await
        .unwrap_err();
    assert_eq!(stranger.code(), tonic::Code::NotFound, "{stranger:?}");
}

async fn a_refused_call_is_evaluated_again(backend: Backend) {
    let setup = start(backend, &[]).await;
    let run = setup.open_run(0).await;
    setup.gateway(0).set_tool_calling("acme", false).await;
    let request = keyed(&run, "testkit.echo", r#"{"message": "hi"}"#, "toolu_03");
    let refused = setup.execute(0, request.clone()).await;
    assert_eq!(refused.error_code, "FEATURE_DISABLED", "{refused:?}");

    setup.gateway(0).set_tool_calling("acme", true).await;
    let executed = setup.execute(1, request.clone()).await;
    assert_eq!(
        executed.status(),
        pb::ToolCallStatus::Succeeded,
        "{executed:?}"
    );
    assert!(!executed.replayed);
    assert_eq!(
        executed.tool_call_id, refused.tool_call_id,
        "the same call, evaluated again"
    );
    let replay = setup.execute(0, request.clone()).await;
    assert!(replay.replayed, "{replay:?}");
    assert_eq!(executions(&setup.log, "testkit.echo"), 1);

    let conflict = setup
        .try_execute(
            0,
            keyed(&run, "testkit.echo", r#"{"message": "other"}"#, "toolu_03"),
        )
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), tonic::Code::AlreadyExists, "{conflict:?}");
    let verified = setup.gateway(1).verify_ledger().await;
    assert!(verified.ok, "{verified:?}");
}

macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await;
            }

            #[tokio::test]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await;
            }
        }
    };
}

on_both!(run_ids_are_per_tenant);
on_both!(a_replay_is_the_original_answer_in_full);
on_both!(an_approved_call_is_collected_in_full);
on_both!(a_refused_call_is_evaluated_again);

/// On disk the full answer is sealed; past its retention it is given redacted, and the sweep
/// (at start-up and every 30 s) removes it.
#[tokio::test]
async fn answers_are_sealed_at_rest_and_purged_after_their_retention() {
    let setup = start(Backend::Sqlite, &[("TOOLGATE_ANSWER_RETENTION_MS", "1500")]).await;
    let gateway = setup.gateway(0);
    let run = gateway.open_run(&setup.tenant.token, "support", 0).await;
    let request = keyed(&run, "testkit.echo", &echo_with_secret(), "toolu_04");
    let first = setup.execute(0, request.clone()).await;
    let fresh = setup.execute(0, request.clone()).await;
    assert!(
        fresh.replayed && fresh.result_json.contains(SECRET),
        "{fresh:?}"
    );

    let database = gateway.dir.join("toolgate.db");
    let sealed = sealed_answer(&database, &first.tool_call_id).await;
    let sealed = sealed.expect("the answer is kept");
    assert!(sealed.starts_with("tgs1."), "{sealed}");
    assert!(!sealed.contains(SECRET));

    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let late = setup.execute(0, request.clone()).await;
    assert!(late.replayed && late.redacted, "{late:?}");
    assert!(!late.result_json.contains(SECRET), "{}", late.result_json);
    assert!(
        late.result_json.contains("[REDACTED]"),
        "{}",
        late.result_json
    );
    assert_eq!(late.status(), pb::ToolCallStatus::Succeeded);

    // A restart sweeps at once: the sealed answer is gone from the file.
    let dir = gateway.dir.clone();
    let admin_token = gateway.admin_token.clone();
    let Cluster { gateways, log, .. } = setup;
    let temp = gateways.into_iter().next().unwrap().stop();
    let _restarted = Gateway::options()
        .dir(&dir)
        .admin_token(&admin_token)
        .env("TOOLGATE_ANSWER_RETENTION_MS", "1500")
        .execution_log(&log)
        .start();
    let mut waited = Duration::ZERO;
    while sealed_answer(&database, &first.tool_call_id)
        .await
        .is_some()
    {
        assert!(
            waited < Duration::from_secs(60),
            "the sweep did not purge the answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }
    drop(temp);
}

/// The sealed answer column of a call, read from the SQLite file as an outsider would.
async fn sealed_answer(database: &std::path::Path, call: &str) -> Option<String> {
    let url = format!("sqlite://{}?mode=ro", database.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("open the ledger file");
    let sealed: Option<String> =
        sqlx::query_scalar("SELECT answer_sealed FROM tool_calls WHERE id = ?")
            .bind(call)
            .fetch_one(&mut conn)
            .await
            .expect("the call row");
    conn.close().await.ok();
    sealed
}
