//! The README quickstart, run as written: the `sh` blocks marked `<!-- quickstart -->` are
//! joined into one bash script and executed in a fresh directory against the testkit build of
//! the binary, as a newcomer would paste them. The only changes are the ones a reader makes:
//! the binary instead of `cargo build` + `alias`, and the tokens and ids the commands printed
//! where the README says to use them. And the CLI's role rules: each command takes a token of
//! its own role and never falls back to another's.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use toolgate_e2e::{Gateway, authed, execute, gateway_binary};
use toolgate_proto::v1 as pb;

const MARKER: &str = "<!-- quickstart -->";

/// The marked blocks of the README, in order.
fn quickstart_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim() != MARKER {
            continue;
        }
        assert_eq!(
            lines.next().map(str::trim),
            Some("```sh"),
            "a {MARKER} line must be followed by a ```sh block"
        );
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        blocks.push(block.join("\n"));
    }
    blocks
}

/// Replaces the one occurrence of `from` (the README must contain it exactly once: if it
/// changed, this test must change with it).
fn substitute_once(script: &str, from: &str, to: &str) -> String {
    assert_eq!(
        script.matches(from).count(),
        1,
        "the quickstart should contain `{from}` exactly once"
    );
    script.replacen(from, to, 1)
}

/// Replaces every occurrence of a placeholder, which must occur at least once.
fn substitute_all(script: &str, from: &str, to: &str) -> String {
    assert!(script.contains(from), "the quickstart should use `{from}`");
    script.replace(from, to)
}

/// What runs before the README's lines: strict mode, and `qs_last FIELD [PREFIX]`, the value
/// of the last `"FIELD": "PREFIX..."` any toolgate command printed (what the reader copies).
const PRELUDE: &str = r#"set -euo pipefail
qs_last() {
  grep -o "\"$1\": \"${2:-}[^\"]*\"" "$QS_LOG" | tail -n 1 | sed 's/^.*: "\(.*\)"$/\1/'
}
"#;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn the_readme_quickstart_runs_as_written() {
    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let blocks = quickstart_blocks(&readme);
    assert!(
        blocks.len() >= 3,
        "the README marks its quickstart: {blocks:?}"
    );
    let mut script = blocks.join("\n");
    // The reader builds and aliases the binary; the test has built it already.
    script = substitute_once(
        &script,
        "cargo build --release -p toolgate --features testkit\n",
        "",
    );
    script = substitute_once(
        &script,
        "alias toolgate=target/release/toolgate\n",
        "toolgate() { \"$QS_BIN\" \"$@\" | tee -a \"$QS_LOG\"; return \"${PIPESTATUS[0]}\"; }\n",
    );
    // What the reader copies from the output above.
    script = substitute_all(&script, "tg_agent_...", "$(qs_last token tg_agent_)");
    script = substitute_all(&script, "tg_approver_...", "$(qs_last token tg_approver_)");
    script = substitute_all(&script, "RUN_ID", "$(qs_last run_id)");
    script = substitute_all(&script, "INVOCATION_ID", "$(qs_last invocation_id)");
    let script = format!("{PRELUDE}{script}\n");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("quickstart.sh"), &script).unwrap();
    let log = dir.path().join("output.log");
    let port = free_port();
    let mut command = Command::new("bash");
    command
        .arg("quickstart.sh")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        // Files, not pipes: the gateway left running in the background holds them open.
        .stdout(std::fs::File::create(dir.path().join("stdout.txt")).unwrap())
        .stderr(std::fs::File::create(dir.path().join("stderr.txt")).unwrap())
        // Its own process group, so the gateway it starts in the background stops with it.
        .process_group(0);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("TOOLGATE_")) {
            command.env_remove(&key);
        }
    }
    command
        .env("QS_BIN", gateway_binary())
        .env("QS_LOG", &log)
        // Where the reader's gateway listens is the only setting the test changes (port 50051
        // may be taken on a machine running tests in parallel).
        .env("TOOLGATE_LISTEN", format!("127.0.0.1:{port}"))
        .env("TOOLGATE_ADDR", format!("http://127.0.0.1:{port}"))
        .env("TOOLGATE_LOG", "warn")
        // The reader's own bot token, for the credentials block (it is only stored).
        .env("SLACK_BOT_TOKEN", "xoxb-quickstart-not-a-real-token");
    let mut child = command.spawn().expect("run bash");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(180) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Stop the gateway the script left running (and the script, if it hangs).
    let group = format!("-{}", child.id());
    let _ = Command::new("kill")
        .args(["-s", "TERM", "--", &group])
        .status();
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = std::fs::read_to_string(dir.path().join("stdout.txt")).unwrap_or_default();
    let stderr = std::fs::read_to_string(dir.path().join("stderr.txt")).unwrap_or_default();
    let printed = std::fs::read_to_string(&log).unwrap_or_default();
    let status = status.unwrap_or_else(|| {
        panic!("the quickstart hung\nscript:\n{script}\noutput:\n{printed}\nstderr:\n{stderr}")
    });
    assert!(
        status.success(),
        "the quickstart failed ({status})\nscript:\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // What the README says each step shows.
    for expected in [
        r#""message": "hello""#,
        r#""status": "TOOL_CALL_STATUS_SUCCEEDED""#,
        r#""status": "TOOL_CALL_STATUS_WAITING_APPROVAL""#,
        r#""outcome": "RESUME_OUTCOME_EXECUTED""#,
        r#""name": "slack_default""#,
    ] {
        assert!(
            printed.contains(expected),
            "the quickstart printed no {expected}:\n{printed}\nstderr:\n{stderr}"
        );
    }
}

/// Runs the CLI in `gateway`'s directory (where its admin token file is) with `env` and
/// nothing else of ours.
fn toolgate(gateway: &Gateway, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(gateway_binary());
    command.args(args).current_dir(&gateway.dir);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("TOOLGATE_")) {
            command.env_remove(&key);
        }
    }
    command
        .env("TOOLGATE_ADDR", &gateway.url)
        .env("TOOLGATE_LOG", "warn");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run toolgate")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_command_uses_a_token_of_its_own_role() {
    let gateway = Gateway::start();
    let agent = gateway
        .tenant("acme", "support", &["testkit.echo", "testkit.transfer"])
        .await;
    let echo = [
        "call",
        "--agent",
        "support",
        "testkit.echo",
        r#"{"message": "hi"}"#,
    ];

    // Admin commands read the admin token file even with an agent token exported.
    let listed = toolgate(
        &gateway,
        &["admin", "tenants", "list"],
        &[("TOOLGATE_AGENT_TOKEN", &agent)],
    );
    assert!(listed.status.success(), "{}", stderr(&listed));

    // `call` never falls back to the admin token file next to it.
    let refused = toolgate(&gateway, &echo, &[]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("set TOOLGATE_AGENT_TOKEN"),
        "{}",
        stderr(&refused)
    );
    let legacy = toolgate(&gateway, &echo, &[("TOOLGATE_TOKEN", &agent)]);
    assert_eq!(legacy.status.code(), Some(1));
    assert!(
        stderr(&legacy).contains("TOOLGATE_TOKEN is not read"),
        "{}",
        stderr(&legacy)
    );
    let wrong = toolgate(
        &gateway,
        &echo,
        &[("TOOLGATE_AGENT_TOKEN", &gateway.admin_token)],
    );
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        stderr(&wrong).contains("holds an admin token, but this command needs an agent token"),
        "{}",
        stderr(&wrong)
    );
    // With its own token, it works.
    let called = toolgate(&gateway, &echo, &[("TOOLGATE_AGENT_TOKEN", &agent)]);
    assert_eq!(called.status.code(), Some(0), "{}", stderr(&called));

    // Approvals: their own variable, and a decided `continue` exits 0.
    gateway
        .put_policy(
            "acme",
            r#"@id("all") permit(principal, action, resource);
               @id("big") @decision("require_expert_approval")
               permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
                 when { context.args.amount > 1000 };"#,
        )
        .await;
    let run = gateway.open_run(&agent, "support", 0).await;
    let waiting = gateway
        .agent()
        .await
        .execute_tool(authed(
            execute(
                &run,
                "testkit.transfer",
                r#"{"amount": 5000, "region": "us", "account": "a-1"}"#,
            ),
            &agent,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(waiting.status, pb::ToolCallStatus::WaitingApproval as i32);
    let cont = [
        "approvals",
        "continue",
        run.as_str(),
        waiting.pending_invocation_id.as_str(),
    ];
    let refused = toolgate(&gateway, &cont, &[("TOOLGATE_AGENT_TOKEN", &agent)]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("set TOOLGATE_APPROVER_TOKEN"),
        "{}",
        stderr(&refused)
    );
    let approver = gateway.approver_token("acme").await;
    let continued = toolgate(&gateway, &cont, &[("TOOLGATE_APPROVER_TOKEN", &approver)]);
    assert_eq!(continued.status.code(), Some(0), "{}", stderr(&continued));
    assert!(
        String::from_utf8_lossy(&continued.stdout)
            .contains(r#""outcome": "RESUME_OUTCOME_CONTINUED""#)
    );
    let again = toolgate(&gateway, &cont, &[("TOOLGATE_APPROVER_TOKEN", &approver)]);
    assert_eq!(
        again.status.code(),
        Some(5),
        "a decision that did not apply"
    );

    // A call waiting for approval exits 4, one refused 3.
    let transfer = [
        "call",
        "--agent",
        "support",
        "testkit.transfer",
        r#"{"amount": 5000, "region": "us", "account": "a-1"}"#,
    ];
    let waits = toolgate(&gateway, &transfer, &[("TOOLGATE_AGENT_TOKEN", &agent)]);
    assert_eq!(waits.status.code(), Some(4), "{}", stderr(&waits));
    let unknown = ["call", "--agent", "support", "testkit.noop"];
    let refused = toolgate(&gateway, &unknown, &[("TOOLGATE_AGENT_TOKEN", &agent)]);
    assert_eq!(refused.status.code(), Some(3), "{}", stderr(&refused));
}
