//! Test connectors (`testkit.*`): a no-op, an echo, a sleeper that never answers in time, a
//! panicker, a failer and a payment-shaped tool for policy conditions. Compiled only for tests
//! and with the `testkit` feature; never part of a production build.
//!
//! # Counting executions from outside the gateway
//!
//! When the environment variable `TESTKIT_EXECUTION_LOG` names a file, every invocation of any
//! testkit tool appends one line `<tool> <tool_call_id>\n` (for example
//! `testkit.transfer tc_0190...\n`) to it as soon as the connector is entered, before it sleeps,
//! panics or answers: a call the gateway hands to the connector counts as executed even if the
//! process dies during it. The line goes out in a single `write` on a file opened with
//! `O_APPEND`, which is atomic for lines this small, so several gateway processes can share
//! one log and tests count executions (e.g. "exactly one per approved invocation") by counting
//! lines. A log that cannot be written fails the call with `INTERNAL` rather than
//! under-counting. The variable is read at each invocation; it is not `TOOLGATE_`-prefixed
//! because the gateway refuses unknown `TOOLGATE_*` variables.

use std::io::Write as _;
use std::time::Duration;

use serde_json::{Value, json};
use toolgate_core::{
    Connector, ErrorCode, InvocationContext, RiskLevel, SecretName, Tag, ToolError, ToolName,
    ToolOutput, ToolSpec,
};

/// The `testkit` family.
#[derive(Debug, Default)]
pub struct TestkitConnector;

fn name(action: &str) -> ToolName {
    ToolName::new(format!("testkit.{action}")).expect("static tool name")
}

#[async_trait::async_trait]
impl Connector for TestkitConnector {
    fn family(&self) -> &str {
        "testkit"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        [
            answering_tools(),
            sleeping_tools(),
            misbehaving_tools(),
            guarded_tools(),
        ]
        .concat()
    }

    async fn invoke(
        &self,
        ctx: InvocationContext,
        tool: &ToolName,
        arguments: Value,
    ) -> Result<ToolOutput, ToolError> {
        log_execution(&ctx, tool)?;
        match tool.action() {
            "noop" => Ok(ToolOutput::new(json!({"ok": true}))),
            "echo" => Ok(ToolOutput::new(arguments)),
            "sleep" | "sleep_write" => {
                let ms = arguments.get("ms").and_then(Value::as_u64).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(ToolOutput::new(json!({"slept_ms": ms})))
            }
            "panic" => panic!("testkit.panic was called"),
            "fail" => {
                let code = arguments
                    .get("code")
                    .and_then(Value::as_str)
                    .and_then(|c| c.parse::<ErrorCode>().ok())
                    .unwrap_or(ErrorCode::VendorError);
                let message = arguments
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the vendor refused")
                    .to_owned();
                let error = ToolError::new(code, message);
                match arguments
                    .get("attempts")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
                {
                    Some(attempts) => Err(error.with_attempts(attempts)),
                    None => Err(error),
                }
            }
            "whoami" => {
                let key_len = ctx
                    .secrets
                    .get("testkit_key")
                    .map_or(0, |k| k.expose().len());
                Ok(ToolOutput::new(
                    json!({"tenant": ctx.tenant.as_str(), "key_len": key_len}),
                ))
            }
            "transfer" => Ok(ToolOutput::new(
                json!({"transferred": arguments["amount"], "status": "done"}),
            )),
            other => Err(ToolError::new(
                ErrorCode::UnknownTool,
                format!("testkit has no action `{other}`"),
            )),
        }
    }
}

/// The tools that answer at once: `noop` and `echo`.
fn answering_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            name("noop"),
            "Does nothing and answers {\"ok\": true}.",
            json!({"type": "object", "additionalProperties": false}),
        )
        .tag(Tag::READ_ONLY)
        .idempotent(true),
        ToolSpec::new(
            name("echo"),
            "Answers with the arguments it was given.",
            json!({
                "type": "object",
                "properties": {
                    // No length of its own: the gateway's argument limit is what
                    // the end-to-end tests of large arguments run into.
                    "message": {"type": "string"},
                    "count": {"type": "integer", "minimum": 0},
                    "api_token": {"type": "string"}
                },
                "required": ["message"],
                "additionalProperties": false
            }),
        )
        .tag(Tag::READ_ONLY)
        .idempotent(true),
    ]
}

/// The sleepers, to run into the deadline: `sleep` (idempotent) and `sleep_write` (a write).
fn sleeping_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            name("sleep"),
            "Sleeps for the given number of milliseconds, then answers.",
            json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0}},
                "required": ["ms"]
            }),
        )
        .tag(Tag::READ_ONLY)
        .idempotent(true)
        .timeout(Duration::from_millis(500)),
        ToolSpec::new(
            name("sleep_write"),
            "Sleeps like testkit.sleep, but is a write that is not idempotent.",
            json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0}},
                "required": ["ms"]
            }),
        )
        .tag(Tag::WRITE)
        .timeout(Duration::from_millis(500)),
    ]
}

/// The tools that go wrong: `panic`, and `fail` with the error it is asked for.
fn misbehaving_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(name("panic"), "Panics.", json!({"type": "object"}))
            .tag(Tag::READ_ONLY)
            .idempotent(true),
        ToolSpec::new(
            name("fail"),
            "Fails with the given error code and message, reporting `attempts` vendor attempts when given.",
            json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "attempts": {"type": "integer", "minimum": 0, "maximum": 100}
                },
                "required": ["code"]
            }),
        )
        .tag(Tag::READ_ONLY)
        .idempotent(true),
    ]
}

/// The tools for credentials and policy: `whoami` needs a secret, `transfer` is a financial write.
fn guarded_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            name("whoami"),
            "Reports the tenant it runs for and the length of the secret it was given.",
            json!({"type": "object"}),
        )
        .tag(Tag::READ_ONLY)
        .idempotent(true)
        .secret(SecretName::new("testkit_key").expect("static secret name")),
        ToolSpec::new(
            name("transfer"),
            "Moves an amount of money to an account in a region.",
            json!({
                "type": "object",
                "properties": {
                    "amount": {"type": "integer", "minimum": 0},
                    "region": {"type": "string"},
                    "account": {"type": "string"}
                },
                "required": ["amount", "region", "account"]
            }),
        )
        .tag(Tag::WRITE)
        .tag(Tag::FINANCIAL)
        .risk(RiskLevel::Medium),
    ]
}

/// The environment variable naming the execution log (see the module documentation).
pub const EXECUTION_LOG_ENV: &str = "TESTKIT_EXECUTION_LOG";

/// Appends `<tool> <tool_call_id>\n` to the execution log, when one is configured, in one
/// `O_APPEND` write.
fn log_execution(ctx: &InvocationContext, tool: &ToolName) -> Result<(), ToolError> {
    match std::env::var_os(EXECUTION_LOG_ENV) {
        Some(path) => append_line(
            std::path::Path::new(&path),
            &format!("{tool} {}\n", ctx.tool_call_id),
        ),
        None => Ok(()),
    }
}

/// Appends `line` to `path` (created if missing) in a single `O_APPEND` write.
fn append_line(path: &std::path::Path, line: &str) -> Result<(), ToolError> {
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .and_then(|mut file| file.write(line.as_bytes()));
    match written {
        Ok(n) if n == line.len() => Ok(()),
        Ok(n) => Err(ToolError::new(
            ErrorCode::Internal,
            format!(
                "{EXECUTION_LOG_ENV}: short write ({n} of {} bytes)",
                line.len()
            ),
        )),
        Err(err) => Err(ToolError::new(
            ErrorCode::Internal,
            format!("{EXECUTION_LOG_ENV}: cannot append: {err}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::append_line;

    #[test]
    fn concurrent_appends_leave_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("executions.log");
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        append_line(&path, &format!("testkit.noop tc_{w}_{i}\n")).unwrap();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8 * 200);
        assert!(
            lines.iter().all(|l| l.starts_with("testkit.noop tc_")),
            "{text}"
        );
        lines.sort_unstable();
        lines.dedup();
        assert_eq!(lines.len(), 8 * 200, "every line intact and distinct");
    }
}
