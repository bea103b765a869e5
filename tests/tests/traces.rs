//! Traces end to end: the real binary, started with the standard `OTEL_EXPORTER_OTLP_ENDPOINT`,
//! exports to an OTLP receiver on loopback (the collector's `TraceService` from the official
//! OpenTelemetry proto). A call the agent starts with a W3C `traceparent` joins that trace:
//! the gateway's server span, the GenAI `execute_tool` span and its children (policy, ledger,
//! credentials, connector, each vendor attempt), and the vendor request through the fake Slack
//! carries the attempt's `traceparent`. No argument or result value appears in any span.
//! The standard `OTEL_TRACES_SAMPLER` decides which calls are exported.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use toolgate_e2e::{Gateway, Tenant, authed, execute, slack_config};
use toolgate_proto::v1 as pb;
use toolgate_slack::testkit::{BOT_TOKEN, FakeSlack};

/// The agent's trace: the gateway's spans must carry this trace id.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
/// The agent's span the call was made in.
const AGENT_SPAN: &str = "00f067aa0ba902b7";

/// Argument text that must never reach a span.
const SECRET_TEXT: &str = "quarterly-numbers-7f3a9c";

const POLICY: &str = r#"
@id("base") permit(principal, action, resource);
@id("posts-outside-allowlist") @decision("require_expert_approval") @risk("medium")
permit(principal, action == Toolgate::Action::"slack.post_message", resource)
  when { context.args.channel != "C0ALLOWED1" };
"#;

/// Every span exported to it, with the `service.name` of its resource.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
        format!("http://{address}")
    }

    /// Waits until a span named `name` arrived; all spans so far.
    async fn wait_for(&self, name: &str) -> Vec<(String, Span)> {
        let started = Instant::now();
        loop {
            let spans = self.spans.lock().unwrap().clone();
            if spans.iter().any(|(_, span)| span.name == name) {
                return spans;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no span `{name}` arrived; got {:?}",
                spans.iter().map(|(_, s)| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn text(value: Option<&Any>) -> String {
    match value {
        Some(Any::StringValue(text)) => text.clone(),
        Some(Any::IntValue(n)) => n.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
}

/// Names and attributes of `spans`, for failure messages.
fn summary(spans: &[(String, Span)]) -> Vec<(String, Vec<(String, String)>)> {
    spans
        .iter()
        .map(|(_, span)| {
            let attributes = span
                .attributes
                .iter()
                .map(|kv| {
                    (
                        kv.key.clone(),
                        text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                    )
                })
                .collect();
            (span.name.clone(), attributes)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn named<'a>(spans: &'a [(String, Span)], name: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .map(|(_, span)| span)
        .filter(|span| span.name == name)
        .collect()
}

fn children<'a>(spans: &'a [(String, Span)], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .map(|(_, span)| span)
        .filter(|span| span.parent_span_id == parent.span_id)
        .collect()
}

/// A gateway exporting to `receiver` every 100 ms (`envs` besides), its tenant `acme` allowed
/// `testkit.echo`, and a run.
async fn echo_gateway(receiver: &Receiver, envs: &[(&str, &str)]) -> (Gateway, Tenant, String) {
    let endpoint = receiver.start().await;
    let mut all = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    all.extend_from_slice(envs);
    let gateway = Gateway::options().envs(&all).start();
    let acme = Tenant::setup("acme")
        .tools(&["testkit.echo"])
        .create(&gateway)
        .await;
    let run = gateway.open_run(&acme.token, "support", 0).await;
    (gateway, acme, run)
}

/// An ExecuteTool request inside the agent's span.
fn traced(request: pb::ExecuteToolRequest, token: &str) -> tonic::Request<pb::ExecuteToolRequest> {
    let mut request = authed(request, token);
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{AGENT_SPAN}-01").parse().unwrap(),
    );
    request
        .metadata_mut()
        .insert("tracestate", "agent=run-42".parse().unwrap());
    request
}

#[tokio::test]
async fn a_call_joins_the_agents_trace_down_to_the_vendor_request() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let fake = FakeSlack::start().await;
    let gateway = Gateway::options()
        .config(&slack_config(&fake))
        .envs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "toolgate-e2e"),
            ("TOOLGATE_LOG_FORMAT", "json"),
            ("TOOLGATE_LOG", "info"),
        ])
        .stderr_to_file()
        .start();
    let acme = Tenant::setup("acme")
        .tools(&["slack.post_message"])
        .policy(POLICY)
        .approver()
        .create(&gateway)
        .await;
    let printed = gateway.secrets_put("acme", "slack_default", &[], &format!("{BOT_TOKEN}\n"));
    assert!(!printed.contains(BOT_TOKEN));
    let run = gateway.open_run(&acme.token, "support", 0).await;
    let mut agent = gateway.agent().await;

    // 1. A post the policy allows.
    let posted = agent
        .execute_tool(traced(
            pb::ExecuteToolRequest {
                tool_use_id: "toolu_posted".into(),
                ..execute(
                    &run,
                    "slack.post_message",
                    &format!(r#"{{"channel": "C0ALLOWED1", "text": "{SECRET_TEXT}"}}"#),
                )
            },
            &acme.token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(posted.status(), pb::ToolCallStatus::Succeeded, "{posted:?}");

    // 2. A tool outside the manifest: refused, with its code as error.type.
    let refused = agent
        .execute_tool(traced(
            pb::ExecuteToolRequest {
                tool_use_id: "toolu_refused".into(),
                ..execute(
                    &run,
                    "slack.channel_history",
                    r#"{"channel": "C0ALLOWED1"}"#,
                )
            },
            &acme.token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refused.error_code, "NOT_IN_MANIFEST", "{refused:?}");

    // 3. A post that waits for a human, then approved.
    let held = agent
        .execute_tool(traced(
            pb::ExecuteToolRequest {
                tool_use_id: "toolu_held".into(),
                ..execute(
                    &run,
                    "slack.post_message",
                    &format!(r#"{{"channel": "C0ELSEWHERE", "text": "{SECRET_TEXT}"}}"#),
                )
            },
            &acme.token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        held.status(),
        pb::ToolCallStatus::WaitingApproval,
        "{held:?}"
    );
    let approved = gateway
        .resume(
            acme.approver(),
            &run,
            &held.pending_invocation_id,
            pb::ResumeDecision::Approve,
            "checked",
        )
        .await;
    assert_eq!(
        approved.outcome(),
        pb::ResumeOutcome::Executed,
        "{approved:?}"
    );
    assert_eq!(
        approved.result.as_ref().map(|r| r.status()),
        Some(pb::ToolCallStatus::Succeeded),
        "{approved:?}"
    );

    // The vendor saw the trace: the attempt's span id as the parent.
    let requests = fake.requests("chat.postMessage").await;
    assert_eq!(requests.len(), 2);
    let traceparent = requests[0]
        .headers
        .get("traceparent")
        .expect("the vendor request carries a traceparent")
        .to_str()
        .unwrap()
        .to_owned();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[1], TRACE_ID, "{traceparent}");
    assert_ne!(parts[2], AGENT_SPAN, "{traceparent}");
    assert_eq!(
        requests[0]
            .headers
            .get("tracestate")
            .map(|v| v.to_str().unwrap()),
        Some("agent=run-42")
    );

    // Spans are exported in the order they end: once the decision's is in, so are the rest.
    let spans = receiver.wait_for("approval.approve").await;
    assert!(spans.iter().all(|(service, _)| service == "toolgate-e2e"));

    // The allowed post: server span -> execute_tool -> children, all in the agent's trace.
    let calls = named(&spans, "execute_tool slack.post_message");
    let call = calls
        .iter()
        .find(|span| attribute(span, "gen_ai.tool.call.id").as_deref() == Some("toolu_posted"))
        .unwrap_or_else(|| {
            panic!(
                "no execute_tool span for the allowed post in {:#?}",
                summary(&spans)
            )
        });
    assert_eq!(hex(&call.trace_id), TRACE_ID);
    assert_eq!(call.kind, SpanKind::Internal as i32);
    let server = spans
        .iter()
        .map(|(_, span)| span)
        .find(|span| span.span_id == call.parent_span_id)
        .expect("the call's parent is exported");
    assert_eq!(server.kind, SpanKind::Server as i32);
    assert_eq!(server.name, "toolgate.v1.AgentService/ExecuteTool");
    assert_eq!(hex(&server.parent_span_id), AGENT_SPAN);
    for (key, value) in [
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "slack.post_message"),
        ("gen_ai.conversation.id", run.as_str()),
        ("toolgate.tenant", "acme"),
        ("toolgate.decision", "allow"),
        ("toolgate.policy_ids", "base"),
        ("toolgate.attempts", "1"),
        ("toolgate.outcome", "succeeded"),
    ] {
        assert_eq!(
            attribute(call, key).as_deref(),
            Some(value),
            "{key}: {call:?}"
        );
    }
    assert_eq!(attribute(call, "error.type"), None);
    let mut names: Vec<&str> = children(&spans, call)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "connector.invoke",
            "credentials.resolve",
            "ledger.commit",
            "ledger.commit",
            "policy.evaluate"
        ],
        "{names:?}"
    );
    let connector = children(&spans, call)
        .into_iter()
        .find(|span| span.name == "connector.invoke")
        .unwrap();
    let attempts: Vec<&Span> = spans
        .iter()
        .map(|(_, span)| span)
        .filter(|span| span.name == "POST" && hex(&span.trace_id) == TRACE_ID)
        .collect();
    let attempt = attempts
        .iter()
        .find(|span| hex(&span.span_id) == parts[2])
        .expect("the vendor request's parent is an exported attempt span");
    assert_eq!(attempt.kind, SpanKind::Client as i32);
    assert_eq!(
        attribute(attempt, "http.response.status_code").as_deref(),
        Some("200")
    );
    // attempt -> http.call -> connector.invoke
    let http_call = spans
        .iter()
        .map(|(_, span)| span)
        .find(|span| span.span_id == attempt.parent_span_id)
        .unwrap();
    assert_eq!(http_call.parent_span_id, connector.span_id);

    // The JSON log lines written inside the call carry its trace: the vendor attempt's line
    // names the HTTP call's span, which the exporter received.
    let stderr = gateway.stderr();
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|line| line["message"] == "toolgate listening"),
        "{stderr}"
    );
    let vendor = lines
        .iter()
        .find(|line| {
            line["message"] == "vendor attempt" && line["span_id"] == hex(&http_call.span_id)
        })
        .unwrap_or_else(|| panic!("no log line of the vendor attempt in {stderr}"));
    assert_eq!(vendor["trace_id"], TRACE_ID, "{vendor}");
    assert_eq!(vendor["span"], "http.call", "{vendor}");
    assert!(
        !stderr.contains(SECRET_TEXT),
        "an argument reached the logs"
    );

    // The refusal names its code.
    let refusal = named(&spans, "execute_tool slack.channel_history");
    assert_eq!(refusal.len(), 1);
    assert_eq!(
        attribute(refusal[0], "error.type").as_deref(),
        Some("NOT_IN_MANIFEST")
    );
    assert_eq!(hex(&refusal[0].trace_id), TRACE_ID);

    // The held call, and the approval that ran it.
    let held_span = calls
        .iter()
        .find(|span| attribute(span, "gen_ai.tool.call.id").as_deref() == Some("toolu_held"))
        .expect("the held post's span");
    assert_eq!(
        attribute(held_span, "toolgate.outcome").as_deref(),
        Some("waiting_approval")
    );
    assert_eq!(
        attribute(held_span, "toolgate.decision").as_deref(),
        Some("require_expert_approval")
    );
    let decisions = named(&spans, "approval.approve");
    assert_eq!(decisions.len(), 1);
    let decision = decisions[0];
    assert_eq!(
        attribute(decision, "toolgate.pending_invocation_id").as_deref(),
        Some(held.pending_invocation_id.as_str())
    );
    assert_eq!(
        attribute(decision, "toolgate.outcome").as_deref(),
        Some("succeeded")
    );
    // The decision is linked to the call it decided.
    assert!(
        decision
            .links
            .iter()
            .any(|link| link.span_id == held_span.span_id && link.trace_id == held_span.trace_id),
        "{decision:?}"
    );

    // Names, ids and codes only: no argument value, no credential, anywhere.
    let everything = format!("{spans:?}");
    assert!(
        !everything.contains(SECRET_TEXT),
        "an argument reached a span"
    );
    assert!(
        !everything.contains(BOT_TOKEN),
        "a credential reached a span"
    );
}

/// One MCP `tools/call` over a plain HTTP/1.1 connection, as any MCP client sends it; the
/// response's body.
async fn mcp_call(address: &str, token: &str, headers: &[(&str, &str)], body: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

#[tokio::test]
async fn an_mcp_call_joins_the_trace_of_its_meta_or_its_header() {
    const META_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const HEADER_TRACE: &str = "5b8efff798038103d269b633813fc60c";
    let receiver = Receiver::default();
    let (gateway, acme, run) = echo_gateway(&receiver, &[]).await;
    let address = gateway.url.trim_start_matches("http://").to_owned();
    let call = |id: &str, meta: &str| {
        format!(
            r#"{{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {{"name": "testkit__echo", "arguments": {{"message": "{SECRET_TEXT}"}}, "_meta": {{"toolgate/tool_use_id": "{id}"{meta}}}}}}}"#
        )
    };
    let run_header = ("Toolgate-Run-Id", run.as_str());
    let in_meta = mcp_call(
        &address,
        &acme.token,
        &[run_header],
        &call(
            "toolu_meta",
            &format!(r#", "traceparent": "00-{META_TRACE}-{AGENT_SPAN}-01""#),
        ),
    )
    .await;
    assert!(in_meta.contains(r#""isError":false"#), "{in_meta}");
    let traceparent = format!("00-{HEADER_TRACE}-{AGENT_SPAN}-01");
    let in_header = mcp_call(
        &address,
        &acme.token,
        &[run_header, ("traceparent", traceparent.as_str())],
        &call("toolu_header", ""),
    )
    .await;
    assert!(in_header.contains(r#""isError":false"#), "{in_header}");

    let started = Instant::now();
    let spans = loop {
        let spans = receiver.spans.lock().unwrap().clone();
        if named(&spans, "execute_tool testkit.echo").len() >= 2 {
            break spans;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:#?}",
            summary(&spans)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for (id, trace) in [("toolu_meta", META_TRACE), ("toolu_header", HEADER_TRACE)] {
        let call = named(&spans, "execute_tool testkit.echo")
            .into_iter()
            .find(|span| attribute(span, "gen_ai.tool.call.id").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no span of {id} in {:#?}", summary(&spans)));
        assert_eq!(hex(&call.trace_id), trace, "{id}");
        assert_eq!(
            attribute(call, "gen_ai.conversation.id").as_deref(),
            Some(run.as_str())
        );
    }
    let everything = format!("{:?}", summary(&spans));
    assert!(!everything.contains(SECRET_TEXT), "{everything}");
}

/// `OTEL_TRACES_SAMPLER=parentbased_always_off`: a call that arrives without a trace is not
/// exported, one whose `traceparent` says sampled is, whole; one that says not sampled is not.
#[tokio::test]
async fn the_standard_sampler_decides_which_calls_are_exported() {
    const UNSAMPLED_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    let receiver = Receiver::default();
    let sampler = ("OTEL_TRACES_SAMPLER", "parentbased_always_off");
    let (gateway, acme, run) = echo_gateway(&receiver, &[sampler]).await;
    let mut agent = gateway.agent().await;
    let echo = |id: &str| pb::ExecuteToolRequest {
        tool_use_id: id.into(),
        ..execute(&run, "testkit.echo", r#"{"message": "hello"}"#)
    };

    // Without a trace, and in a trace its caller does not sample: nothing exported.
    let alone = agent
        .execute_tool(authed(echo("toolu_alone"), &acme.token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alone.status(), pb::ToolCallStatus::Succeeded, "{alone:?}");
    let mut unsampled = authed(echo("toolu_unsampled"), &acme.token);
    unsampled.metadata_mut().insert(
        "traceparent",
        format!("00-{UNSAMPLED_TRACE}-{AGENT_SPAN}-00")
            .parse()
            .unwrap(),
    );
    let quiet = agent.execute_tool(unsampled).await.unwrap().into_inner();
    assert_eq!(quiet.status(), pb::ToolCallStatus::Succeeded, "{quiet:?}");
    // In a trace its caller samples: exported, the server span with its name and kind.
    let sampled = agent
        .execute_tool(traced(echo("toolu_sampled"), &acme.token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        sampled.status(),
        pb::ToolCallStatus::Succeeded,
        "{sampled:?}"
    );

    // Spans are exported in the order they end: the server span ends last.
    let spans = receiver
        .wait_for("toolgate.v1.AgentService/ExecuteTool")
        .await;
    // The first two calls' spans closed before the third began, and were never queued.
    let call = named(&spans, "execute_tool testkit.echo");
    assert_eq!(call.len(), 1, "{:#?}", summary(&spans));
    assert_eq!(
        attribute(call[0], "gen_ai.tool.call.id").as_deref(),
        Some("toolu_sampled")
    );
    for (_, span) in &spans {
        assert_eq!(hex(&span.trace_id), TRACE_ID, "{:#?}", summary(&spans));
    }
    let server = named(&spans, "toolgate.v1.AgentService/ExecuteTool");
    assert_eq!(server.len(), 1, "{:#?}", summary(&spans));
    assert_eq!(server[0].kind, SpanKind::Server as i32);
    assert_eq!(hex(&server[0].parent_span_id), AGENT_SPAN);
}
