//! One owner per ledger, with real processes: a second `toolgate serve` on a SQLite file that
//! a gateway is serving is refused, naming the holder, and leaves that gateway's calls alone;
//! `toolgate ledger verify` reads the file beside it; a gateway killed with `kill -9` leaves no
//! lock behind. On PostgreSQL, a replica whose instance-lock connection is terminated starts no
//! call until it holds the lock again, and never tells its agent something the ledger
//! contradicts, also when another replica settled its running call meanwhile.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection as _;
use toolgate_e2e::{ExecutionLog, Gateway, PgRole, PgSchema, authed, execute, gateway_binary};
use toolgate_proto::v1 as pb;

const TOOLS: &[&str] = &["testkit.noop", "testkit.sleep_write"];

/// Liveness bound for waits on the gateways (not a speed assertion).
const PATIENCE: Duration = Duration::from_secs(60);

/// A slow write (not idempotent) of `ms` milliseconds with a timeout well beyond it.
fn slow_write(run: &str, ms: u64) -> pb::ExecuteToolRequest {
    pb::ExecuteToolRequest {
        timeout_ms: 120_000,
        ..execute(run, "testkit.sleep_write", &format!(r#"{{"ms": {ms}}}"#))
    }
}

/// Starts `request` on `gateway` in a task of its own.
async fn spawn_call(
    gateway: &Gateway,
    token: &str,
    request: pb::ExecuteToolRequest,
) -> tokio::task::JoinHandle<Result<pb::ToolCallResult, tonic::Status>> {
    let mut agent = gateway.agent().await;
    let token = token.to_owned();
    tokio::spawn(async move {
        agent
            .execute_tool(authed(request, &token))
            .await
            .map(tonic::Response::into_inner)
    })
}

/// Runs `toolgate` with `args` in `dir` (none of the test's `TOOLGATE_*` variables), waiting
/// at most [`PATIENCE`]; a process still running then is killed and the test fails.
fn run_toolgate(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(gateway_binary());
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("TOOLGATE_LOG", "warn");
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("TOOLGATE_")) && key != "TOOLGATE_LOG" {
            command.env_remove(&key);
        }
    }
    let mut child = command.spawn().expect("start toolgate");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("poll toolgate").is_some() {
            return child.wait_with_output().expect("toolgate output");
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            let output = child.wait_with_output().expect("toolgate output");
            panic!(
                "`toolgate {}` still ran after {PATIENCE:?}; stdout: {}; stderr: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether some process holds the lock on `path` (trying it from here, and letting go).
fn locked(path: &Path) -> bool {
    let file = File::open(path).expect("the lock file exists");
    match file.try_lock() {
        Ok(()) => {
            file.unlock().expect("unlock");
            false
        }
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(e)) => panic!("cannot try the lock: {e}"),
    }
}

#[tokio::test]
async fn a_second_gateway_on_a_served_sqlite_file_is_refused_and_the_first_keeps_its_calls() {
    let log = ExecutionLog::new();
    let first = Gateway::options().execution_log(&log).start();
    let token = first.tenant("acme", "support", TOOLS).await;
    let run = first.open_run(&token, "support", 0).await;
    let slow = spawn_call(&first, &token, slow_write(&run, 3_000)).await;
    log.wait_for(1, PATIENCE).await;

    let second = run_toolgate(&first.dir, &["serve", "--listen", "127.0.0.1:0"]);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success(),
        "the second gateway must not serve: {stderr}"
    );
    assert!(
        stderr.contains("in use by another toolgate process"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("pid {}", first.pid())),
        "names the holder: {stderr}"
    );
    assert!(stderr.contains("toolgate.db.lock"), "{stderr}");

    let result = slow.await.unwrap().expect("the slow call is answered");
    assert_eq!(result.status(), pb::ToolCallStatus::Succeeded, "{result:?}");
    let row = first.get_tool_call(&token, &result.tool_call_id).await;
    assert_eq!(
        row.status(),
        pb::ToolCallStatus::Succeeded,
        "the ledger agrees with the agent: {row:?}"
    );
    assert_eq!(log.entries().len(), 1, "executed once");
}

#[tokio::test]
async fn ledger_verify_reads_the_file_while_the_gateway_serves_it() {
    let gateway = Gateway::start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    gateway.call(&token, &run, "testkit.noop", "{}").await;
    let database = gateway.dir.join("toolgate.db");
    let database = database.to_str().expect("UTF-8 temp path");

    let verify = run_toolgate(&gateway.dir, &["ledger", "verify", "--database", database]);
    let stdout = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(report["ok"], true, "{report}");
    assert!(
        locked(&gateway.dir.join("toolgate.db.lock")),
        "the gateway still owns the file"
    );

    // The gateway goes on as before.
    let after = gateway.call(&token, &run, "testkit.noop", "{}").await;
    assert_eq!(after.status(), pb::ToolCallStatus::Succeeded, "{after:?}");
}

#[tokio::test]
async fn a_gateway_killed_with_sigkill_leaves_no_lock_and_its_restart_settles_its_calls() {
    let log = ExecutionLog::new();
    let gateway = Gateway::options().execution_log(&log).start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let slow = spawn_call(&gateway, &token, slow_write(&run, 600_000)).await;
    log.wait_for(1, PATIENCE).await;
    let call_id = log.entries()[0].1.clone();
    let lock = gateway.dir.join("toolgate.db.lock");
    assert!(locked(&lock), "a serving gateway holds the lock");
    let killed = gateway.pid();

    let dir = gateway.dir.clone();
    let admin_token = gateway.admin_token.clone();
    let temp = gateway.stop();
    assert!(
        slow.await.unwrap().is_err(),
        "the call died with the process"
    );
    assert!(!locked(&lock), "kill -9 released the lock");

    let restarted = Gateway::options()
        .dir(&dir)
        .admin_token(&admin_token)
        .execution_log(&log)
        .start();
    let holder = std::fs::read_to_string(&lock).unwrap();
    assert!(
        holder.contains(&format!("pid {}", restarted.pid())) && restarted.pid() != killed,
        "{holder}"
    );
    let row = restarted.get_tool_call(&token, &call_id).await;
    assert_eq!(
        row.status(),
        pb::ToolCallStatus::OutcomeUnknown,
        "recovery settled the interrupted call: {row:?}"
    );
    assert_eq!(log.entries().len(), 1, "never run again");
    drop(restarted);
    drop(temp);
}

/// The pids of the role's sessions holding an advisory lock: the gateway's instance lock.
async fn advisory_lock_holders(schema: &PgSchema, role: &PgRole) -> Vec<i32> {
    let mut connection = sqlx::PgConnection::connect(schema.url())
        .await
        .expect("connect to the test PostgreSQL");
    let pids = sqlx::query_scalar(
        "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND a.usename = $1",
    )
    .bind(role.name())
    .fetch_all(&mut connection)
    .await
    .expect("read pg_locks");
    let _ = connection.close().await;
    pids
}

async fn terminate(schema: &PgSchema, pid: i32) {
    let mut connection = sqlx::PgConnection::connect(schema.url())
        .await
        .expect("connect to the test PostgreSQL");
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut connection)
        .await
        .expect("pg_terminate_backend");
    assert!(terminated, "backend {pid} was not terminated");
    let _ = connection.close().await;
}

/// Calls `testkit.noop` on `gateway` until `done` accepts the answer; every answer with a
/// call in it goes to `seen`.
async fn noop_until(
    gateway: &Gateway,
    token: &str,
    run: &str,
    what: &str,
    seen: &mut Vec<pb::ToolCallResult>,
    done: impl Fn(&Result<pb::ToolCallResult, tonic::Status>) -> bool,
) -> Result<pb::ToolCallResult, tonic::Status> {
    let mut agent = gateway.agent().await;
    let started = Instant::now();
    loop {
        let answer = agent
            .execute_tool(authed(execute(run, "testkit.noop", "{}"), token))
            .await
            .map(tonic::Response::into_inner);
        if let Ok(result) = &answer {
            seen.push(result.clone());
        }
        if done(&answer) {
            return answer;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "never happened: {what}; last answer {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Replica A (its own role, so the test can keep it from reconnecting) runs a slow write when
/// the backend holding its instance lock is terminated. A refuses new calls with UNAVAILABLE;
/// a replica started meanwhile takes A's running call for interrupted and settles it
/// `outcome_unknown`; the write then returns in A's connector, and A tells its agent
/// `outcome_unknown`, as the ledger says, not `succeeded`. Once A may connect again, it takes
/// its lock back and serves calls again. Every answer the agent got matches the ledger.
#[tokio::test]
async fn a_replica_that_loses_its_lock_starts_no_calls_and_never_contradicts_the_ledger() {
    let role = PgRole::new().await;
    let schema = PgSchema::new().await;
    let log = ExecutionLog::new();
    let a = schema
        .options()
        .database(&role.url())
        .execution_log(&log)
        .start();
    let token = a.tenant("acme", "support", TOOLS).await;
    let run = a.open_run(&token, "support", 0).await;
    let slow = spawn_call(&a, &token, slow_write(&run, 10_000)).await;
    log.wait_for(1, PATIENCE).await;
    let slow_id = log.entries()[0].1.clone();

    role.allow_login(false).await;
    let holders = advisory_lock_holders(&schema, &role).await;
    assert_eq!(holders.len(), 1, "A's instance lock: {holders:?}");
    terminate(&schema, holders[0]).await;

    // What the agent was told, call by call, to hold against the ledger at the end.
    let mut seen = Vec::new();
    let refused = noop_until(&a, &token, &run, "A refuses calls", &mut seen, |answer| {
        answer.is_err()
    })
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("starts no tool call"),
        "{}",
        refused.message()
    );

    // Another replica starting now sees A's lock free: its start-up recovery settles A's call.
    let b = a.replica(schema.options().execution_log(&log));
    let settled = b.get_tool_call(&token, &slow_id).await;
    assert_eq!(
        settled.status(),
        pb::ToolCallStatus::OutcomeUnknown,
        "{settled:?}"
    );

    let answer = slow.await.unwrap().expect("A answers the slow call");
    assert_eq!(answer.tool_call_id, slow_id);
    assert_eq!(
        (answer.status(), answer.error_code.as_str()),
        (pb::ToolCallStatus::OutcomeUnknown, "OUTCOME_UNKNOWN"),
        "A's agent is told what the ledger says: {answer:?}"
    );
    seen.push(answer);

    role.allow_login(true).await;
    let served = noop_until(
        &a,
        &token,
        &run,
        "A serves calls again",
        &mut seen,
        |answer| answer.is_ok(),
    )
    .await
    .unwrap();
    assert_eq!(served.status(), pb::ToolCallStatus::Succeeded, "{served:?}");
    assert_eq!(advisory_lock_holders(&schema, &role).await.len(), 1);

    // The ledger and the agent agree on every call; the refused ones left no row.
    let told: std::collections::BTreeMap<String, pb::ToolCallStatus> = seen
        .iter()
        .map(|result| (result.tool_call_id.clone(), result.status()))
        .collect();
    let ledger: std::collections::BTreeMap<String, pb::ToolCallStatus> = b
        .tool_calls(&token, &run)
        .await
        .iter()
        .map(|call| (call.tool_call_id.clone(), call.status()))
        .collect();
    assert_eq!(
        told, ledger,
        "what the agent was told is what the ledger says"
    );
    assert_eq!(
        log.entries().len(),
        ledger.len(),
        "each recorded call executed once, the refused ones never"
    );
    drop(b);
    drop(a);
}
