//! The command-line interface against a real gateway: the README quickstart as a test, and
//! configuration errors reported before any port is bound.

use std::process::{Command, Output};

use toolgate_e2e::{Gateway, gateway_binary};

fn toolgate(gateway: &Gateway, args: &[&str], token: Option<&str>) -> Output {
    let mut command = Command::new(gateway_binary());
    command
        .args(args)
        .current_dir(&gateway.dir)
        .env("TOOLGATE_ADDR", &gateway.url)
        .env("TOOLGATE_LOG", "warn")
        .env_remove("TOOLGATE_BIN")
        .env_remove("TOOLGATE_AGENT_TOKEN");
    if let Some(token) = token {
        command.env("TOOLGATE_AGENT_TOKEN", token);
    }
    command.output().expect("run toolgate")
}

fn json(output: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[test]
fn the_quickstart_works_from_the_command_line() {
    let gateway = Gateway::start();
    let admin_steps: &[&[&str]] = &[
        &["admin", "tenants", "create", "acme", "--name", "Acme"],
        &["admin", "agents", "create", "acme", "support"],
        &["admin", "permissions", "set", "acme", "testkit.echo"],
        &[
            "admin",
            "flags",
            "set",
            "acme",
            "tool_calling_enabled",
            "true",
        ],
    ];
    for step in admin_steps {
        let output = toolgate(&gateway, step, None);
        assert!(
            output.status.success(),
            "{step:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let created = toolgate(
        &gateway,
        &[
            "admin", "tokens", "create", "--role", "agent", "--tenant", "acme",
        ],
        None,
    );
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let token = json(&created)["token"]
        .as_str()
        .expect("token printed once")
        .to_owned();
    assert!(token.starts_with("tg_agent_"));

    let call = toolgate(
        &gateway,
        &[
            "call",
            "--agent",
            "support",
            "testkit.echo",
            r#"{"message": "hello"}"#,
        ],
        Some(&token),
    );
    assert!(
        call.status.success(),
        "{}",
        String::from_utf8_lossy(&call.stderr)
    );
    let outcome = json(&call);
    assert_eq!(outcome["status"], "TOOL_CALL_STATUS_SUCCEEDED");
    assert_eq!(outcome["result"]["message"], "hello");

    let refused = toolgate(
        &gateway,
        &["call", "--agent", "support", "testkit.noop"],
        Some(&token),
    );
    assert_eq!(refused.status.code(), Some(3), "a refused call exits 3");
    assert_eq!(json(&refused)["error_code"], "NOT_IN_MANIFEST");

    let tokens = toolgate(
        &gateway,
        &["admin", "tokens", "list", "--tenant", "acme"],
        None,
    );
    let listed = String::from_utf8_lossy(&tokens.stdout);
    assert!(
        !listed.contains(&token),
        "listing never shows token secrets"
    );

    let verify = toolgate(&gateway, &["admin", "verify-ledger"], None);
    assert!(verify.status.success());
    assert_eq!(json(&verify)["ok"], true);
}

#[test]
fn tools_lists_the_testkit_tools() {
    let output = Command::new(gateway_binary())
        .args(["tools"])
        .env_remove("TOOLGATE_BIN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(
        stdout.contains("testkit.echo") && stdout.contains("testkit.transfer"),
        "{stdout}"
    );
}

#[test]
fn bad_configuration_is_refused_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case<'_>] = &[
        (
            "[server]\nlisten = \"127.0.0.1:0\"\nport = 5\n",
            &[],
            "port",
        ),
        (
            "[engine]\nmax_timeout_ms = 0\n",
            &[],
            "engine.max_timeout_ms",
        ),
        ("", &[("TOOLGATE_LISTNE", "127.0.0.1:0")], "TOOLGATE_LISTNE"),
        ("[connectors]\ndisabled = [\"nosuch\"]\n", &[], "nosuch"),
    ];
    for (toml_text, env, fragment) in cases {
        std::fs::write(dir.path().join("toolgate.toml"), toml_text).unwrap();
        let mut command = Command::new(gateway_binary());
        command
            .args(["serve"])
            .current_dir(dir.path())
            .env_remove("TOOLGATE_BIN");
        for (key, value) in *env {
            command.env(key, value);
        }
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{toml_text:?} must be refused");
        assert!(stderr.contains(fragment), "{toml_text:?}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("listening"),
            "no port bound"
        );
        assert!(
            !dir.path().join("toolgate.db").exists(),
            "{toml_text:?}: nothing created"
        );
    }
}
