//! The MCP server handler: `tools/list` is the run's manifest, `tools/call` the engine's
//! pipeline, written by hand (no tool macro): the tools are the registry's, not this crate's.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult,
    DetailedTask, ErrorData, GetTaskParams, GetTaskResult, Implementation, JsonObject,
    ListToolsResult, MetaObject, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    TASKS_EXTENSION_ID, Task, TaskPayload, TaskStatus, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};
use tonic::codegen::http;
use toolgate_core::{RiskLevel, RunId, ToolCallId, ToolCallStatus, ToolSpec};
use toolgate_engine::{CreateRun, EngineError, ExecuteOutcome, ExecuteRequest, llm_tool_name};
use tracing::Instrument as _;

use super::{McpCaller, mcp_caller};
use crate::overload::Admission;
use crate::services::Shared;
use crate::status::{ServiceError, status};

/// The gateway's own tool: the outcome of an earlier call, once a human decided it.
const CALL_STATUS_TOOL: &str = "toolgate__call_status";

/// The longest `wait_ms` [`CALL_STATUS_TOOL`] honours.
const MAX_STATUS_WAIT: Duration = Duration::from_secs(60);

/// `_meta` keys a client may send.
const META_RUN: &str = "toolgate/run_id";
const META_TOOL_USE_ID: &str = "toolgate/tool_use_id";
const META_CORRELATION_ID: &str = "toolgate/correlation_id";

const INSTRUCTIONS: &str = "Every call goes through toolgate's policy and is recorded. A call that needs a human's approval answers with status `waiting_approval` and a `tool_call_id`: tell the user it awaits approval, and later call `toolgate__call_status` with that `tool_call_id` to learn how it ended. Refused calls answer with an error code; do not retry them unchanged.";

/// The id of the run an agent token acts in when its MCP requests name none: one per token,
/// so its calls are one audit trail, opened with the agent's manifest on first use.
pub(crate) fn standing_run_id(token_id: &str) -> String {
    format!("mcp_{token_id}")
}

/// The handler rmcp calls; one per request (it is cheap to clone).
#[derive(Clone)]
pub(crate) struct Gate {
    shared: Shared,
    admission: Arc<Admission>,
    /// The call budget of a standing run (the gateway's largest).
    standing_budget: u32,
    /// Standing runs known to exist, so a request does not ask the store again.
    opened: Arc<Mutex<HashSet<String>>>,
}

impl Gate {
    pub(crate) fn new(shared: Shared, admission: Arc<Admission>, standing_budget: u32) -> Gate {
        Gate {
            shared,
            admission,
            standing_budget,
            opened: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// The run a request acts in: the header, else `_meta`, else the token's standing run
    /// (opened now if it is not yet).
    async fn run_of(
        &self,
        who: &McpCaller,
        meta: Option<&MetaObject>,
    ) -> Result<String, ServiceError> {
        let named = who.run_header.clone().or_else(|| {
            meta.and_then(|meta| meta.get(META_RUN))
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        if let Some(run) = named {
            return Ok(run);
        }
        let run = standing_run_id(&who.caller.token_id);
        if self
            .opened
            .lock()
            .expect("standing runs lock")
            .contains(&run)
        {
            return Ok(run);
        }
        let tenant = who.caller.tenant()?.clone();
        let Some(agent) = who.caller.agent.clone() else {
            return Err(ServiceError::invalid(
                "Toolgate-Run-Id",
                "this agent token is not bound to one agent, so it has no standing run: name the run in the Toolgate-Run-Id header or in _meta[\"toolgate/run_id\"]",
            ));
        };
        let id = RunId::new(run.clone()).map_err(|e| ServiceError::invalid("run_id", e))?;
        match self.shared.engine.get_run(&tenant, &id).await {
            Ok(_) => {}
            Err(EngineError::NotFound(_)) => {
                let opened = self
                    .shared
                    .engine
                    .create_run(CreateRun {
                        tenant,
                        agent,
                        run: Some(run.clone()),
                        max_calls: Some(self.standing_budget),
                    })
                    .await;
                match opened {
                    // Another replica (or request) opened it first: the same run.
                    Ok(_) | Err(EngineError::Conflict(_)) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            Err(error) => return Err(error.into()),
        }
        self.opened
            .lock()
            .expect("standing runs lock")
            .insert(run.clone());
        Ok(run)
    }

    async fn execute(&self, who: &McpCaller, request: CallToolRequestParams) -> CallToolResult {
        let meta = request.meta.as_ref().map(|meta| &meta.0);
        let run = match self.run_of(who, meta).await {
            Ok(run) => run,
            Err(error) => return refused(error),
        };
        let tenant = match who.caller.tenant() {
            Ok(tenant) => tenant.clone(),
            Err(error) => return refused(error),
        };
        let text = |key: &str| {
            meta.and_then(|meta| meta.get(key))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let tool_use_id = text(META_TOOL_USE_ID)
            .unwrap_or_else(|| format!("mcp_{}", uuid::Uuid::now_v7().simple()));
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let link_tenant = tenant.clone();
        let execute = ExecuteRequest {
            tenant,
            agent: who.caller.agent.clone(),
            run,
            tool_use_id,
            tool: request.name.into_owned(),
            arguments_json: arguments.to_string(),
            correlation_id: text(META_CORRELATION_ID).unwrap_or_default(),
            timeout: None,
            deadline: None,
        };
        // The same limits as ExecuteTool; a refused call never reaches the engine.
        let slot = match self
            .admission
            .admit(None, self.shared.drain.stopping())
            .await
        {
            Ok(slot) => slot,
            Err(refusal) => return refused(ServiceError::from(refusal)),
        };
        // Its own task: a client that hangs up does not cut the call short between the
        // connector and the ledger.
        let engine = Arc::clone(&self.shared.engine);
        let span = tracing::Span::current();
        let task = tokio::spawn(
            async move {
                let _slot = slot;
                engine.execute(execute).await
            }
            .instrument(span),
        );
        match task.await {
            Ok(Ok(outcome)) => {
                let link = match &self.shared.client_links {
                    Some(minter) => minter
                        .mint(
                            &self.shared,
                            &link_tenant,
                            outcome.decision,
                            outcome.pending_invocation_id.as_deref(),
                        )
                        .await
                        .unwrap_or_else(|error| {
                            // The call waits all the same; an expert can still decide it.
                            tracing::warn!(%error, "minting a client approval link failed");
                            None
                        }),
                    None => None,
                };
                let mut result = outcome_result(outcome);
                if let Some(url) = link {
                    with_client_link(&mut result, &url);
                }
                result
            }
            Ok(Err(error)) => refused(error.into()),
            Err(_) => refused(ServiceError::Engine(EngineError::Unavailable(
                "the call's task ended without an answer".to_owned(),
            ))),
        }
    }

    async fn call_status(&self, who: &McpCaller, request: CallToolRequestParams) -> CallToolResult {
        let arguments = request.arguments.unwrap_or_default();
        let Some(id) = arguments.get("tool_call_id").and_then(Value::as_str) else {
            return refused(ServiceError::invalid(
                "tool_call_id",
                "required: the tool_call_id of the call to look up",
            ));
        };
        let id = match ToolCallId::new(id.to_owned()) {
            Ok(id) => id,
            Err(error) => return refused(ServiceError::invalid("tool_call_id", error)),
        };
        let wait = match arguments.get("wait_ms") {
            None | Some(Value::Null) => Duration::ZERO,
            Some(value) => match value.as_u64() {
                Some(ms) => Duration::from_millis(ms).min(MAX_STATUS_WAIT),
                None => {
                    return refused(ServiceError::invalid(
                        "wait_ms",
                        "must be a whole number of milliseconds (at most 60000)",
                    ));
                }
            },
        };
        let tenant = match who.caller.tenant() {
            Ok(tenant) => tenant.clone(),
            Err(error) => return refused(error),
        };
        match self
            .shared
            .engine
            .await_tool_call(&tenant, who.caller.agent.as_ref(), &id, wait)
            .await
        {
            Ok(outcome) => outcome_result(outcome),
            Err(error) => refused(error.into()),
        }
    }
}

impl rmcp::ServerHandler for Gate {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("toolgate", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let who = caller_of(&context)?;
        let meta = request
            .as_ref()
            .and_then(|request| request.meta.as_ref())
            .or(Some(&context.meta))
            .map(|meta| &meta.0);
        let run = self.run_of(&who, meta).await.map_err(protocol_error)?;
        let run =
            RunId::new(run).map_err(|e| protocol_error(ServiceError::invalid("run_id", e)))?;
        let tenant = who.caller.tenant().map_err(protocol_error)?;
        let specs = self
            .shared
            .engine
            .list_tools(tenant, who.caller.agent.as_ref(), &run)
            .await
            .map_err(|e| protocol_error(e.into()))?;
        let mut tools: Vec<Tool> = specs.iter().map(|spec| tool(spec)).collect();
        tools.push(call_status_tool());
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let who = caller_of(&context)?;
        // The caller's trace: `_meta.traceparent`, else the `traceparent` header.
        // rmcp hands the request's `_meta` over in the context.
        let mut request = request;
        if request.meta.is_none() && !context.meta.is_empty() {
            request.meta = Some(context.meta.clone());
        }
        let span =
            tracing::debug_span!(target: "toolgate::mcp", "mcp.tools_call", otel.kind = "server");
        if !span.is_disabled() {
            let parent = match request.meta.as_ref() {
                Some(meta) if meta.0.contains_key("traceparent") => meta_trace_context(&meta.0),
                _ => who.trace_parent.clone(),
            };
            if let Some(parent) = parent {
                toolgate_core::trace::set_parent(&span, parent);
            }
        }
        let result = async {
            if request.name == CALL_STATUS_TOOL {
                self.call_status(&who, request).await
            } else {
                self.execute(&who, request).await
            }
        }
        .instrument(span)
        .await;
        // A call waiting for a human is a task for clients of the tasks extension: its id is
        // the call's, so any replica answers `tasks/get` from the ledger.
        if client_has_tasks(&context)
            && let Some(task) = waiting_task(&result)
        {
            return Ok(CallToolResponse::Task(CreateTaskResult::new(task)));
        }
        Ok(CallToolResponse::Complete(result))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let who = caller_of(&context)?;
        let tenant = who.caller.tenant().map_err(protocol_error)?;
        let id = ToolCallId::new(request.task_id)
            .map_err(|e| protocol_error(ServiceError::invalid("taskId", e)))?;
        let record = self
            .shared
            .engine
            .get_tool_call(tenant, &id)
            .await
            .map_err(|e| protocol_error(e.into()))?;
        // A token bound to one agent sees that agent's calls only, as on gRPC.
        if who
            .caller
            .agent
            .as_ref()
            .is_some_and(|a| *a != record.agent)
        {
            return Err(protocol_error(ServiceError::NotFound(format!(
                "tool call `{id}`"
            ))));
        }
        let task = Task::new(
            id.to_string(),
            TaskStatus::Working,
            rfc3339(record.created_at.0),
            rfc3339(record.updated_at.0),
        )
        .with_poll_interval_ms(TASK_POLL_INTERVAL_MS);
        let payload = match record.status {
            ToolCallStatus::WaitingApproval
            | ToolCallStatus::Approved
            | ToolCallStatus::Running => TaskPayload::Working,
            _ => {
                let outcome = self
                    .shared
                    .engine
                    .await_tool_call(tenant, who.caller.agent.as_ref(), &id, Duration::ZERO)
                    .await
                    .map_err(|e| protocol_error(e.into()))?;
                let Ok(Value::Object(result)) = serde_json::to_value(outcome_result(outcome))
                else {
                    return Err(ErrorData::internal_error(
                        "the call's result could not be written as JSON",
                        None,
                    ));
                };
                TaskPayload::Completed { result }
            }
        };
        let task = match payload {
            TaskPayload::Working => {
                task.with_status_message("awaiting a human decision; the call runs once approved")
            }
            _ => task,
        };
        Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
    }
}

/// How often a client should poll a waiting call's task: humans decide in seconds at best.
const TASK_POLL_INTERVAL_MS: u64 = 2_000;

/// Whether the client declared the tasks extension: in the request's `_meta` (2026-07-28
/// sends its capabilities with every request), or at its handshake.
fn client_has_tasks(context: &RequestContext<RoleServer>) -> bool {
    let declared = |capabilities: &rmcp::model::ClientCapabilities| {
        capabilities
            .extensions
            .as_ref()
            .is_some_and(|extensions| extensions.contains_key(TASKS_EXTENSION_ID))
    };
    context
        .meta
        .client_capabilities()
        .is_some_and(|capabilities| declared(&capabilities))
        || context
            .peer
            .peer_info()
            .is_some_and(|info| declared(&info.capabilities))
}

/// The task of a result that says its call waits for a human.
fn waiting_task(result: &CallToolResult) -> Option<Task> {
    let meta = result.meta.as_ref()?;
    if meta.get("toolgate/status").and_then(Value::as_str) != Some("waiting_approval") {
        return None;
    }
    let id = meta.get("toolgate/tool_call_id").and_then(Value::as_str)?;
    let now = rmcp::task_manager::current_timestamp();
    Some(
        Task::new(id, TaskStatus::Working, now.clone(), now)
            .with_status_message("awaiting a human decision; the call runs once approved")
            .with_poll_interval_ms(TASK_POLL_INTERVAL_MS),
    )
}

/// Milliseconds since the epoch as RFC 3339 (UTC).
fn rfc3339(millis: i64) -> String {
    chrono::DateTime::from_timestamp_millis(millis)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The W3C context in `_meta` (`traceparent`, `tracestate`), if it holds a valid one.
fn meta_trace_context(meta: &JsonObject) -> Option<toolgate_core::trace::SpanContext> {
    let traceparent = meta.get("traceparent").and_then(Value::as_str)?;
    let tracestate = meta.get("tracestate").and_then(Value::as_str);
    toolgate_core::trace::SpanContext::from_w3c(traceparent, tracestate)
}

fn caller_of(context: &RequestContext<RoleServer>) -> Result<McpCaller, ErrorData> {
    mcp_caller(context.extensions.get::<http::request::Parts>())
        .cloned()
        // `enter` authenticates every request before rmcp sees it.
        .ok_or_else(|| ErrorData::internal_error("the request was not authenticated", None))
}

/// A tool as MCP lists it: the LLM form of its name (clients pass MCP names on to LLM APIs,
/// which forbid dots), its schemas, and hints from its tags and risk.
fn tool(spec: &ToolSpec) -> Tool {
    let input = match &spec.input_schema {
        Value::Object(schema) => schema.clone(),
        _ => JsonObject::new(),
    };
    let read_only = spec.has_tag("read_only");
    let annotations = ToolAnnotations::new()
        .read_only(read_only)
        .destructive(!read_only && spec.risk >= RiskLevel::High)
        .idempotent(spec.idempotent)
        .open_world(true);
    let mut meta = JsonObject::new();
    meta.insert("toolgate/tool".into(), json!(spec.name.to_string()));
    meta.insert("toolgate/risk_level".into(), json!(spec.risk.as_str()));
    meta.insert(
        "toolgate/tags".into(),
        json!(
            spec.tags
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        ),
    );
    let mut tool = Tool::new(
        llm_tool_name(&spec.name),
        spec.description.clone(),
        Arc::new(input),
    )
    .with_annotations(annotations)
    .with_meta(MetaObject(meta));
    // MCP structured content is an object: only object schemas are declared, and then every
    // successful answer is one.
    if let Some(Value::Object(output)) = &spec.output_schema
        && output.get("type").and_then(Value::as_str) == Some("object")
    {
        tool = tool.with_raw_output_schema(Arc::new(output.clone()));
    }
    tool
}

fn call_status_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "tool_call_id": {
                "type": "string",
                "description": "The tool_call_id of an earlier call (a waiting_approval answer carries it)."
            },
            "wait_ms": {
                "type": "integer",
                "minimum": 0,
                "maximum": 60000,
                "description": "How long to wait for the call to end before answering (default 0)."
            }
        },
        "required": ["tool_call_id"],
        "additionalProperties": false
    });
    let Value::Object(schema) = schema else {
        unreachable!("the schema is an object")
    };
    Tool::new(
        CALL_STATUS_TOOL,
        "How an earlier call of this agent ended, or where it stands: use it after a call answered waiting_approval, once a human may have decided. Returns the call's result once it ran.",
        Arc::new(schema),
    )
    .with_annotations(
        ToolAnnotations::new()
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}

/// How a call ended, as MCP answers it: the result on success; otherwise `isError: true`
/// with the status, the stable error code and the ids in the structured content.
pub(crate) fn outcome_result(outcome: ExecuteOutcome) -> CallToolResult {
    let call_id = outcome.tool_call_id.as_ref().map(ToString::to_string);
    let mut meta = JsonObject::new();
    meta.insert("toolgate/status".into(), json!(outcome.status.as_str()));
    if let Some(id) = &call_id {
        meta.insert("toolgate/tool_call_id".into(), json!(id));
    }
    meta.insert("toolgate/replayed".into(), json!(outcome.replayed));
    meta.insert("toolgate/attempts".into(), json!(outcome.attempts));
    if outcome.status == ToolCallStatus::Succeeded {
        let result = outcome.result.unwrap_or(Value::Null);
        let mut answer = match result {
            Value::Object(_) => {
                let text = result.to_string();
                let mut answer = CallToolResult::success(vec![ContentBlock::text(text)]);
                answer.structured_content = Some(result);
                answer
            }
            other => CallToolResult::success(vec![ContentBlock::text(other.to_string())]),
        };
        answer.meta = Some(MetaObject(meta));
        return answer;
    }
    let mut details = JsonObject::new();
    details.insert("status".into(), json!(outcome.status.as_str()));
    if let Some(id) = &call_id {
        details.insert("tool_call_id".into(), json!(id));
    }
    let text = match (&outcome.error, outcome.status) {
        (Some(error), _) => {
            details.insert(
                "error".into(),
                json!({"code": error.code.as_str(), "message": error.message}),
            );
            format!("{}: {}", error.code.as_str(), error.message)
        }
        (None, ToolCallStatus::WaitingApproval) => format!(
            "This call awaits a human decision and has not run. It runs once approved. Call {CALL_STATUS_TOOL} with {{\"tool_call_id\": \"{}\"}} later to learn how it ended.",
            call_id.as_deref().unwrap_or("")
        ),
        (None, status) => format!("the call ended {}", status.as_str()),
    };
    if let Some(pending) = &outcome.pending_invocation_id {
        details.insert("pending_invocation_id".into(), json!(pending));
    }
    if let Some(decision) = outcome.decision {
        details.insert("decision".into(), json!(decision.as_str()));
    }
    if let Some(risk) = outcome.risk {
        details.insert("risk_level".into(), json!(risk.as_str()));
    }
    let mut answer = CallToolResult::error(vec![ContentBlock::text(text)]);
    answer.structured_content = Some(Value::Object(details));
    answer.meta = Some(MetaObject(meta));
    answer
}

/// Adds the end user's approval link to a waiting answer (`require_client_approval`).
fn with_client_link(result: &mut CallToolResult, url: &str) {
    if let Some(Value::Object(details)) = result.structured_content.as_mut() {
        details.insert("client_approval_url".into(), json!(url));
    }
    result.content.push(ContentBlock::text(format!(
        "The end user decides this call: show them this link to approve or reject it: {url}"
    )));
}

/// A request the gateway refused before any tool ran (no such run, not this caller's,
/// malformed ids, overload): `isError: true` naming the refusal by its gRPC code's name, as
/// `ExecuteTool` would have answered it.
fn refused(error: ServiceError) -> CallToolResult {
    let status = status(error);
    let code = code_name(status.code());
    let mut answer = CallToolResult::error(vec![ContentBlock::text(format!(
        "{code}: {}",
        status.message()
    ))]);
    answer.structured_content = Some(json!({
        "status": "refused",
        "error": {"code": code, "message": status.message()},
    }));
    answer
}

/// A refusal of `tools/list`, which has no error result: a JSON-RPC error.
fn protocol_error(error: ServiceError) -> ErrorData {
    let status = status(error);
    let code = code_name(status.code());
    let data = Some(json!({"code": code}));
    match status.code() {
        tonic::Code::Internal | tonic::Code::Unavailable | tonic::Code::Unknown => {
            ErrorData::internal_error(status.message().to_owned(), data)
        }
        _ => ErrorData::invalid_params(status.message().to_owned(), data),
    }
}

/// The canonical name of a gRPC status code (`NOT_FOUND`), the words of the contract.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
