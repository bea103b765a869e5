//! What an approval promises, through the real gateway and the ApprovalService: the approved
//! execution runs under the timeout the agent asked for, a write whose outcome is unknown is
//! never offered for a second run, the kill switch stops approvals (on every replica) but not
//! rejections, and a connector's own status and attempt count reach the ledger. Executions are
//! counted outside the gateway with the testkit's execution log.

use std::time::{Duration, Instant};

use toolgate_e2e::{ExecutionLog, Gateway, PgSchema, Tenant, execute, slack_config};
use toolgate_proto::v1 as pb;
use toolgate_slack::testkit::{BOT_TOKEN, FakeSlack, HISTORY_CHANNEL, HangUp};

const TOOLS: &[&str] = &[
    "testkit.sleep",
    "testkit.sleep_write",
    "testkit.transfer",
    "testkit.noop",
];

const POLICY: &str = r#"
    @id("base") permit(principal, action, resource);
    @id("sleep-needs-approval") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.sleep", resource);
    @id("write-needs-approval") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.sleep_write", resource);
    @id("big") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
"#;

const TRANSFER: &str = r#"{"amount": 5000, "region": "us-east-1", "account": "acct-1"}"#;

/// Liveness bound for waits on a gateway (not a speed assertion).
const PATIENCE: Duration = Duration::from_secs(60);

/// A gateway (or the first of several) with tenant `acme`, the approval policy, an agent and an
/// approver token.
struct Setup {
    gateway: Gateway,
    acme: Tenant,
}

impl Setup {
    async fn start(gateway: Gateway) -> Setup {
        let acme = Tenant::setup("acme")
            .tools(TOOLS)
            .policy(POLICY)
            .approver()
            .create(&gateway)
            .await;
        Setup { gateway, acme }
    }

    /// Executes `tool` with an optional `timeout_ms` on `gateway`.
    async fn execute(
        &self,
        gateway: &Gateway,
        run: &str,
        tool: &str,
        arguments: &str,
        timeout_ms: u64,
    ) -> pb::ToolCallResult {
        let request = pb::ExecuteToolRequest {
            timeout_ms,
            ..execute(run, tool, arguments)
        };
        gateway.execute(&self.acme.token, request).await
    }

    /// Suspends `tool`; the answer, which names the pending invocation.
    async fn suspend(
        &self,
        run: &str,
        tool: &str,
        arguments: &str,
        timeout_ms: u64,
    ) -> pb::ToolCallResult {
        let result = self
            .execute(&self.gateway, run, tool, arguments, timeout_ms)
            .await;
        assert_eq!(
            result.status(),
            pb::ToolCallStatus::WaitingApproval,
            "{result:?}"
        );
        assert!(!result.pending_invocation_id.is_empty(), "{result:?}");
        result
    }

    /// Decides the invocation `held` waits on, on `gateway`, as the tenant's approver.
    async fn decide_on(
        &self,
        gateway: &Gateway,
        run: &str,
        held: &pb::ToolCallResult,
        decision: pb::ResumeDecision,
    ) -> pb::ResumeResponse {
        let invocation = &held.pending_invocation_id;
        gateway
            .resume(self.acme.approver(), run, invocation, decision, "e2e")
            .await
    }

    /// Decides the invocation `held` waits on, on the first gateway.
    async fn decide(
        &self,
        run: &str,
        held: &pb::ToolCallResult,
        decision: pb::ResumeDecision,
    ) -> pb::ResumeResponse {
        self.decide_on(&self.gateway, run, held, decision).await
    }

    async fn get_pending(&self, invocation: &str) -> pb::PendingInvocation {
        self.gateway
            .get_pending(self.acme.approver(), invocation)
            .await
    }

    async fn list_pending(&self, run: &str) -> Vec<pb::PendingInvocation> {
        self.gateway.list_pending(self.acme.approver(), run).await
    }

    async fn open_run(&self) -> String {
        self.gateway.open_run(&self.acme.token, "support", 0).await
    }
}

#[tokio::test]
async fn an_approved_call_runs_under_the_timeout_the_agent_asked_for() {
    let log = ExecutionLog::new();
    let s = Setup::start(Gateway::options().execution_log(&log).start()).await;
    let run = s.open_run().await;
    // 400 ms fits testkit.sleep's default of 500 ms, but not the 100 ms asked for.
    let held = s
        .suspend(&run, "testkit.sleep", r#"{"ms": 400}"#, 100)
        .await;
    let approved = s.decide(&run, &held, pb::ResumeDecision::Approve).await;
    assert_eq!(approved.outcome(), pb::ResumeOutcome::Executed);
    let result = approved.result.expect("an executed answer");
    // Cut at its own timeout instead of running to the end under the tool's default.
    assert_eq!(result.status(), pb::ToolCallStatus::TimedOut, "{result:?}");
    assert_eq!(result.error_code, "TIMEOUT");
    assert!(result.error_message.contains("100 ms"), "{result:?}");
    assert_eq!(log.counts().get(&held.tool_call_id), Some(&1));
    // Approvers see the timeout the invocation runs under and how the execution ended.
    let decided = s.get_pending(&held.pending_invocation_id).await;
    assert_eq!(
        (decided.timeout_ms, decided.tool_call_status.as_str()),
        (100, "timed_out"),
        "{decided:?}"
    );

    // An idempotent tool that timed out may run again: it is offered once more, with the
    // same timeout.
    let open = s.list_pending(&run).await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(
        (open[0].origin.as_str(), open[0].timeout_ms),
        ("EXECUTION_FAILED", 100)
    );
    assert_eq!(open[0].tool_call_status, "timed_out");
}

#[tokio::test]
async fn an_unknown_outcome_after_approval_is_never_run_again() {
    let log = ExecutionLog::new();
    let s = Setup::start(Gateway::options().execution_log(&log).start()).await;
    let run = s.open_run().await;
    // A write that outlives its timeout: the vendor may have acted.
    let held = s
        .suspend(&run, "testkit.sleep_write", r#"{"ms": 5000}"#, 100)
        .await;
    let approved = s.decide(&run, &held, pb::ResumeDecision::Approve).await;
    assert_eq!(approved.outcome(), pb::ResumeOutcome::Executed);
    let result = approved.result.expect("an executed answer");
    assert_eq!(
        result.status(),
        pb::ToolCallStatus::OutcomeUnknown,
        "{result:?}"
    );

    // Nothing is offered for a re-run, and approvers see how it ended.
    let open = s.list_pending(&run).await;
    assert!(open.is_empty(), "no plain re-run: {open:?}");
    let decided = s.get_pending(&held.pending_invocation_id).await;
    assert_eq!(
        (decided.state.as_str(), decided.tool_call_status.as_str()),
        ("approved", "outcome_unknown")
    );

    // Whatever an approver tries, the write runs once.
    let again = s.decide(&run, &held, pb::ResumeDecision::Approve).await;
    assert_eq!(again.outcome(), pb::ResumeOutcome::ClaimLost);
    for invocation in s.list_pending("").await {
        s.gateway
            .resume(
                s.acme.approver(),
                &invocation.run_id,
                &invocation.invocation_id,
                pb::ResumeDecision::Approve,
                "e2e",
            )
            .await;
    }
    assert_eq!(
        log.counts().get(&held.tool_call_id),
        Some(&1),
        "executed once"
    );
    let recorded = s
        .gateway
        .get_tool_call(&s.acme.token, &held.tool_call_id)
        .await;
    assert_eq!(recorded.status(), pb::ToolCallStatus::OutcomeUnknown);
}

#[tokio::test]
async fn the_kill_switch_refuses_approvals_until_it_is_on_again() {
    let log = ExecutionLog::new();
    let s = Setup::start(Gateway::options().execution_log(&log).start()).await;
    let run = s.open_run().await;
    let first = s.suspend(&run, "testkit.transfer", TRANSFER, 0).await;
    let second = s.suspend(&run, "testkit.transfer", TRANSFER, 0).await;
    let third = s.suspend(&run, "testkit.transfer", TRANSFER, 0).await;
    let before = s.get_pending(&first.pending_invocation_id).await;
    s.gateway.set_tool_calling("acme", false).await;

    let refused = s.decide(&run, &first, pb::ResumeDecision::Approve).await;
    assert_eq!(refused.outcome(), pb::ResumeOutcome::FeatureDisabled);
    let result = refused.result.expect("the refusal's details");
    assert_eq!(result.error_code, "FEATURE_DISABLED", "{result:?}");
    assert_eq!(result.status(), pb::ToolCallStatus::WaitingApproval);
    assert_eq!(result.pending_invocation_id, first.pending_invocation_id);
    let after = s.get_pending(&first.pending_invocation_id).await;
    assert_eq!(
        (after.state.as_str(), after.version),
        ("pending", before.version),
        "still pending, unclaimed"
    );
    assert_eq!(after, before);
    assert!(log.entries().is_empty(), "nothing executed");

    // Decisions that execute nothing still work with the switch off.
    let rejected = s.decide(&run, &second, pb::ResumeDecision::Reject).await;
    assert_eq!(rejected.outcome(), pb::ResumeOutcome::Rejected);
    let continued = s.decide(&run, &third, pb::ResumeDecision::Continue).await;
    assert_eq!(continued.outcome(), pb::ResumeOutcome::Continued);

    s.gateway.set_tool_calling("acme", true).await;
    let approved = s.decide(&run, &first, pb::ResumeDecision::Approve).await;
    assert_eq!(approved.outcome(), pb::ResumeOutcome::Executed);
    assert_eq!(
        approved.result.unwrap().status(),
        pb::ToolCallStatus::Succeeded
    );
    let entries = log.entries();
    assert_eq!(
        entries,
        vec![("testkit.transfer".to_owned(), first.tool_call_id.clone())],
        "executed once, only the approved call"
    );
}

#[tokio::test]
async fn pg_a_kill_switch_thrown_on_one_replica_stops_approvals_on_the_other() {
    let schema = PgSchema::new().await;
    let log = ExecutionLog::new();
    let s = Setup::start(schema.options().execution_log(&log).start()).await;
    let other = s.gateway.replica(schema.options().execution_log(&log));
    let run = s.open_run().await;
    let held = s.suspend(&run, "testkit.transfer", TRANSFER, 0).await;
    // The other replica caches the switch as on.
    let warm = s.execute(&other, &run, "testkit.noop", "{}", 0).await;
    assert_eq!(warm.status(), pb::ToolCallStatus::Succeeded, "{warm:?}");

    s.gateway.set_tool_calling("acme", false).await;
    // Once the other replica has heard of it (PostgreSQL notifies it), its approvals stop too.
    let started = Instant::now();
    loop {
        let probe = s.execute(&other, &run, "testkit.noop", "{}", 0).await;
        if probe.error_code == "FEATURE_DISABLED" {
            break;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the other replica never saw the kill switch: {probe:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = s
        .decide_on(&other, &run, &held, pb::ResumeDecision::Approve)
        .await;
    assert_eq!(refused.outcome(), pb::ResumeOutcome::FeatureDisabled);
    assert_eq!(
        s.get_pending(&held.pending_invocation_id).await.state,
        "pending"
    );
    assert!(
        !log.counts().contains_key(&held.tool_call_id),
        "the transfer did not run"
    );
}

/// `toolgate secrets put TENANT slack_default`, the value on standard input.
fn put_slack_secret(gateway: &Gateway, tenant: &str, value: &str) {
    gateway.secrets_put(tenant, "slack_default", &[], &format!("{value}\n"));
}

#[tokio::test]
async fn a_connectors_outcome_unknown_and_attempts_are_recorded() {
    let fake = FakeSlack::start().await;
    let hang_up = HangUp::start().await;
    let gateway = Gateway::options().config(&slack_config(&fake)).start();
    // `acme` talks to the fake Slack, `globex` (its own base URL) to one that hangs up.
    let mut tokens = Vec::new();
    for tenant in ["acme", "globex"] {
        let token = Tenant::setup(tenant)
            .tools(&["slack.post_message", "slack.channel_history"])
            .policy(r#"@id("all") permit(principal, action, resource);"#)
            .create(&gateway)
            .await
            .token;
        let run = gateway.open_run(&token, "support", 0).await;
        tokens.push((token, run));
    }
    put_slack_secret(&gateway, "acme", BOT_TOKEN);
    let hanging_up =
        serde_json::json!({"bot_token": BOT_TOKEN, "base_url": hang_up.api_base_url()});
    put_slack_secret(&gateway, "globex", &hanging_up.to_string());
    let call = |tenant: usize, tool: &'static str, arguments: String| {
        let gateway = &gateway;
        let (token, run) = &tokens[tenant];
        async move { gateway.call(token, run, tool, &arguments).await }
    };

    // History is idempotent: two 429s are retried, then Slack refuses. Three attempts.
    fake.rate_limit_next("conversations.history", 0).await;
    fake.rate_limit_next("conversations.history", 0).await;
    fake.fail_next("conversations.history", "channel_not_found")
        .await;
    let history = call(
        0,
        "slack.channel_history",
        format!(r#"{{"channel": "{HISTORY_CHANNEL}", "limit": 5}}"#),
    )
    .await;
    assert_eq!(history.status(), pb::ToolCallStatus::Failed, "{history:?}");
    assert_eq!(history.attempts, 3, "{history:?}");
    let recorded = gateway
        .get_tool_call(&tokens[0].0, &history.tool_call_id)
        .await;
    assert_eq!(
        (recorded.status(), recorded.attempts),
        (pb::ToolCallStatus::Failed, 3)
    );
    assert_eq!(fake.requests("conversations.history").await.len(), 3);

    // A post whose connection breaks after it was sent may have been posted.
    let posted = call(
        1,
        "slack.post_message",
        r#"{"channel": "C0GENERAL1", "text": "deploy done"}"#.to_owned(),
    )
    .await;
    assert_eq!(
        posted.status(),
        pb::ToolCallStatus::OutcomeUnknown,
        "{posted:?}"
    );
    assert_eq!(
        (posted.error_code.as_str(), posted.attempts),
        ("OUTCOME_UNKNOWN", 1)
    );
    let recorded = gateway
        .get_tool_call(&tokens[1].0, &posted.tool_call_id)
        .await;
    assert_eq!(
        (recorded.status(), recorded.attempts),
        (pb::ToolCallStatus::OutcomeUnknown, 1)
    );
    assert_eq!(hang_up.received(), 1, "the post reached the vendor once");
}
