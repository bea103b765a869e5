//! The gateway's server span entered for each poll of its request as a scope
//! (`toolgate_core::trace::Span`), and a task spawned for a request's work run in it.
//!
//! A request's server span lives as long as the request, through every poll of the request's
//! future. Entered as `tracing` enters a span (`Instrument`), each poll was two trips through
//! the dispatcher to the recorder and a push and a pop on the thread's stack of entered spans;
//! made by `tracing`'s macro, its fields were visited and its special `otel.*` fields parsed.
//! Here the recorder makes it directly ([`Recorder::server_span`]) and a poll sets one
//! thread-local cell and sets it back. Spans, leaves and log lines inside see it as the current
//! span all the same (`tracing::Span::current()` too, so a task spawned with it instruments
//! itself with the server span), and the exported span is the same. The engine's call span
//! and connector span are scopes in the same way.

use std::future::Future;

use toolgate_core::trace::{InSpan, Span, in_span};

use super::recorder::Recorder;

/// `future` run in the current span, for a task spawned to do a request's work: in the scope
/// when the current span is a scope's (entered per poll as the request's own future enters
/// it), else in the current `tracing` span.
pub(crate) fn in_current_span<F: Future>(future: F) -> InSpan<Span, F> {
    let scope = tracing::dispatcher::get_default(|dispatch| {
        dispatch.downcast_ref::<Recorder>()?.current_scope()
    });
    let span = match scope {
        Some(scope) => Span::Scope(scope),
        None => Span::Tracing(tracing::Span::current()),
    };
    in_span(span, future)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use opentelemetry_proto::tonic::common::v1::any_value;
    use opentelemetry_proto::tonic::trace::v1::{Span, span};
    use toolgate_core::trace::{Attribute, Leaf, LeafValue, SpanContext};
    use tracing::Instrument as _;

    use super::super::otlp::{Attributes, Value};
    use super::super::recorder::tests::{attribute, decoded, hex};
    use super::super::recorder::{GRPC_REQUEST, SpanQueue};
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const CALLER: &str = "00f067aa0ba902b7";

    fn caller(flags: &str) -> SpanContext {
        SpanContext::from_w3c(&format!("00-{TRACE}-{CALLER}-{flags}"), Some("congo=t61")).unwrap()
    }

    fn recorder(queue: &Arc<SpanQueue>) -> Recorder {
        Recorder::new(
            Arc::clone(queue),
            Box::new(tracing::subscriber::NoSubscriber::default()),
        )
    }

    /// A server span, as the gRPC layer makes it.
    fn server_span(parent: Option<SpanContext>) -> toolgate_core::trace::Span {
        let mut parent = Some(parent);
        toolgate_core::trace::Span::Scope(tracing::dispatcher::get_default(|dispatch| {
            let recorder = dispatch.downcast_ref::<Recorder>().unwrap();
            recorder.server_span(
                &GRPC_REQUEST,
                parent.take().unwrap(),
                || "svc/Method".to_owned(),
                |attributes: &mut Attributes| attributes.push("rpc.system", Value::Text("grpc")),
            )
        }))
    }

    fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
        spans
            .iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| panic!("no {name} in {spans:#?}"))
    }

    /// Pending once (waking itself), then ready: a future polled twice.
    fn yield_once() -> impl Future<Output = ()> {
        let mut yielded = false;
        std::future::poll_fn(move |cx| {
            if yielded {
                Poll::Ready(())
            } else {
                yielded = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
    }

    #[test]
    fn a_scope_is_the_current_span_of_what_runs_in_it_and_ends_with_it() {
        let queue = Arc::new(SpanQueue::new(16, 16));
        tracing::subscriber::with_default(recorder(&queue), || {
            // A span entered before the request is outside its scope: never a parent in it.
            let outside = tracing::info_span!("outside");
            let _outside = outside.enter();
            let outside_context = toolgate_core::trace::current().unwrap();
            let scope = server_span(Some(caller("01")));
            let work = in_span(scope, async {
                let context = toolgate_core::trace::current().unwrap();
                assert_eq!(context.trace_id.to_string(), TRACE);
                for _ in 0..2 {
                    assert_eq!(toolgate_core::trace::current().unwrap(), context);
                    // What a log line names and a spawned task instruments itself with.
                    let current = tracing::Span::current();
                    assert_eq!(current.metadata().map(|m| m.name()), Some("grpc.request"));
                    drop(current);
                    drop(tracing::info_span!("child"));
                    drop(Leaf::start("leaf", ("k", LeafValue::Int(1))).unwrap());
                    yield_once().await;
                }
                let inner = tracing::info_span!("inner");
                inner.in_scope(|| {
                    assert_ne!(toolgate_core::trace::current().unwrap(), context);
                    drop(tracing::info_span!("grandchild"));
                });
                assert_eq!(toolgate_core::trace::current().unwrap(), context);
            });
            futures::executor::block_on(work);
            assert_eq!(toolgate_core::trace::current(), Some(outside_context));
        });
        let spans = decoded(&queue);
        let server = named(&spans, "svc/Method");
        assert_eq!(server.kind, span::SpanKind::Server as i32);
        assert_eq!(hex(&server.trace_id), TRACE);
        assert_eq!(hex(&server.parent_span_id), CALLER);
        assert_eq!(server.trace_state, "congo=t61");
        assert_eq!(server.flags & 0x301, 0x301, "sampled, remote parent");
        assert_eq!(
            server.attributes[0].value.clone().and_then(|v| v.value),
            Some(any_value::Value::StringValue("grpc".into()))
        );
        let children: Vec<&str> = spans
            .iter()
            .filter(|span| span.parent_span_id == server.span_id)
            .map(|span| span.name.as_str())
            .collect();
        assert_eq!(children, ["child", "leaf", "child", "leaf", "inner"]);
        for span in spans.iter().filter(|span| span.name != "outside") {
            assert_eq!(hex(&span.trace_id), TRACE, "{span:?}");
            assert!(span.end_time_unix_nano <= server.end_time_unix_nano);
        }
        assert_ne!(hex(&named(&spans, "outside").trace_id), TRACE);
        assert_eq!(
            named(&spans, "grandchild").parent_span_id,
            named(&spans, "inner").span_id
        );
        // The server span ends with its work, before the span it was made in.
        let at = |name: &str| spans.iter().position(|span| span.name == name).unwrap();
        assert!(at("svc/Method") > at("inner") && at("svc/Method") < at("outside"));
    }

    #[test]
    fn a_scope_dropped_unfinished_still_ends_and_an_unsampled_one_is_never_queued() {
        let queue = Arc::new(SpanQueue::new(16, 16));
        tracing::subscriber::with_default(recorder(&queue), || {
            let scope = server_span(None);
            let mut work = Box::pin(in_span(scope, std::future::pending::<()>()));
            let waker = futures::task::noop_waker();
            assert!(
                work.as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            drop(work);

            let scope = server_span(Some(caller("00")));
            futures::executor::block_on(in_span(scope, async {
                // Unsampled: the ids still reach outbound requests and log lines.
                let current = toolgate_core::trace::current().unwrap();
                assert!(!current.sampled);
                assert_eq!(current.trace_id.to_string(), TRACE);
                drop(tracing::info_span!("quiet child"));
                assert!(Leaf::start("quiet leaf", ("k", LeafValue::Int(1))).is_none());
            }));
        });
        let spans = decoded(&queue);
        assert_eq!(spans.len(), 1, "{spans:#?}");
        assert_eq!(spans[0].name, "svc/Method");
        assert!(spans[0].parent_span_id.is_empty(), "a root");
        assert_ne!(hex(&spans[0].trace_id), TRACE);
    }

    #[test]
    fn a_task_spawned_with_the_current_span_runs_in_the_scope_which_ends_after_it() {
        let queue = Arc::new(SpanQueue::new(16, 16));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let server_id = tracing::subscriber::with_default(recorder(&queue), || {
            let scope = server_span(None);
            let (go, wait) = tokio::sync::oneshot::channel::<()>();
            #[allow(
                clippy::async_yields_async,
                reason = "the request's future hands out the task it spawned, still running"
            )]
            let task = runtime.block_on(in_span(scope, async {
                // As the overload layer spawns a call's work.
                let task = tokio::spawn(in_current_span(async {
                    wait.await.unwrap();
                    drop(tracing::info_span!("in the task"));
                }));
                // A task spawned with `tracing`'s current span is in it too.
                let other = tokio::spawn(
                    async { drop(tracing::info_span!("in the other task")) }
                        .instrument(tracing::Span::current()),
                );
                other.await.unwrap();
                // In a span entered in the scope: that span.
                let call = tracing::info_span!("call");
                call.in_scope(|| {
                    tokio::spawn(in_current_span(async {
                        drop(tracing::info_span!("in the call's task"));
                    }))
                })
                .await
                .unwrap();
                task
            }));
            // The request's future is done; the task still holds the span.
            let spans = decoded(&queue);
            let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
            assert_eq!(names, ["in the other task", "in the call's task", "call"]);
            assert_eq!(spans[1].parent_span_id, spans[2].span_id);
            let server_id = spans[2].parent_span_id.clone();
            assert_eq!(spans[0].parent_span_id, server_id);
            go.send(()).unwrap();
            runtime.block_on(task).unwrap();
            server_id
        });
        let spans = decoded(&queue);
        let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
        assert_eq!(names, ["in the task", "svc/Method"]);
        assert_eq!(spans[1].span_id, server_id);
        assert_eq!(spans[0].parent_span_id, server_id);
    }

    toolgate_core::span_site!(CALL, "call", "toolgate::test");
    toolgate_core::span_site!(TASK, "task", "toolgate::test");

    /// A span opened with `toolgate_core::trace::Span::open`, which the recorder must make.
    fn opened(
        site: &'static tracing::Metadata<'static>,
        attributes: &[(&'static str, Attribute<'_>)],
    ) -> toolgate_core::trace::Span {
        let span = toolgate_core::trace::Span::open(site, attributes, || {
            unreachable!("the recorder makes it")
        });
        assert!(matches!(span, toolgate_core::trace::Span::Scope(_)));
        span
    }

    fn text(value: &str) -> Option<any_value::Value> {
        Some(any_value::Value::StringValue(value.to_owned()))
    }

    #[test]
    fn a_span_opened_in_a_scope_is_its_child_and_the_scope_of_what_runs_in_it() {
        let queue = Arc::new(SpanQueue::new(16, 16));
        tracing::subscriber::with_default(recorder(&queue), || {
            futures::executor::block_on(in_span(server_span(Some(caller("01"))), async {
                let server = toolgate_core::trace::current().unwrap();
                let call = opened(
                    &CALL,
                    &[
                        ("opened", Attribute::Int(1)),
                        ("otel.name", Attribute::Text("call tool")),
                    ],
                );
                let context = call.context().unwrap();
                assert_eq!(context.trace_id, server.trace_id);
                assert_ne!(context.span_id, server.span_id);
                in_span(&call, async {
                    for _ in 0..2 {
                        assert_eq!(toolgate_core::trace::current().unwrap(), context);
                        let current = tracing::Span::current();
                        assert_eq!(current.metadata().map(|m| m.name()), Some("call"));
                        drop(current);
                        drop(Leaf::start("leaf", ("k", LeafValue::Int(1))).unwrap());
                        yield_once().await;
                    }
                    // Owned, as a connector's task holds it: it ends when its work is done.
                    let task = opened(&TASK, &[]);
                    in_span(task, async {
                        drop(tracing::info_span!("attempt"));
                        yield_once().await;
                        let current = toolgate_core::trace::current().unwrap();
                        assert_eq!(current.trace_id, context.trace_id);
                        assert_ne!(current.span_id, context.span_id);
                    })
                    .await;
                    let ended = decoded(&queue);
                    assert_eq!(ended.last().map(|span| span.name.as_str()), Some("task"));
                    let by = |name: &str| ended.iter().find(|span| span.name == name).unwrap();
                    assert_eq!(by("attempt").parent_span_id, by("task").span_id);
                    assert_eq!(by("task").parent_span_id, context.span_id.0);
                    assert_eq!(by("leaf").parent_span_id, context.span_id.0);
                })
                .await;
                // Out of the call's scope: the server's again.
                assert_eq!(toolgate_core::trace::current().unwrap(), server);
                call.annotate(&[
                    ("late", Attribute::Text("yes")),
                    ("otel.status_code", Attribute::Text("error")),
                ]);
                assert!(!call.is_disabled());
            }));
        });
        let spans = decoded(&queue);
        let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
        assert_eq!(
            names,
            ["call tool", "svc/Method"],
            "leaves and the task went first"
        );
        let (call, server) = (&spans[0], &spans[1]);
        assert_eq!(call.parent_span_id, server.span_id);
        assert_eq!(call.kind, span::SpanKind::Internal as i32);
        assert_eq!(hex(&call.trace_id), TRACE);
        assert_eq!(call.trace_state, "congo=t61");
        assert_eq!(
            attribute(call, "opened"),
            Some(any_value::Value::IntValue(1))
        );
        assert_eq!(attribute(call, "late"), text("yes"));
        assert_eq!(
            call.status.as_ref().map(|status| status.code),
            Some(opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32)
        );
        assert!(call.end_time_unix_nano <= server.end_time_unix_nano);
    }

    #[test]
    fn an_opened_span_follows_its_parents_sampling_and_needs_a_recorder() {
        let queue = Arc::new(SpanQueue::new(16, 16));
        tracing::subscriber::with_default(recorder(&queue), || {
            // Under an unsampled caller: ids to pass on, nothing kept or queued.
            futures::executor::block_on(in_span(server_span(Some(caller("00"))), async {
                let call = opened(&CALL, &[("opened", Attribute::Int(1))]);
                let context = call.context().unwrap();
                assert!(!context.sampled);
                assert_eq!(context.trace_id.to_string(), TRACE);
                in_span(&call, async {
                    assert_eq!(toolgate_core::trace::current().unwrap(), context);
                    assert!(Leaf::start("leaf", ("k", LeafValue::Int(1))).is_none());
                })
                .await;
                call.annotate(&[("late", Attribute::Text("yes"))]);
            }));
            assert!(decoded(&queue).is_empty());
            // With no span around: a root of a trace of its own.
            drop(opened(&CALL, &[]));
        });
        let spans = decoded(&queue);
        assert_eq!(spans.len(), 1);
        assert!(spans[0].parent_span_id.is_empty());
        assert_ne!(hex(&spans[0].trace_id), TRACE);
        // Another subscriber as the default: the `tracing` span the caller gives.
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
            let span =
                toolgate_core::trace::Span::open(&CALL, &[], || tracing::info_span!("fallback"));
            assert!(matches!(span, toolgate_core::trace::Span::Tracing(_)));
            assert!(span.is_disabled());
            assert_eq!(span.context(), None);
        });
    }
}
