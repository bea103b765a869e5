//! The agent-facing service: runs, tool calls and their results, for the tenant (and agent)
//! of the caller's token. Another tenant's or agent's run or call is NOT_FOUND, like one that
//! does not exist.

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};
use toolgate_core::{AgentId, RunId, TenantId, ToolCallId};
use toolgate_engine::{CreateRun, ExecuteRequest};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::agent_service_server::AgentService;

use super::watch::{self, RunEventStream};
use super::{Shared, page_size};
use crate::auth::{Caller, caller};
use crate::convert::{self, parse_id};
use crate::overload::CallDeadline;
use crate::status::{ServiceError, status};

/// The agent-facing service.
#[derive(Debug, Clone)]
pub(crate) struct AgentApi(pub(crate) Shared);

impl AgentApi {
    /// A run of the caller's tenant; a token bound to one agent sees only that agent's runs,
    /// and anything else is NOT_FOUND, indistinguishable from a run that does not exist.
    async fn caller_run(
        &self,
        tenant: &TenantId,
        agent: Option<&AgentId>,
        run_id: &RunId,
    ) -> Result<toolgate_ledger::RunRecord, ServiceError> {
        let run = self.0.engine.get_run(tenant, run_id).await?;
        if agent.is_some_and(|a| *a != run.agent) {
            return Err(ServiceError::NotFound(format!("run `{run_id}`")));
        }
        Ok(run)
    }
}

/// The tenant and (for a token bound to one) the agent a caller acts for.
fn agent_scope(caller: &Caller) -> Result<(TenantId, Option<AgentId>), ServiceError> {
    Ok((caller.tenant()?.clone(), caller.agent.clone()))
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    type WatchRunStream = RunEventStream;

    async fn watch_run(
        &self,
        request: Request<pb::WatchRunRequest>,
    ) -> Result<Response<RunEventStream>, Status> {
        let caller = caller(&request)?;
        let (tenant, agent) = agent_scope(&caller)?;
        let body = request.into_inner();
        let run_id = parse_id("run_id", &body.run_id, RunId::new)?;
        self.caller_run(&tenant, agent.as_ref(), &run_id).await?;
        if body.after_cursor < 0 {
            return Err(ServiceError::invalid(
                "after_cursor",
                "must be 0 or a cursor from an earlier event",
            )
            .into());
        }
        Ok(Response::new(watch::run_events(
            Arc::clone(&self.0.engine),
            Arc::clone(&self.0.drain),
            tenant,
            run_id,
            body.after_cursor,
        )))
    }

    async fn create_run(
        &self,
        request: Request<pb::CreateRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        let caller = caller(&request)?;
        let (tenant, bound_agent) = agent_scope(&caller)?;
        let body = request.into_inner();
        let agent = match (bound_agent, body.agent_id.as_str()) {
            (Some(bound), "") => bound,
            (Some(bound), asked) if bound.as_str() == asked => bound,
            (Some(bound), asked) => {
                return Err(ServiceError::PermissionDenied(format!(
                    "this token is bound to agent `{bound}` and cannot open runs for `{asked}`"
                ))
                .into());
            }
            (None, "") => return Err(ServiceError::invalid("agent_id", "required").into()),
            (None, asked) => parse_id("agent_id", asked, AgentId::new)?,
        };
        let run = (!body.run_id.is_empty()).then_some(body.run_id);
        let max_calls = (body.max_calls != 0).then_some(body.max_calls);
        let record = self
            .0
            .engine
            .create_run(CreateRun {
                tenant,
                agent,
                run,
                max_calls,
            })
            .await
            .map_err(status)?;
        Ok(Response::new(convert::run(&record)))
    }

    async fn get_run(
        &self,
        request: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        let caller = caller(&request)?;
        let (tenant, agent) = agent_scope(&caller)?;
        let run_id = parse_id("run_id", &request.get_ref().run_id, RunId::new)?;
        let record = self.caller_run(&tenant, agent.as_ref(), &run_id).await?;
        Ok(Response::new(convert::run(&record)))
    }

    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        let caller = caller(&request)?;
        let (tenant, agent) = agent_scope(&caller)?;
        let run_id = parse_id("run_id", &request.get_ref().run_id, RunId::new)?;
        let specs = self
            .0
            .engine
            .list_tools(&tenant, agent.as_ref(), &run_id)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ListToolsResponse {
            tools: specs.iter().map(|s| convert::tool_definition(s)).collect(),
        }))
    }

    async fn execute_tool(
        &self,
        request: Request<pb::ExecuteToolRequest>,
    ) -> Result<Response<pb::ToolCallResult>, Status> {
        let caller = caller(&request)?;
        let (tenant, agent) = agent_scope(&caller)?;
        // Set by the overload layer from the client's `grpc-timeout`.
        let deadline = request
            .extensions()
            .get::<CallDeadline>()
            .map(|deadline| deadline.0);
        let body = request.into_inner();
        let link_tenant = tenant.clone();
        let outcome = self
            .0
            .engine
            .execute(ExecuteRequest {
                tenant,
                agent,
                run: body.run_id,
                tool_use_id: body.tool_use_id,
                tool: body.tool_name,
                arguments_json: body.arguments_json,
                correlation_id: body.correlation_id,
                timeout: (body.timeout_ms != 0).then(|| Duration::from_millis(body.timeout_ms)),
                deadline,
            })
            .await
            .map_err(status)?;
        let link = match &self.0.client_links {
            Some(minter) => {
                minter
                    .mint(
                        &self.0,
                        &link_tenant,
                        outcome.decision,
                        outcome.pending_invocation_id.as_deref(),
                    )
                    .await?
            }
            None => None,
        };
        let mut answer = convert::outcome(outcome);
        answer.client_approval_url = link.unwrap_or_default();
        Ok(Response::new(answer))
    }

    async fn await_tool_call(
        &self,
        request: Request<pb::AwaitToolCallRequest>,
    ) -> Result<Response<pb::ToolCallResult>, Status> {
        let caller = caller(&request)?;
        let (tenant, agent) = agent_scope(&caller)?;
        let body = request.into_inner();
        let id = parse_id("tool_call_id", &body.tool_call_id, ToolCallId::new)?;
        let outcome = self
            .0
            .engine
            .await_tool_call(
                &tenant,
                agent.as_ref(),
                &id,
                Duration::from_millis(body.timeout_ms),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(convert::outcome(outcome)))
    }

    async fn get_tool_call(
        &self,
        request: Request<pb::GetToolCallRequest>,
    ) -> Result<Response<pb::ToolCall>, Status> {
        let caller = caller(&request)?;
        let (tenant, agent) = agent_scope(&caller)?;
        let id = parse_id(
            "tool_call_id",
            &request.get_ref().tool_call_id,
            ToolCallId::new,
        )?;
        let record = self
            .0
            .engine
            .get_tool_call(&tenant, &id)
            .await
            .map_err(status)?;
        if agent.is_some_and(|a| a != record.agent) {
            return Err(ServiceError::NotFound(format!("tool call `{id}`")).into());
        }
        Ok(Response::new(convert::tool_call(&record)))
    }

    async fn list_tool_calls(
        &self,
        request: Request<pb::ListToolCallsRequest>,
    ) -> Result<Response<pb::ListToolCallsResponse>, Status> {
        let caller = caller(&request)?;
        let (tenant, agent) = agent_scope(&caller)?;
        let body = request.into_inner();
        let run_id = parse_id("run_id", &body.run_id, RunId::new)?;
        self.caller_run(&tenant, agent.as_ref(), &run_id).await?;
        let after = if body.page_token.is_empty() {
            None
        } else {
            Some(parse_id("page_token", &body.page_token, ToolCallId::new)?)
        };
        let limit = page_size(body.page_size);
        let calls = self
            .0
            .engine
            .store()
            .list_tool_calls(&tenant, &run_id, after.as_ref(), limit)
            .await
            .map_err(status)?;
        let full_page = calls.len() == usize::try_from(limit).unwrap_or(usize::MAX);
        let next_page_token = match calls.last() {
            Some(last) if full_page => last.id.to_string(),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListToolCallsResponse {
            tool_calls: calls.iter().map(convert::tool_call).collect(),
            next_page_token,
        }))
    }
}
