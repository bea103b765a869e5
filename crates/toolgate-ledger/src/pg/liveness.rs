//! The instance lock: the session advisory lock that tells other replicas this process is
//! alive, so they leave its `running` calls alone (see `list_running_calls`).
//!
//! The lock lives as long as the one connection holding it. If that connection is lost (its
//! backend terminated, the server restarted, the network cut), other replicas see the lock
//! free, take this process for dead and may settle its running calls as `outcome_unknown`.
//! So a guard task checks the connection every [`CHECK_INTERVAL`]; once it fails, the store
//! starts no call (no new `running` row, no approval claim: [`LedgerError::NotLive`]) and
//! the guard takes the lock again on a new connection, under the same key, so the calls still
//! in flight here count as alive again. Calls settled by another replica meanwhile stay settled:
//! their finish here finds them no longer `running`, and the engine then answers what the
//! ledger says.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::error::LedgerError;

/// How often the lock's connection is checked.
pub(super) const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long a check may take before the connection counts as lost (a cut network answers
/// nothing rather than an error).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait between attempts to take the lock again.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// Failed attempts per warning logged.
const RETRIES_PER_LOG_LINE: u64 = 60;

/// The guard of one store's instance lock.
#[derive(Debug)]
pub(super) struct Liveness {
    held: Arc<AtomicBool>,
    task: tokio::sync::Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
}

impl Liveness {
    /// Takes the lock on `instance` over a new connection and starts guarding it.
    pub(super) async fn acquire(
        options: PgConnectOptions,
        instance: i64,
    ) -> Result<Liveness, LedgerError> {
        let mut conn = options.connect().await.map_err(|error| {
            LedgerError::Database(format!("could not connect to PostgreSQL: {error}"))
        })?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(instance)
            .execute(&mut conn)
            .await
            .map_err(|error| {
                LedgerError::Database(format!("could not take the instance lock: {error}"))
            })?;
        let held = Arc::new(AtomicBool::new(true));
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(guard(conn, options, instance, Arc::clone(&held), stopped));
        Ok(Liveness {
            held,
            task: tokio::sync::Mutex::new(Some((stop, task))),
        })
    }

    /// Whether the lock is held right now.
    pub(super) fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// `Ok` while the lock is held; otherwise the refusal for anything that would start a call.
    pub(super) fn check(&self) -> Result<(), LedgerError> {
        if self.held() {
            return Ok(());
        }
        Err(LedgerError::NotLive(
            "this gateway lost the ledger connection that shows other replicas it is alive, and \
             starts no tool call until it has it back (usually within seconds); retry, or use \
             another replica"
                .to_owned(),
        ))
    }

    /// Releases the lock and stops guarding it.
    pub(super) async fn release(&self) {
        self.held.store(false, Ordering::Release);
        if let Some((stop, task)) = self.task.lock().await.take() {
            let _ = stop.send(());
            if let Err(error) = task.await {
                warn!(%error, "the instance lock guard failed");
            }
        }
    }
}

/// Checks the connection holding the lock until told to stop (or the store is dropped); takes
/// the lock again whenever the connection is lost.
async fn guard(
    mut conn: PgConnection,
    options: PgConnectOptions,
    instance: i64,
    held: Arc<AtomicBool>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        // Held: check the connection until it fails.
        let mut tick = tokio::time::interval(CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                asked = &mut stop => {
                    // Dropped store (no `close`): dropping the connection frees the lock.
                    if asked.is_ok() {
                        unlock(conn, instance).await;
                    }
                    return;
                }
                _ = tick.tick() => {}
            }
            let check = sqlx::query("SELECT 1").execute(&mut conn);
            let problem = match tokio::time::timeout(CHECK_TIMEOUT, check).await {
                Ok(Ok(_)) => continue,
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {} s", CHECK_TIMEOUT.as_secs()),
            };
            held.store(false, Ordering::Release);
            error!(instance, %problem, "lost the connection holding the instance lock; starting no calls until it is taken again");
            break;
        }
        drop(conn);

        // Lost: take it again on a new connection, under the same key.
        let mut attempts: u64 = 0;
        conn = loop {
            tokio::select! {
                _ = &mut stop => return,
                () = tokio::time::sleep(RETRY_INTERVAL) => {}
            }
            attempts += 1;
            let problem = match relock(&options, instance).await {
                Ok(Some(conn)) => break conn,
                Ok(None) => "the lock is still taken (the lost session may linger)".to_owned(),
                Err(error) => error.to_string(),
            };
            // One line at first, then one a minute: the database may stay away for long.
            if attempts % RETRIES_PER_LOG_LINE == 1 {
                warn!(instance, attempts, %problem, "taking the instance lock again failed; retrying every second");
            } else {
                debug!(instance, attempts, %problem, "taking the instance lock again failed");
            }
        };
        held.store(true, Ordering::Release);
        info!(
            instance,
            "took the instance lock again; starting calls again"
        );
    }
}

/// A new connection holding the lock on `instance`, or `None` when some session holds it still
/// (the lost one not yet gone, or another replica checking whether this one is alive).
async fn relock(
    options: &PgConnectOptions,
    instance: i64,
) -> Result<Option<PgConnection>, sqlx::Error> {
    let mut conn = options.connect().await?;
    let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(instance)
        .fetch_one(&mut conn)
        .await?;
    if taken {
        return Ok(Some(conn));
    }
    let _ = conn.close().await;
    Ok(None)
}

async fn unlock(mut conn: PgConnection, instance: i64) {
    // Unlock explicitly: closing the socket alone lets the server notice a moment after `close`
    // has returned, and until then this instance still looks alive.
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(instance)
        .execute(&mut conn)
        .await;
    if let Err(error) = unlocked {
        warn!(%error, "releasing the instance lock failed");
    }
    if let Err(error) = conn.close().await {
        warn!(%error, "closing the instance lock connection failed");
    }
}
