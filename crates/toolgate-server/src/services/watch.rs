//! WatchRun: a run's audit events from a cursor (the tenant chain position). The ledger is the
//! source of truth, re-read when the engine announces new events and every 500 ms otherwise,
//! so a reconnecting client misses nothing; a shutdown ends the stream cleanly.

use std::sync::Arc;
use std::time::Duration;

use tonic::Status;
use toolgate_core::{RunId, TenantId};
use toolgate_engine::Engine;
use toolgate_proto::v1 as pb;

use crate::drain::Drain;
use crate::status::status;

/// How often a watcher re-reads the ledger when nothing in this process announced events
/// (events written by other processes sharing the database).
const WATCH_POLL: Duration = Duration::from_millis(500);

/// The stream of a WatchRun call.
pub(crate) type RunEventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::RunEvent, Status>> + Send>>;

/// The events of `run` after `after_cursor`, then those that follow as they are committed,
/// until a shutdown begins. The caller has checked that the run is the caller's.
pub(crate) fn run_events(
    engine: Arc<Engine>,
    drain: Arc<Drain>,
    tenant: TenantId,
    run_id: RunId,
    after_cursor: i64,
) -> RunEventStream {
    let announcements = engine.subscribe_events();
    let state = (
        (engine, drain),
        tenant,
        run_id,
        after_cursor,
        announcements,
        std::collections::VecDeque::new(),
    );
    let stream = futures::stream::unfold(
        state,
        |((engine, drain), tenant, run, mut cursor, mut announcements, mut buffered)| async move {
            loop {
                if let Some(event) = buffered.pop_front() {
                    return Some((
                        Ok(event),
                        (
                            (engine, drain),
                            tenant,
                            run,
                            cursor,
                            announcements,
                            buffered,
                        ),
                    ));
                }
                // A shutdown ends the stream cleanly; the client resumes from its last
                // cursor on another replica or after the restart.
                if drain.state().draining {
                    return None;
                }
                // Mark the current announcement seen before reading, so a write that lands
                // after the read wakes the wait below.
                announcements.borrow_and_update();
                let events = match engine
                    .store()
                    .list_run_events(&tenant, &run, cursor, 100)
                    .await
                {
                    Ok(events) => events,
                    Err(err) => {
                        let status = status(err);
                        return Some((
                            Err(status),
                            (
                                (engine, drain),
                                tenant,
                                run,
                                i64::MAX,
                                announcements,
                                buffered,
                            ),
                        ));
                    }
                };
                if let Some(last) = events.last() {
                    cursor = last.chain_seq;
                    buffered.extend(events.iter().map(run_event));
                    continue;
                }
                if cursor == i64::MAX {
                    return None;
                }
                tokio::select! {
                    changed = announcements.changed() => {
                        if changed.is_err() {
                            return None;
                        }
                    }
                    () = tokio::time::sleep(WATCH_POLL) => {}
                    () = drain.stopping() => return None,
                }
            }
        },
    );
    Box::pin(stream)
}

fn run_event(event: &toolgate_ledger::AuditEvent) -> pb::RunEvent {
    pb::RunEvent {
        cursor: event.chain_seq,
        kind: event.kind.clone(),
        tool_call_id: event
            .tool_call_id
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        payload_json: event.payload.to_string(),
        at_ms: event.at.0,
    }
}
