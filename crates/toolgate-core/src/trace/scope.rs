//! Spans a recording subscriber makes itself, entered for each poll of the work they cover by
//! setting one thread-local cell rather than by a trip through `tracing`.
//!
//! A span made with `tracing`'s macros costs, with the gateway's recorder, a visit of its
//! fields as it is made and two trips through the dispatcher for every poll of a future it
//! instruments (entering and leaving it: a push and a pop on the thread's stack of entered
//! spans). The spans that live through a whole request or call (the server span, the call's
//! `execute_tool`, the connector's invocation) are polled tens of times. A [`Span`] opened
//! here is made by the recorder directly, with its attributes written straight into its record,
//! and [`in_span`] enters it for each poll by setting the thread's scope cell and setting it
//! back. The recorder takes the scope as the current span unless a `tracing` span was entered
//! inside it, so spans, leaves and log lines made inside see it as their parent, as
//! `tracing::Span::current()` does.
//!
//! Without a recording subscriber (traces off) a [`Span`] is the `tracing` span the caller
//! gives as the fallback, for the text logs of a gateway logging at debug.

use std::borrow::Borrow;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::{ACCESS, Access, Attribute, SpanContext};

thread_local! {
    /// The scope the thread is in: its recording subscriber's instance and the raw id of the
    /// scope's span, or zeros.
    static SCOPE: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// The raw id of the span whose scope the thread is in, when that span is the recording
/// subscriber `instance`'s (a process has one; tests make several).
pub fn scope_of(instance: u64) -> Option<u64> {
    SCOPE
        .try_with(Cell::get)
        .ok()
        .filter(|&(of, id)| of == instance && id != 0)
        .map(|(_, id)| id)
}

/// A handle to a span a recording subscriber made for a scope; the span ends when the last
/// handle goes (the subscriber counts them as it counts a `tracing` span's).
#[derive(Debug)]
pub struct Scope {
    instance: u64,
    id: u64,
}

impl Scope {
    /// For a recording subscriber: a handle to its span `id` (a `tracing` span id, never 0),
    /// which it counted as one of the span's handles; `instance` tells its spans from another
    /// subscriber's.
    pub fn adopt(instance: u64, id: u64) -> Scope {
        Scope { instance, id }
    }

    /// The recording subscriber's instance.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// The span's raw `tracing` id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Makes this the thread's scope until the guard goes, when the scope before it is the
    /// thread's again (a guard, so a poll that panics sets it back too).
    fn enter(&self) -> Entered {
        Entered(
            SCOPE
                .try_with(|scope| scope.replace((self.instance, self.id)))
                .ok(),
        )
    }

    fn access(&self, what: Access<'_>) {
        let Some(access) = ACCESS.get() else {
            return;
        };
        let mut what = Some(what);
        tracing::dispatcher::get_default(|dispatch| {
            if let Some(what) = what.take() {
                (access.scope)(dispatch, self, what);
            }
        });
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some(access) = ACCESS.get() {
            tracing::dispatcher::get_default(|dispatch| (access.close)(dispatch, self));
        }
    }
}

struct Entered(Option<(u64, u64)>);

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(before) = self.0 {
            let _ = SCOPE.try_with(|scope| scope.set(before));
        }
    }
}

/// A span around a piece of work: a scope the recording subscriber made, or (without one) a
/// `tracing` span.
#[derive(Debug)]
pub enum Span {
    Scope(Scope),
    Tracing(tracing::Span),
}

impl Span {
    /// Opens a span named and located by `site` ([`span_site!`](crate::span_site), which lists
    /// the attributes it may carry), of kind internal, as a child of the current span, with
    /// `attributes` (`otel.name` and `otel.status_code` as the special fields they are): a
    /// scope, when the default dispatcher is a recording subscriber, else `fallback`'s
    /// `tracing` span, which declares the same fields (and those annotated later, `Empty`).
    pub fn open(
        site: &'static tracing::Metadata<'static>,
        attributes: &[(&'static str, Attribute<'_>)],
        fallback: impl FnOnce() -> tracing::Span,
    ) -> Span {
        let scope = ACCESS.get().and_then(|access| {
            tracing::dispatcher::get_default(|dispatch| (access.open)(dispatch, site, attributes))
        });
        match scope {
            Some(scope) => Span::Scope(scope),
            None => Span::Tracing(fallback()),
        }
    }

    /// Whether nothing records this span (a `tracing` span nobody subscribes to).
    pub fn is_disabled(&self) -> bool {
        match self {
            Span::Scope(_) => false,
            Span::Tracing(span) => span.is_disabled(),
        }
    }

    /// Records `attributes` on the span, as [`annotate`](super::annotate) does on a `tracing`
    /// span.
    pub fn annotate(&self, attributes: &[(&'static str, Attribute<'_>)]) {
        match self {
            Span::Scope(scope) => {
                let mut written = false;
                scope.access(Access::Annotate {
                    attributes,
                    written: &mut written,
                });
            }
            Span::Tracing(span) => super::annotate(span, attributes),
        }
    }

    /// Links the span to `other` (for example the call an approval decides).
    pub fn add_link(&self, other: SpanContext) {
        match self {
            Span::Scope(scope) => scope.access(Access::Link(other)),
            Span::Tracing(span) => super::add_link(span, other),
        }
    }

    /// The span's context, when a recording subscriber records it.
    pub fn context(&self) -> Option<SpanContext> {
        match self {
            Span::Scope(scope) => {
                let mut context = None;
                scope.access(Access::Read(&mut context));
                context
            }
            Span::Tracing(span) => super::span_context(span),
        }
    }
}

/// Runs `work` inside `span` (owned, or borrowed while the caller also annotates it): entered
/// for each poll; an owned span goes when the work is done, which ends it when it was the last
/// handle.
pub fn in_span<S: Borrow<Span>, F: Future>(span: S, work: F) -> InSpan<S, F> {
    InSpan {
        work,
        span: Some(span),
    }
}

pin_project_lite::pin_project! {
    /// See [`in_span`].
    #[derive(Debug)]
    pub struct InSpan<S, F> {
        #[pin]
        work: F,
        span: Option<S>,
    }
}

impl<S: Borrow<Span>, F: Future> Future for InSpan<S, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let poll = match this.span.as_ref().map(Borrow::borrow) {
            Some(Span::Scope(scope)) => {
                let _entered = scope.enter();
                this.work.poll(cx)
            }
            Some(Span::Tracing(span)) => {
                let _entered = span.enter();
                this.work.poll(cx)
            }
            None => this.work.poll(cx),
        };
        if poll.is_ready() {
            *this.span = None;
        }
        poll
    }
}

/// Declares the static call site of a span opened with [`Span::open`]: `$metadata`, a
/// `tracing::Metadata` named `$name` with target `$target` at debug level, which the recorder
/// keeps with the span (a log line names the span it was written in from it, and
/// `tracing::Span::current()` gives it). The attributes the span may carry, given when it
/// opens or later, can be listed after it: the recorder makes room for that many at once.
#[macro_export]
macro_rules! span_site {
    (
        $vis:vis $metadata:ident, $name:literal, $target:literal
        $(, [$($field:literal),* $(,)?])?
    ) => {
        $vis static $metadata: $crate::trace::__tracing::Metadata<'static> = {
            static __SPAN_SITE: $crate::trace::Site = $crate::trace::Site(&$metadata);
            $crate::trace::__tracing::Metadata::new(
                $name,
                $target,
                $crate::trace::__tracing::Level::DEBUG,
                ::core::option::Option::Some(::core::file!()),
                ::core::option::Option::Some(::core::line!()),
                ::core::option::Option::Some(::core::module_path!()),
                $crate::trace::__tracing::field::FieldSet::new(
                    &[$($($field),*)?],
                    $crate::trace::__tracing::callsite::Identifier(&__SPAN_SITE),
                ),
                $crate::trace::__tracing::metadata::Kind::SPAN,
            )
        };
    };
}

/// The call site of a span opened with [`Span::open`] ([`span_site!`](crate::span_site)).
#[doc(hidden)]
#[derive(Debug)]
pub struct Site(pub &'static tracing::Metadata<'static>);

impl tracing::callsite::Callsite for Site {
    fn set_interest(&self, _: tracing::subscriber::Interest) {}

    fn metadata(&self) -> &tracing::Metadata<'_> {
        self.0
    }
}
