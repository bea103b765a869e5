//! Running a connector under the engine's hard timeout, with panics contained.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use toolgate_core::{Connector, InvocationContext, ToolError, ToolName, ToolOutput};

use crate::trace;

/// How a connector invocation ended.
#[derive(Debug)]
pub(crate) enum Invocation {
    /// The connector answered in time.
    Answered(Result<ToolOutput, ToolError>),
    /// The deadline passed first; the connector's task was aborted and any late answer
    /// is dropped.
    TimedOut,
    /// The connector panicked; the panic is contained to this call.
    Panicked,
}

/// Invokes `connector` on its own task and races it against `timeout`. The separate task means
/// the deadline holds even if the connector blocks its thread or never yields, and a panic
/// surfaces as a join error instead of unwinding through the engine. The task runs in `span`.
pub(crate) async fn invoke(
    connector: Arc<dyn Connector>,
    ctx: InvocationContext,
    tool: ToolName,
    arguments: Value,
    timeout: Duration,
    span: trace::Span,
) -> Invocation {
    // The task runs in `span` (the connector's), so vendor requests are its children; the span
    // ends with the task.
    let mut task = tokio::spawn(trace::in_span(span, async move {
        connector.invoke(ctx, &tool, arguments).await
    }));
    match tokio::time::timeout(timeout, &mut task).await {
        Ok(Ok(answer)) => Invocation::Answered(answer),
        Ok(Err(join_error)) if join_error.is_panic() => Invocation::Panicked,
        Ok(Err(_cancelled)) => Invocation::Panicked,
        Err(_elapsed) => {
            task.abort();
            Invocation::TimedOut
        }
    }
}
