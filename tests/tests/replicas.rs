//! Exactly-once execution with real processes and real databases: concurrent approvals of one
//! pending invocation, a thousand invocations raced by eight approvers, repeated `tool_use_id`s
//! (also while the first call still runs), and a gateway killed with `kill -9` mid-call, also
//! while another replica keeps running calls. Each runs on PostgreSQL (two gateway processes
//! sharing one schema, behaving as one gateway); the first three also on SQLite (one gateway;
//! its kill -9 test is in `gateway.rs`).
//!
//! Executions are counted outside the gateways: the testkit connector appends one line per
//! invocation to a shared file (`TESTKIT_EXECUTION_LOG`), which survives the processes. The
//! PostgreSQL tests need a server (`TOOLGATE_TEST_PG_URL`, see the harness); they fail, not
//! skip, without one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use toolgate_e2e::{
    BIG_TRANSFERS_NEED_APPROVAL, Backend, Cluster, ExecutionLog, PgSchema, Tenant, authed, execute,
    gateway_binary,
};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::approval_service_client::ApprovalServiceClient;

const TOOLS: &[&str] = &[
    "testkit.transfer",
    "testkit.sleep",
    "testkit.sleep_write",
    "testkit.noop",
];

/// Liveness bound for waits on the gateways (not a speed assertion).
const PATIENCE: Duration = Duration::from_secs(60);

/// The gateways of one test, a tenant `acme` with an agent `support`, the approval policy,
/// an agent and an approver token.
async fn start(backend: Backend) -> Cluster {
    let acme = Tenant::setup("acme")
        .tools(TOOLS)
        .policy(BIG_TRANSFERS_NEED_APPROVAL)
        .approver();
    let cluster = Cluster::start(backend, &[], acme).await;
    if let Some(schema) = &cluster.schema {
        in_use(schema).await;
    }
    cluster
}

/// A call suspended for approval on gateway `gateway`: `(tool_call_id, pending_invocation_id)`.
async fn suspended_transfer(
    cluster: &Cluster,
    gateway: usize,
    run: &str,
    n: usize,
) -> (String, String) {
    let arguments = format!(
        r#"{{"amount": {}, "region": "us-east-1", "account": "acct-{n}"}}"#,
        5000 + n
    );
    let result = cluster
        .try_execute(gateway, execute(run, "testkit.transfer", &arguments))
        .await
        .unwrap_or_else(|e| panic!("suspending transfer {n}: {e}"));
    assert_eq!(
        result.status(),
        pb::ToolCallStatus::WaitingApproval,
        "{result:?}"
    );
    assert!(!result.pending_invocation_id.is_empty(), "{result:?}");
    (result.tool_call_id, result.pending_invocation_id)
}

/// The gateway migrated the schema: it is on PostgreSQL, not on a file of its own.
async fn in_use(schema: &PgSchema) {
    let tables = schema.tables().await;
    assert!(
        tables.iter().any(|t| t == "tool_calls"),
        "schema {} has no tool_calls table: {tables:?}",
        schema.name()
    );
}

fn approve(run: &str, invocation: &str) -> pb::ResumeRequest {
    pb::ResumeRequest {
        run_id: run.into(),
        invocation_id: invocation.into(),
        decision: pb::ResumeDecision::Approve.into(),
        reason: "e2e".into(),
    }
}

/// `0..n` in an order of its own for each seed: forward, backward, then shuffles.
fn order(n: usize, seed: u64) -> Vec<usize> {
    let mut items: Vec<usize> = (0..n).collect();
    match seed {
        0 => {}
        1 => items.reverse(),
        _ => {
            // xorshift64*, enough to spread the approvers over different invocations.
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for i in (1..n).rev() {
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
                let j = usize::try_from(r % (i as u64 + 1)).expect("small index");
                items.swap(i, j);
            }
        }
    }
    items
}

// ---------------------------------------------------------------------------------------------
// 64 concurrent approvals of one invocation
// ---------------------------------------------------------------------------------------------

async fn concurrent_approvals_of_one_invocation(backend: Backend) {
    const APPROVERS: usize = 64;
    let cluster = start(backend).await;
    let run = cluster.open_run(0).await;
    let (call_id, invocation) = suspended_transfer(&cluster, 0, &run, 1).await;

    // Every client connected before anyone decides, then all released at once.
    let barrier = Arc::new(tokio::sync::Barrier::new(APPROVERS));
    let mut tasks = Vec::new();
    for i in 0..APPROVERS {
        let mut client = ApprovalServiceClient::new(cluster.gateway(i).channel().await);
        let request = authed(approve(&run, &invocation), cluster.tenant.approver());
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            client.resume(request).await
        }));
    }
    let mut executed = Vec::new();
    let mut lost = 0;
    let mut other = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.expect("approval task") {
            Ok(response) => {
                let response = response.into_inner();
                match response.outcome() {
                    pb::ResumeOutcome::Executed => executed.push((i, response)),
                    pb::ResumeOutcome::ClaimLost => lost += 1,
                    outcome => other.push(format!("approver {i}: {outcome:?} {response:?}")),
                }
            }
            Err(status) => other.push(format!("approver {i}: error {status:?}")),
        }
    }
    assert!(
        other.is_empty(),
        "every approval must answer EXECUTED or CLAIM_LOST; got {} other answer(s):\n{}",
        other.len(),
        other.join("\n")
    );
    assert_eq!(
        (executed.len(), lost),
        (1, APPROVERS - 1),
        "exactly one approval executes: {executed:?}"
    );
    let result = executed[0].1.result.as_ref().expect("executed result");
    assert_eq!(result.status(), pb::ToolCallStatus::Succeeded, "{result:?}");
    assert_eq!(result.tool_call_id, call_id);

    let entries = cluster.log.entries();
    assert_eq!(
        entries,
        vec![("testkit.transfer".to_owned(), call_id.clone())],
        "the connector ran exactly once"
    );
    for gateway in &cluster.gateways {
        let recorded = gateway.get_tool_call(&cluster.tenant.token, &call_id).await;
        assert_eq!(
            recorded.status(),
            pb::ToolCallStatus::Succeeded,
            "{recorded:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_sixty_four_concurrent_approvals_execute_once() {
    concurrent_approvals_of_one_invocation(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_sixty_four_concurrent_approvals_across_two_replicas_execute_once() {
    concurrent_approvals_of_one_invocation(Backend::Postgres).await;
}

// ---------------------------------------------------------------------------------------------
// 1,000 invocations, 8 approvers each trying every one
// ---------------------------------------------------------------------------------------------

async fn eight_approvers_over_a_thousand_invocations(backend: Backend) {
    const INVOCATIONS: usize = 1000;
    const APPROVERS: usize = 8;
    const WRITERS: usize = 16;
    let cluster = Arc::new(start(backend).await);
    let max_calls = u32::try_from(INVOCATIONS * 2).expect("small budget");
    let run = cluster.open_run(max_calls).await;

    // Suspend the calls, sixteen at a time, over every replica.
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let cluster = Arc::clone(&cluster);
        let run = run.clone();
        writers.push(tokio::spawn(async move {
            let mut suspended = Vec::new();
            for n in (w..INVOCATIONS).step_by(WRITERS) {
                suspended.push((n, suspended_transfer(&cluster, w, &run, n).await));
            }
            suspended
        }));
    }
    let mut pending = vec![(String::new(), String::new()); INVOCATIONS];
    for writer in writers {
        for (n, call) in writer.await.expect("writer task") {
            pending[n] = call;
        }
    }
    assert!(
        cluster.log.entries().is_empty(),
        "nothing runs before approval"
    );
    let pending = Arc::new(pending);

    let mut approvers = Vec::new();
    for a in 0..APPROVERS {
        let mut client = ApprovalServiceClient::new(cluster.gateway(a).channel().await);
        let token = cluster.tenant.approver().to_owned();
        let run = run.clone();
        let pending = Arc::clone(&pending);
        approvers.push(tokio::spawn(async move {
            let mut answers = Vec::with_capacity(INVOCATIONS);
            for n in order(INVOCATIONS, a as u64) {
                let answer = client
                    .resume(authed(approve(&run, &pending[n].1), &token))
                    .await
                    .map(tonic::Response::into_inner);
                answers.push((n, answer));
            }
            answers
        }));
    }
    let mut executed: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut lost = 0usize;
    let mut problems = Vec::new();
    for (a, approver) in approvers.into_iter().enumerate() {
        for (n, answer) in approver.await.expect("approver task") {
            match answer {
                Ok(response) => match response.outcome() {
                    pb::ResumeOutcome::Executed => {
                        executed.entry(n).or_default().push(a);
                        let status = response.result.as_ref().map(pb::ToolCallResult::status);
                        if status != Some(pb::ToolCallStatus::Succeeded) {
                            problems.push(format!(
                                "invocation {n}, approver {a}: executed as {response:?}"
                            ));
                        }
                    }
                    pb::ResumeOutcome::ClaimLost => lost += 1,
                    outcome => problems.push(format!(
                        "invocation {n}, approver {a}: {outcome:?} {response:?}"
                    )),
                },
                Err(status) => {
                    problems.push(format!("invocation {n}, approver {a}: error {status:?}"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} unexpected answer(s), the first ones:\n{}",
        problems.len(),
        problems
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let twice: Vec<_> = executed.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "invocations executed by more than one approver: {twice:?}"
    );
    let missing: Vec<usize> = (0..INVOCATIONS)
        .filter(|n| !executed.contains_key(n))
        .collect();
    assert!(missing.is_empty(), "never executed: {missing:?}");
    assert_eq!(lost, INVOCATIONS * (APPROVERS - 1));

    // The connector's own count, from outside the gateways.
    let counts = cluster.log.counts();
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "tool calls the connector executed more than once: {repeated:?}"
    );
    let expected: BTreeSet<&str> = pending.iter().map(|(call, _)| call.as_str()).collect();
    let logged: BTreeSet<&str> = counts.keys().map(String::as_str).collect();
    assert_eq!(logged, expected, "exactly the approved calls ran");
    assert_eq!(cluster.log.entries().len(), INVOCATIONS);

    let calls = cluster
        .gateway(1)
        .tool_calls(&cluster.tenant.token, &run)
        .await;
    assert_eq!(calls.len(), INVOCATIONS);
    let not_succeeded: Vec<_> = calls
        .iter()
        .filter(|c| c.status() != pb::ToolCallStatus::Succeeded)
        .map(|c| (&c.tool_call_id, c.status()))
        .collect();
    assert!(not_succeeded.is_empty(), "{not_succeeded:?}");
    let verified = cluster.gateway(0).verify_ledger().await;
    assert!(verified.ok, "{verified:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_thousand_invocations_raced_by_eight_approvers_execute_once_each() {
    eight_approvers_over_a_thousand_invocations(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_a_thousand_invocations_raced_by_eight_approvers_over_two_replicas_execute_once_each() {
    eight_approvers_over_a_thousand_invocations(Backend::Postgres).await;
}

// ---------------------------------------------------------------------------------------------
// Repeated tool_use_id, also while the first call is running
// ---------------------------------------------------------------------------------------------

async fn repeated_tool_use_ids_execute_once(backend: Backend) {
    const REPEATS: usize = 8;
    let cluster = Arc::new(start(backend).await);
    let run = cluster.open_run(1000).await;

    // A repeat while the first call runs. The first goes to gateway 0, the repeats to the
    // other replica (and some to the first one too). Whether a repeat arrived while the first
    // was still running shows in its answer (RUNNING); if the machine was too slow for that,
    // try again with a longer sleep rather than assert on timing.
    let mut overlapped = false;
    for (attempt, ms) in [2_000u64, 10_000, 30_000].into_iter().enumerate() {
        let use_id = format!("toolu_running_{attempt}");
        let mut request = execute(&run, "testkit.sleep", &format!(r#"{{"ms": {ms}}}"#));
        request.tool_use_id = use_id.clone();
        request.timeout_ms = 120_000;
        let before = cluster.log.entries().len();
        let first = {
            let cluster = Arc::clone(&cluster);
            let request = request.clone();
            tokio::spawn(async move { cluster.try_execute(0, request).await })
        };
        // The connector has been entered: the call is running.
        let entries = cluster.log.wait_for(before + 1, PATIENCE).await;
        let call_id = entries[before].1.clone();
        let mut repeats = Vec::new();
        for r in 0..REPEATS {
            let cluster = Arc::clone(&cluster);
            let request = request.clone();
            // Replica 1 (on SQLite the only gateway) for most; replica 0 for every fourth.
            let g = if r % 4 == 3 { 0 } else { 1 };
            repeats.push(tokio::spawn(async move {
                cluster.try_execute(g, request).await
            }));
        }
        let mut saw_running = false;
        for repeat in repeats {
            let answer = repeat
                .await
                .expect("repeat task")
                .unwrap_or_else(|e| panic!("a repeat of `{use_id}` was refused: {e:?}"));
            assert!(answer.replayed, "a repeat is a replay: {answer:?}");
            assert_eq!(answer.tool_call_id, call_id, "{answer:?}");
            match answer.status() {
                pb::ToolCallStatus::Running => saw_running = true,
                pb::ToolCallStatus::Succeeded => {}
                status => panic!("a repeat of a running sleep answered {status:?}: {answer:?}"),
            }
        }
        let first = first
            .await
            .expect("first call task")
            .expect("first call answered");
        assert_eq!(first.status(), pb::ToolCallStatus::Succeeded, "{first:?}");
        assert!(!first.replayed, "{first:?}");
        assert_eq!(first.tool_call_id, call_id);
        // And once it is over, from either replica: the recorded outcome, no second run.
        for g in 0..2 {
            let after = cluster
                .try_execute(g, request.clone())
                .await
                .expect("repeat after completion");
            assert!(after.replayed, "{after:?}");
            assert_eq!(after.tool_call_id, call_id);
            assert_eq!(after.status(), pb::ToolCallStatus::Succeeded, "{after:?}");
        }
        assert_eq!(
            cluster.log.counts().get(&call_id),
            Some(&1),
            "`{use_id}` executed once: {:?}",
            cluster.log.entries()
        );
        if saw_running {
            overlapped = true;
            break;
        }
    }
    assert!(
        overlapped,
        "no repeat arrived while the first call was running, even with a 30 s sleep"
    );

    // Many first attempts at once, over the replicas: one executes, the others replay it.
    const RACERS: usize = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut racers = Vec::new();
    for r in 0..RACERS {
        let mut request = execute(&run, "testkit.sleep", r#"{"ms": 200}"#);
        request.tool_use_id = "toolu_race".into();
        request.timeout_ms = 120_000;
        let mut client = cluster.gateway(r).agent().await;
        let token = cluster.tenant.token.clone();
        let barrier = Arc::clone(&barrier);
        racers.push(tokio::spawn(async move {
            barrier.wait().await;
            client
                .execute_tool(authed(request, &token))
                .await
                .map(tonic::Response::into_inner)
        }));
    }
    let mut fresh = Vec::new();
    let mut ids = BTreeSet::new();
    for racer in racers {
        let answer = racer
            .await
            .expect("racer task")
            .unwrap_or_else(|e| panic!("a concurrent first attempt was refused: {e:?}"));
        ids.insert(answer.tool_call_id.clone());
        if !answer.replayed {
            fresh.push(answer);
        } else {
            assert!(
                matches!(
                    answer.status(),
                    pb::ToolCallStatus::Running | pb::ToolCallStatus::Succeeded
                ),
                "{answer:?}"
            );
        }
    }
    assert_eq!(fresh.len(), 1, "exactly one attempt executes: {fresh:?}");
    assert_eq!(ids.len(), 1, "every attempt names the same call: {ids:?}");
    let race_id = ids.into_iter().next().expect("one id");
    assert_eq!(fresh[0].status(), pb::ToolCallStatus::Succeeded);
    let counts = cluster.log.counts();
    assert_eq!(counts.get(&race_id), Some(&1), "{counts:?}");
    assert!(
        counts.values().all(|n| *n == 1),
        "no call executed twice: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_repeated_tool_use_id_never_executes_twice_even_while_running() {
    repeated_tool_use_ids_execute_once(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_a_repeated_tool_use_id_never_executes_twice_across_replicas_even_while_running() {
    repeated_tool_use_ids_execute_once(Backend::Postgres).await;
}

// ---------------------------------------------------------------------------------------------
// kill -9 with calls in flight
// ---------------------------------------------------------------------------------------------

fn sleep_write(run: &str, use_id: &str, ms: u64) -> pb::ExecuteToolRequest {
    let mut request = execute(run, "testkit.sleep_write", &format!(r#"{{"ms": {ms}}}"#));
    request.tool_use_id = use_id.into();
    request.timeout_ms = 120_000;
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_kill_9_with_calls_in_flight_then_restart_executes_nothing_twice() {
    const DONE: usize = 8;
    const IN_FLIGHT: usize = 16;
    const LATE: usize = 8;
    let schema = PgSchema::new().await;
    let log = ExecutionLog::new();
    let gateway = schema.options().execution_log(&log).start();
    in_use(&schema).await;
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 1000).await;
    let admin_token = gateway.admin_token.clone();

    // Calls that finish before the crash.
    let mut agent = gateway.agent().await;
    for i in 0..DONE {
        let done = agent
            .execute_tool(authed(
                sleep_write(&run, &format!("toolu_done_{i}"), 0),
                &token,
            ))
            .await
            .expect("quick call")
            .into_inner();
        assert_eq!(done.status(), pb::ToolCallStatus::Succeeded, "{done:?}");
    }
    // Slow writes, each in its connector when the process dies.
    let mut in_flight = Vec::new();
    for i in 0..IN_FLIGHT {
        let mut agent = gateway.agent().await;
        let request = authed(
            sleep_write(&run, &format!("toolu_slow_{i}"), 60_000),
            &token,
        );
        in_flight.push(tokio::spawn(
            async move { agent.execute_tool(request).await },
        ));
    }
    log.wait_for(DONE + IN_FLIGHT, PATIENCE).await;
    // Short writes sent right before the kill: each may be anywhere (not yet recorded,
    // running, finished).
    let mut late = Vec::new();
    for i in 0..LATE {
        let mut agent = gateway.agent().await;
        let request = authed(sleep_write(&run, &format!("toolu_late_{i}"), 50), &token);
        late.push(tokio::spawn(
            async move { agent.execute_tool(request).await },
        ));
    }
    // Kill once at least one of them has reached its connector.
    log.wait_for(DONE + IN_FLIGHT + 1, PATIENCE).await;
    let dir = gateway.dir.clone();
    let temp = gateway.stop(); // SIGKILL
    for (i, call) in in_flight.into_iter().enumerate() {
        assert!(
            call.await.expect("in-flight task").is_err(),
            "slow call {i} cannot have been answered: its connector was still sleeping"
        );
    }
    for call in late {
        let _ = call.await.expect("late task");
    }

    // Restart on the same schema. This gateway finds an admin token in the database, so it
    // writes no file: it reuses the first one's.
    let restarted = schema
        .options()
        .dir(&dir)
        .admin_token(&admin_token)
        .execution_log(&log)
        .start();
    // Interrupted calls are settled before the gateway serves; a gateway that settles them
    // later gets a liveness bound, not a speed assertion.
    let started = std::time::Instant::now();
    let calls = loop {
        let calls = restarted.tool_calls(&token, &run).await;
        if calls
            .iter()
            .all(|c| c.status() != pb::ToolCallStatus::Running)
        {
            break calls;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "calls still running {PATIENCE:?} after the restart: {:?}",
            calls
                .iter()
                .filter(|c| c.status() == pb::ToolCallStatus::Running)
                .map(|c| &c.tool_use_id)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let by_use_id: BTreeMap<&str, &pb::ToolCall> =
        calls.iter().map(|c| (c.tool_use_id.as_str(), c)).collect();
    assert_eq!(by_use_id.len(), calls.len(), "one call per tool_use_id");
    let counts = log.counts();
    for call in &calls {
        let executions = counts.get(&call.tool_call_id).copied().unwrap_or(0);
        let status = call.status();
        let expected = if call.tool_use_id.starts_with("toolu_done_") {
            vec![pb::ToolCallStatus::Succeeded]
        } else if call.tool_use_id.starts_with("toolu_slow_") {
            vec![pb::ToolCallStatus::OutcomeUnknown]
        } else {
            vec![
                pb::ToolCallStatus::Succeeded,
                pb::ToolCallStatus::OutcomeUnknown,
            ]
        };
        assert!(
            expected.contains(&status),
            "{}: {status:?}, expected one of {expected:?}: {call:?}",
            call.tool_use_id
        );
        match status {
            pb::ToolCallStatus::Succeeded => assert_eq!(executions, 1, "{call:?}"),
            _ => assert!(executions <= 1, "{call:?} executed {executions} times"),
        }
        if status == pb::ToolCallStatus::OutcomeUnknown {
            assert_eq!(call.error_code, "OUTCOME_UNKNOWN", "{call:?}");
        }
    }
    for i in 0..DONE {
        assert!(by_use_id.contains_key(format!("toolu_done_{i}").as_str()));
    }
    for i in 0..IN_FLIGHT {
        let call = by_use_id
            .get(format!("toolu_slow_{i}").as_str())
            .unwrap_or_else(|| panic!("toolu_slow_{i} was executed, so it is recorded"));
        assert_eq!(counts.get(&call.tool_call_id), Some(&1), "{call:?}");
    }

    // The runtime retries everything: recorded calls replay, never re-run; a late call that
    // never reached the ledger runs now, once.
    let mut agent = restarted.agent().await;
    let retries = (0..DONE)
        .map(|i| (format!("toolu_done_{i}"), 0))
        .chain((0..IN_FLIGHT).map(|i| (format!("toolu_slow_{i}"), 60_000)))
        .chain((0..LATE).map(|i| (format!("toolu_late_{i}"), 50)));
    for (use_id, ms) in retries {
        let answer = agent
            .execute_tool(authed(sleep_write(&run, &use_id, ms), &token))
            .await
            .unwrap_or_else(|e| panic!("retry of {use_id}: {e:?}"))
            .into_inner();
        match by_use_id.get(use_id.as_str()) {
            Some(recorded) => {
                assert!(answer.replayed, "{use_id}: {answer:?}");
                assert_eq!(answer.tool_call_id, recorded.tool_call_id, "{use_id}");
                assert_eq!(answer.status(), recorded.status(), "{use_id}: {answer:?}");
            }
            None => {
                assert!(!answer.replayed, "{use_id}: {answer:?}");
                assert_eq!(answer.status(), pb::ToolCallStatus::Succeeded, "{answer:?}");
            }
        }
    }
    let counts = log.counts();
    assert!(
        counts.values().all(|n| *n == 1),
        "a call executed twice: {counts:?}"
    );
    let all_calls = restarted.tool_calls(&token, &run).await;
    assert_eq!(all_calls.len(), DONE + IN_FLIGHT + LATE);
    let known: BTreeSet<&str> = all_calls.iter().map(|c| c.tool_call_id.as_str()).collect();
    assert!(
        counts.keys().all(|id| known.contains(id.as_str())),
        "every execution belongs to a recorded call: {counts:?}"
    );

    let verified = restarted.verify_ledger().await;
    assert!(
        verified.ok,
        "the audit chain verifies after kill -9: {verified:?}"
    );
    assert!(verified.events_checked > 0, "{verified:?}");
    drop(restarted);
    drop(temp);
    // And offline, with no gateway running.
    let offline = ledger_verify(&schema);
    assert_eq!(offline["ok"], true, "{offline}");
}

/// `toolgate ledger verify` on the schema, its JSON report.
fn ledger_verify(schema: &PgSchema) -> serde_json::Value {
    let output = std::process::Command::new(gateway_binary())
        .args(["ledger", "verify", "--database", schema.url(), "--schema"])
        .arg(schema.name())
        .env("TOOLGATE_LOG", "warn")
        .env_remove("TOOLGATE_BIN")
        .env_remove("TOOLGATE_TEST_PG_URL")
        .env_remove("TOOLGATE_DATABASE")
        .env_remove("TOOLGATE_DATABASE_SCHEMA")
        .output()
        .expect("run toolgate ledger verify");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "toolgate ledger verify printed no JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert!(output.status.success(), "{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_restarting_a_killed_replica_leaves_the_other_replicas_calls_alone() {
    const EACH: usize = 4;
    let mut cluster = start(Backend::Postgres).await;
    let run = cluster.open_run(100).await;
    // Replica 1's calls outlive replica 0's restart; replica 0's die with it.
    let mut survivors = Vec::new();
    for i in 0..EACH {
        let mut agent = cluster.gateway(1).agent().await;
        let request = authed(
            sleep_write(&run, &format!("toolu_b_{i}"), 10_000),
            &cluster.tenant.token,
        );
        survivors.push(tokio::spawn(
            async move { agent.execute_tool(request).await },
        ));
    }
    let mut doomed = Vec::new();
    for i in 0..EACH {
        let mut agent = cluster.gateway(0).agent().await;
        let request = authed(
            sleep_write(&run, &format!("toolu_a_{i}"), 60_000),
            &cluster.tenant.token,
        );
        doomed.push(tokio::spawn(
            async move { agent.execute_tool(request).await },
        ));
    }
    cluster.log.wait_for(2 * EACH, PATIENCE).await;

    let killed = cluster.gateways.remove(0);
    let admin_token = killed.admin_token.clone();
    let dir = killed.dir.clone();
    let temp = killed.stop(); // SIGKILL
    for call in doomed {
        assert!(call.await.expect("doomed task").is_err());
    }
    let schema = cluster.schema.as_ref().expect("a PostgreSQL cluster");
    let restarted = schema
        .options()
        .dir(&dir)
        .admin_token(&admin_token)
        .execution_log(&cluster.log)
        .start();
    let calls = restarted.tool_calls(&cluster.tenant.token, &run).await;
    let still_running = calls
        .iter()
        .filter(|c| c.tool_use_id.starts_with("toolu_b_"))
        .filter(|c| c.status() == pb::ToolCallStatus::Running)
        .count();
    if still_running == 0 {
        eprintln!(
            "note: replica 1's calls were done before replica 0 restarted; the overlap was not exercised"
        );
    }

    for (i, call) in survivors.into_iter().enumerate() {
        let answer = call
            .await
            .expect("survivor task")
            .unwrap_or_else(|e| panic!("replica 1's call {i} failed: {e:?}"))
            .into_inner();
        assert_eq!(
            answer.status(),
            pb::ToolCallStatus::Succeeded,
            "replica 1 finished its call despite replica 0's restart: {answer:?}"
        );
    }
    let started = std::time::Instant::now();
    let calls = loop {
        let calls = restarted.tool_calls(&cluster.tenant.token, &run).await;
        if calls
            .iter()
            .all(|c| c.status() != pb::ToolCallStatus::Running)
        {
            break calls;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "calls still running: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(calls.len(), 2 * EACH);
    let counts = cluster.log.counts();
    for call in &calls {
        let expected = if call.tool_use_id.starts_with("toolu_b_") {
            // What its agent was told is what the ledger says.
            pb::ToolCallStatus::Succeeded
        } else {
            pb::ToolCallStatus::OutcomeUnknown
        };
        assert_eq!(call.status(), expected, "{call:?}");
        assert_eq!(counts.get(&call.tool_call_id), Some(&1), "{call:?}");
    }
    assert_eq!(cluster.log.entries().len(), 2 * EACH);
    let verified = restarted.verify_ledger().await;
    assert!(verified.ok, "{verified:?}");
    drop(restarted);
    drop(temp);
    let offline = ledger_verify(cluster.schema.as_ref().expect("a PostgreSQL cluster"));
    assert_eq!(offline["ok"], true, "{offline}");
}
