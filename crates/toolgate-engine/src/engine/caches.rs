//! The engine's in-memory caches of what the hot path reads on every call: runs (their
//! manifest and agent are fixed when the run opens), kill switches and compiled policies (both
//! trusted for `EngineConfig::cache_ttl`, then read again). Each cache is bounded: past its
//! capacity it evicts single entries it has not seen used lately (quick_cache's CLOCK-Pro),
//! rather than being emptied at once, so a tenant with many runs costs the others nothing.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quick_cache::Equivalent;
use quick_cache::sync::Cache;
use toolgate_core::{RunId, TenantId};
use toolgate_ledger::RunRecord;
use toolgate_policy::CompiledPolicy;

use crate::observe::{CacheKind, EngineObserver, NoEngineObserver};

/// Runs kept: a run's record is small (its manifest is a list of tool names).
const RUN_CAPACITY: usize = 100_000;
/// Tenants whose kill switch is kept.
const FLAG_CAPACITY: usize = 100_000;
/// Tenants whose compiled policy is kept: a compiled Cedar set is far larger than a flag, and
/// an evicted one only costs a compilation when its tenant calls again.
const POLICY_CAPACITY: usize = 10_000;

/// A tenant's policy as loaded: compiled, or refused (then every call is blocked, fail closed).
#[derive(Clone)]
pub(super) enum PolicyState {
    Ready(Arc<CompiledPolicy>),
    Broken(String),
}

/// The three caches, and how long flags and policies are trusted.
pub(super) struct Caches {
    ttl: Duration,
    /// Told of every lookup, hit or miss.
    observer: Arc<dyn EngineObserver>,
    runs: Cache<(TenantId, RunId), Arc<RunRecord>>,
    flags: Cache<TenantId, (bool, Instant)>,
    policies: Cache<TenantId, (PolicyState, Instant)>,
}

impl Caches {
    pub(super) fn new(ttl: Duration) -> Caches {
        Caches::with_capacities(ttl, RUN_CAPACITY, FLAG_CAPACITY, POLICY_CAPACITY)
    }

    fn with_capacities(ttl: Duration, runs: usize, flags: usize, policies: usize) -> Caches {
        Caches {
            ttl,
            observer: Arc::new(NoEngineObserver),
            runs: Cache::new(runs),
            flags: Cache::new(flags),
            policies: Cache::new(policies),
        }
    }

    pub(super) fn observe(&mut self, observer: Arc<dyn EngineObserver>) {
        self.observer = observer;
    }

    /// A cached run. Looked up by reference: the hot path builds no key.
    pub(super) fn run(&self, tenant: &TenantId, run: &RunId) -> Option<Arc<RunRecord>> {
        let found = self.runs.get(&RunKey { tenant, run });
        self.observer.cache_lookup(CacheKind::Runs, found.is_some());
        found
    }

    pub(super) fn keep_run(&self, run: Arc<RunRecord>) {
        self.runs.insert((run.tenant.clone(), run.id.clone()), run);
    }

    /// A tenant's kill switch (`tool_calling_enabled`), while it is trusted.
    pub(super) fn flag(&self, tenant: &TenantId) -> Option<bool> {
        let found = self
            .flags
            .get(tenant)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(enabled, _)| enabled);
        self.observer
            .cache_lookup(CacheKind::Flags, found.is_some());
        found
    }

    pub(super) fn keep_flag(&self, tenant: &TenantId, enabled: bool) {
        self.flags.insert(tenant.clone(), (enabled, Instant::now()));
    }

    /// A tenant's policy, while it is trusted.
    pub(super) fn policy(&self, tenant: &TenantId) -> Option<PolicyState> {
        let found = self
            .policies
            .get(tenant)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(state, _)| state);
        self.observer
            .cache_lookup(CacheKind::Policies, found.is_some());
        found
    }

    /// The compiled policy kept for `tenant` if it is `version`, trusted or not: a policy read
    /// again whose version has not changed is not compiled again.
    pub(super) fn compiled_policy(
        &self,
        tenant: &TenantId,
        version: i64,
    ) -> Option<Arc<CompiledPolicy>> {
        match self.policies.get(tenant) {
            Some((PolicyState::Ready(policy), _)) if policy.version() == version => Some(policy),
            _ => None,
        }
    }

    pub(super) fn keep_policy(&self, tenant: &TenantId, state: PolicyState) {
        self.policies
            .insert(tenant.clone(), (state, Instant::now()));
    }

    /// Drops every kill switch and policy, so the next call reads them from the store. Runs
    /// stay: what a call reads of them (manifest, agent) never changes.
    pub(super) fn forget_configuration(&self) {
        self.flags.clear();
        self.policies.clear();
    }
}

/// A run cache key by reference. It hashes exactly as the owned `(TenantId, RunId)` does
/// (a tuple hashes its fields in order), which the cache requires of a borrowed key.
struct RunKey<'a> {
    tenant: &'a TenantId,
    run: &'a RunId,
}

impl Hash for RunKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.tenant.hash(state);
        self.run.hash(state);
    }
}

impl Equivalent<(TenantId, RunId)> for RunKey<'_> {
    fn equivalent(&self, key: &(TenantId, RunId)) -> bool {
        *self.tenant == key.0 && *self.run == key.1
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use toolgate_core::{AgentId, Timestamp};
    use toolgate_ledger::RunStatus;

    use super::*;

    fn run(tenant: &str, id: &str) -> Arc<RunRecord> {
        Arc::new(RunRecord {
            tenant: TenantId::new(tenant).unwrap(),
            id: RunId::new(id).unwrap(),
            agent: AgentId::new("support").unwrap(),
            manifest: Vec::new(),
            status: RunStatus::Active,
            calls_used: 0,
            max_calls: 10,
            pending_approvals: 0,
            created_at: Timestamp(1),
        })
    }

    #[test]
    fn a_borrowed_run_key_hashes_and_compares_as_the_owned_one() {
        let tenant = TenantId::new("acme").unwrap();
        let id = RunId::new("run_1").unwrap();
        let owned = (tenant.clone(), id.clone());
        let hasher = std::collections::hash_map::RandomState::new();
        let borrowed = RunKey {
            tenant: &tenant,
            run: &id,
        };
        assert_eq!(hasher.hash_one(&borrowed), hasher.hash_one(&owned));
        assert!(borrowed.equivalent(&owned));
        let other = RunId::new("run_2").unwrap();
        assert!(
            !RunKey {
                tenant: &tenant,
                run: &other
            }
            .equivalent(&owned)
        );
    }

    #[test]
    fn runs_are_found_by_tenant_and_id() {
        let caches = Caches::new(Duration::from_secs(60));
        caches.keep_run(run("acme", "run_1"));
        let acme = TenantId::new("acme").unwrap();
        let globex = TenantId::new("globex").unwrap();
        let id = RunId::new("run_1").unwrap();
        assert_eq!(
            caches.run(&acme, &id).map(|r| r.id.clone()),
            Some(id.clone())
        );
        assert!(caches.run(&globex, &id).is_none(), "another tenant's run");
    }

    #[test]
    fn a_full_cache_evicts_entries_one_by_one_instead_of_emptying() {
        const CAPACITY: usize = 64;
        let caches = Caches::with_capacities(Duration::from_secs(60), CAPACITY, 8, 8);
        let tenant = TenantId::new("acme").unwrap();
        let hot = RunId::new("run_hot").unwrap();
        caches.keep_run(run("acme", "run_hot"));
        for i in 0..10 * CAPACITY {
            caches.keep_run(run("acme", &format!("run_{i}")));
            // A run in use stays while the others come and go.
            assert!(
                caches.run(&tenant, &hot).is_some(),
                "evicted after {i} inserts"
            );
        }
        let kept = caches.runs.len();
        assert!(kept <= CAPACITY, "{kept} runs kept, capacity {CAPACITY}");
        assert!(kept >= CAPACITY / 2, "only {kept} runs kept: emptied");
    }

    #[test]
    fn flags_and_policies_are_trusted_for_the_ttl_only() {
        let tenant = TenantId::new("acme").unwrap();
        let trusting = Caches::new(Duration::from_secs(3600));
        // A TTL of zero trusts nothing: every entry is past it as soon as it is kept.
        let doubting = Caches::new(Duration::ZERO);
        for caches in [&trusting, &doubting] {
            caches.keep_flag(&tenant, true);
            caches.keep_policy(&tenant, PolicyState::Broken("broken".into()));
        }
        assert_eq!(trusting.flag(&tenant), Some(true));
        assert!(matches!(
            trusting.policy(&tenant),
            Some(PolicyState::Broken(_))
        ));
        assert_eq!(doubting.flag(&tenant), None);
        assert!(doubting.policy(&tenant).is_none());
    }

    #[test]
    fn a_policy_past_its_ttl_is_reused_while_its_version_stands() {
        let mut registry = toolgate_core::ToolRegistry::new();
        registry
            .register(Arc::new(crate::testkit::TestkitConnector))
            .unwrap();
        let catalog = crate::Catalog::new(registry).unwrap();
        let compiled =
            CompiledPolicy::compile(catalog.policy_schema(), catalog.default_policy(), 7).unwrap();
        let compiled = Arc::new(compiled);
        let tenant = TenantId::new("acme").unwrap();
        let caches = Caches::new(Duration::ZERO);
        caches.keep_policy(&tenant, PolicyState::Ready(Arc::clone(&compiled)));
        assert!(caches.policy(&tenant).is_none(), "past its TTL");
        let reused = caches.compiled_policy(&tenant, 7).expect("same version");
        assert!(Arc::ptr_eq(&reused, &compiled));
        assert!(
            caches.compiled_policy(&tenant, 8).is_none(),
            "a newer version"
        );
        caches.keep_policy(&tenant, PolicyState::Broken("broken".into()));
        assert!(caches.compiled_policy(&tenant, 7).is_none(), "a broken set");
    }

    #[test]
    fn forgetting_the_configuration_drops_flags_and_policies_but_keeps_runs() {
        let caches = Caches::new(Duration::from_secs(60));
        let tenant = TenantId::new("acme").unwrap();
        caches.keep_flag(&tenant, true);
        caches.keep_policy(&tenant, PolicyState::Broken("broken".into()));
        caches.keep_run(run("acme", "run_1"));
        caches.forget_configuration();
        assert_eq!(caches.flag(&tenant), None);
        assert!(caches.policy(&tenant).is_none());
        assert!(caches.run(&tenant, &RunId::new("run_1").unwrap()).is_some());
        caches.keep_flag(&tenant, false);
        assert_eq!(
            caches.flag(&tenant),
            Some(false),
            "kept again after forgetting"
        );
    }
}
