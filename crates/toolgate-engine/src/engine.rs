//! The engine: what it holds and shares. Its work is in the modules below: `pipeline` (the
//! execution pipeline, `Engine::execute`), `runs`, `settings` (flags and policy sets, read
//! through `caches`), `record` (the rows and events it writes), `recovery` (calls a crash
//! interrupted), `answers` (replays and sealed answers) and `resume` (human decisions).

use std::sync::Arc;

use toolgate_core::{Clock, Redactor, Sealer, SecretSource, TenantId, ToolCallId};
use toolgate_ledger::{Store, ToolCallRecord};
use toolgate_policy::CompiledPolicy;

mod answers;
mod caches;
mod pipeline;
mod record;
mod recovery;
mod resume;
mod runs;
mod settings;

pub use pipeline::decode_arguments;
#[cfg(test)]
pub(crate) use record::hash_json;

use crate::catalog::Catalog;
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::observe::{EngineObserver, NoEngineObserver};
use caches::Caches;

/// The chokepoint. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Engine {
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
    redactor: Redactor,
    secrets: Option<Arc<dyn SecretSource>>,
    /// Seals each call's full answer for replays; without one, replays get the ledger's
    /// redacted copy.
    sealer: Option<Arc<dyn Sealer>>,
    config: EngineConfig,
    default_policy: Arc<CompiledPolicy>,
    /// The runs, kill switches and policies the hot path reads.
    caches: Caches,
    /// Bumped after every write that appends run events, so watchers re-read at once instead
    /// of waiting for their next poll; also on every commit of another process sharing the
    /// store, when the store reports those (PostgreSQL).
    events_written: Arc<tokio::sync::watch::Sender<u64>>,
    /// Told how calls end, how long connectors run and how the caches fare.
    observer: Arc<dyn EngineObserver>,
}

impl Engine {
    /// An engine over `store` serving the tools of `catalog`.
    pub fn new(
        store: Arc<dyn Store>,
        catalog: Arc<Catalog>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let default_policy =
            CompiledPolicy::compile(catalog.policy_schema(), catalog.default_policy(), 0).map_err(
                |err| {
                    EngineError::FailedPrecondition(format!(
                        "the generated default policy does not validate: {err}"
                    ))
                },
            )?;
        let caches = Caches::new(config.cache_ttl);
        Ok(Engine::forward_store_commits(Engine {
            store,
            catalog,
            clock,
            redactor: Redactor::new(),
            secrets: None,
            sealer: None,
            config,
            default_policy: Arc::new(default_policy),
            caches,
            events_written: Arc::new(tokio::sync::watch::Sender::new(0)),
            observer: Arc::new(NoEngineObserver),
        }))
    }

    /// Sets where tenant secrets come from. Without one, a tool that declares secrets fails
    /// with `CREDENTIALS_UNAVAILABLE`.
    #[must_use]
    pub fn with_secrets(mut self, secrets: Arc<dyn SecretSource>) -> Engine {
        self.secrets = Some(secrets);
        self
    }

    /// Sets what seals each call's full answer (the key ring), kept for replays for
    /// `EngineConfig::answer_retention`.
    #[must_use]
    pub fn with_sealer(mut self, sealer: Arc<dyn Sealer>) -> Engine {
        self.sealer = Some(sealer);
        self
    }

    /// Sets who is told how calls end, how long connectors run and how the caches fare (the
    /// gateway's metrics). Without one, nobody is.
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn EngineObserver>) -> Engine {
        self.caches.observe(Arc::clone(&observer));
        self.observer = observer;
        self
    }

    /// The tools served.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The redactor everything stored passes through.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Changes whenever this engine has committed run events: a cue for watchers to re-read
    /// the ledger (which stays the source of truth, also for events of other processes).
    pub fn subscribe_events(&self) -> tokio::sync::watch::Receiver<u64> {
        self.events_written.subscribe()
    }

    /// One recorded call of `tenant`.
    pub async fn get_tool_call(
        &self,
        tenant: &TenantId,
        id: &ToolCallId,
    ) -> Result<ToolCallRecord, EngineError> {
        self.store
            .get_tool_call(tenant, id)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("tool call `{id}`")))
    }

    fn announce_events(&self) {
        self.events_written
            .send_modify(|count| *count = count.wrapping_add(1));
    }

    /// Relays the store's commit notifications (other replicas' writes) to watchers, for as
    /// long as both the engine and the store's feed live. Needs a Tokio runtime; without one
    /// watchers still see other processes' events by polling.
    fn forward_store_commits(self) -> Engine {
        if let Some(mut commits) = self.store.subscribe_commits()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let announce = Arc::downgrade(&self.events_written);
            runtime.spawn(async move {
                while commits.changed().await.is_ok() {
                    let Some(sender) = announce.upgrade() else {
                        return;
                    };
                    sender.send_modify(|count| *count = count.wrapping_add(1));
                }
            });
        }
        self
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("catalog", &self.catalog)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
