//! Resolving a tenant's secrets: the repository holds sealed credentials and references, the
//! key ring opens them, a TTL cache keeps resolved values briefly.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use toolgate_core::{SecretError, SecretName, SecretSource, SecretValue, Secrets, TenantId};

use crate::error::SecretsError;
use crate::keyring::KeyRing;
use crate::reference::{Environment, Reference};

/// How a stored credential holds its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredKind {
    /// `tgs1.<key id>.<base64>` from [`KeyRing::seal`].
    Sealed {
        /// The sealed text.
        ciphertext: String,
    },
    /// Read at use.
    Reference(Reference),
}

/// A credential as the repository returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCredential {
    /// The tenant owning it.
    pub tenant: TenantId,
    /// Its name, e.g. `slack_default`.
    pub name: SecretName,
    /// Sealed value or reference.
    pub kind: StoredKind,
}

/// Where credentials are stored (the ledger's `tenant_tool_secrets` table in the gateway).
#[async_trait::async_trait]
pub trait CredentialRepository: Send + Sync + fmt::Debug + 'static {
    /// The credential `name` of `tenant`, if any.
    async fn get(
        &self,
        tenant: &TenantId,
        name: &SecretName,
    ) -> Result<Option<StoredCredential>, SecretsError>;
}

/// Resolves secrets for the engine, caching resolved values for a TTL (default 300 s).
pub struct Vault {
    repository: Arc<dyn CredentialRepository>,
    ring: RwLock<Arc<KeyRing>>,
    environment: Arc<dyn Environment>,
    ttl: Duration,
    cache: Mutex<HashMap<(TenantId, SecretName), (SecretValue, Instant)>>,
}

impl fmt::Debug for Vault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vault")
            .field("ttl", &self.ttl)
            .field("cached", &self.cache.lock().map(|c| c.len()).unwrap_or(0))
            .finish_non_exhaustive()
    }
}

impl Vault {
    /// The default cache lifetime.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

    /// A vault over `repository` with the keys of `ring`.
    pub fn new(
        repository: Arc<dyn CredentialRepository>,
        ring: KeyRing,
        environment: Arc<dyn Environment>,
    ) -> Vault {
        Vault {
            repository,
            ring: RwLock::new(Arc::new(ring)),
            environment,
            ttl: Vault::DEFAULT_TTL,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Sets the cache lifetime (zero disables caching).
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Vault {
        self.ttl = ttl;
        self
    }

    /// The key ring in use.
    pub fn key_ring(&self) -> Arc<KeyRing> {
        Arc::clone(&self.ring.read().expect("key ring lock"))
    }

    /// Replaces the key ring (rotation, retirement) and empties the cache.
    pub fn set_key_ring(&self, ring: KeyRing) {
        *self.ring.write().expect("key ring lock") = Arc::new(ring);
        self.cache.lock().expect("secret cache lock").clear();
    }

    /// Forgets every cached value (after another process changed credentials).
    pub fn invalidate_all(&self) {
        self.cache.lock().expect("secret cache lock").clear();
    }

    /// Forgets a cached value (after an update or delete).
    pub fn invalidate(&self, tenant: &TenantId, name: &SecretName) {
        self.cache
            .lock()
            .expect("secret cache lock")
            .remove(&(tenant.clone(), name.clone()));
    }

    /// One secret of one tenant.
    pub async fn resolve_one(
        &self,
        tenant: &TenantId,
        name: &SecretName,
    ) -> Result<Option<SecretValue>, SecretsError> {
        let key = (tenant.clone(), name.clone());
        if let Some((value, expires)) = self.cache.lock().expect("secret cache lock").get(&key)
            && Instant::now() < *expires
        {
            return Ok(Some(value.clone()));
        }
        let Some(stored) = self.repository.get(tenant, name).await? else {
            return Ok(None);
        };
        if stored.tenant != *tenant || stored.name != *name {
            return Err(SecretsError::Repository(format!(
                "the repository answered `{}` of another tenant or name",
                name
            )));
        }
        let value = match &stored.kind {
            StoredKind::Sealed { ciphertext } => self.key_ring().open(tenant, name, ciphertext)?,
            StoredKind::Reference(Reference::Env(var)) => {
                let raw = self
                    .environment
                    .var(var)
                    .ok_or_else(|| SecretsError::Unresolved {
                        name: name.to_string(),
                        reason: format!("environment variable {var} is not set"),
                    })?;
                SecretValue::new(raw)
            }
            StoredKind::Reference(Reference::File(path)) => {
                let raw =
                    self.environment
                        .read_file(path)
                        .map_err(|e| SecretsError::Unresolved {
                            name: name.to_string(),
                            reason: format!("cannot read {}: {}", path.display(), e.kind()),
                        })?;
                SecretValue::new(raw.trim_end_matches(['\n', '\r']))
            }
        };
        if !self.ttl.is_zero() {
            self.cache
                .lock()
                .expect("secret cache lock")
                .insert(key, (value.clone(), Instant::now() + self.ttl));
        }
        Ok(Some(value))
    }
}

/// Seals with whatever key ring is current, so sealing follows online rotation.
impl toolgate_core::Sealer for Vault {
    fn seal(&self, context: &[&str], plaintext: &[u8]) -> String {
        toolgate_core::Sealer::seal(self.key_ring().as_ref(), context, plaintext)
    }

    fn open(
        &self,
        context: &[&str],
        sealed: &str,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, toolgate_core::SealError> {
        toolgate_core::Sealer::open(self.key_ring().as_ref(), context, sealed)
    }

    fn key_id_of(&self, sealed: &str) -> Option<String> {
        toolgate_core::Sealer::key_id_of(self.key_ring().as_ref(), sealed)
    }
}

#[async_trait::async_trait]
impl SecretSource for Vault {
    async fn resolve(
        &self,
        tenant: &TenantId,
        names: &[SecretName],
    ) -> Result<Secrets, SecretError> {
        let mut secrets = Secrets::empty();
        for name in names {
            match self.resolve_one(tenant, name).await {
                Ok(Some(value)) => secrets.insert(name.clone(), value),
                Ok(None) => return Err(SecretError::Missing(name.clone())),
                Err(err) => {
                    return Err(SecretError::Unavailable {
                        name: name.clone(),
                        reason: err.to_string(),
                    });
                }
            }
        }
        Ok(secrets)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Debug, Default)]
    struct MapRepository {
        rows: Mutex<HashMap<(TenantId, SecretName), StoredKind>>,
        reads: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl CredentialRepository for MapRepository {
        async fn get(
            &self,
            tenant: &TenantId,
            name: &SecretName,
        ) -> Result<Option<StoredCredential>, SecretsError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let rows = self.rows.lock().unwrap();
            Ok(rows
                .get(&(tenant.clone(), name.clone()))
                .map(|kind| StoredCredential {
                    tenant: tenant.clone(),
                    name: name.clone(),
                    kind: kind.clone(),
                }))
        }
    }

    #[derive(Debug, Default)]
    struct FakeEnvironment(HashMap<String, String>);

    impl Environment for FakeEnvironment {
        fn var(&self, name: &str) -> Option<String> {
            self.0.get(name).cloned()
        }
        fn read_file(&self, path: &std::path::Path) -> std::io::Result<String> {
            std::fs::read_to_string(path)
        }
    }

    fn setup() -> (Arc<MapRepository>, Vault, TenantId, TenantId, SecretName) {
        let ring = KeyRing::from_entries(vec![("k1".into(), KeyRing::generate_key().to_string())])
            .unwrap();
        let repository = Arc::new(MapRepository::default());
        let env = FakeEnvironment(
            [("ACME_TOKEN".to_owned(), "from-env".to_owned())]
                .into_iter()
                .collect(),
        );
        let vault = Vault::new(
            Arc::clone(&repository) as Arc<dyn CredentialRepository>,
            ring,
            Arc::new(env),
        );
        (
            repository,
            vault,
            TenantId::new("acme").unwrap(),
            TenantId::new("globex").unwrap(),
            SecretName::new("slack_default").unwrap(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn cache_expires_and_is_invalidated() {
        let (repository, vault, acme, _, name) = setup();
        let sealed = vault.key_ring().seal(&acme, &name, "v1");
        repository.rows.lock().unwrap().insert(
            (acme.clone(), name.clone()),
            StoredKind::Sealed {
                ciphertext: sealed.ciphertext,
            },
        );
        assert_eq!(
            vault
                .resolve_one(&acme, &name)
                .await
                .unwrap()
                .unwrap()
                .expose(),
            "v1"
        );
        assert_eq!(
            vault
                .resolve_one(&acme, &name)
                .await
                .unwrap()
                .unwrap()
                .expose(),
            "v1"
        );
        assert_eq!(
            repository.reads.load(Ordering::SeqCst),
            1,
            "second read from the cache"
        );
        tokio::time::advance(Vault::DEFAULT_TTL + Duration::from_secs(1)).await;
        vault.resolve_one(&acme, &name).await.unwrap();
        assert_eq!(repository.reads.load(Ordering::SeqCst), 2, "expired");
        let updated = vault.key_ring().seal(&acme, &name, "v2");
        repository.rows.lock().unwrap().insert(
            (acme.clone(), name.clone()),
            StoredKind::Sealed {
                ciphertext: updated.ciphertext,
            },
        );
        assert_eq!(
            vault
                .resolve_one(&acme, &name)
                .await
                .unwrap()
                .unwrap()
                .expose(),
            "v1",
            "still cached"
        );
        vault.invalidate(&acme, &name);
        assert_eq!(
            vault
                .resolve_one(&acme, &name)
                .await
                .unwrap()
                .unwrap()
                .expose(),
            "v2"
        );
    }

    #[tokio::test]
    async fn a_tenant_never_receives_another_tenants_secret() {
        let (repository, vault, acme, globex, name) = setup();
        let sealed = vault.key_ring().seal(&acme, &name, "acme-only");
        // Even a ciphertext copied into globex's row does not open for globex.
        repository.rows.lock().unwrap().insert(
            (acme.clone(), name.clone()),
            StoredKind::Sealed {
                ciphertext: sealed.ciphertext.clone(),
            },
        );
        repository.rows.lock().unwrap().insert(
            (globex.clone(), name.clone()),
            StoredKind::Sealed {
                ciphertext: sealed.ciphertext,
            },
        );
        assert!(
            vault
                .resolve(&acme, std::slice::from_ref(&name))
                .await
                .is_ok()
        );
        let err = vault
            .resolve(&globex, std::slice::from_ref(&name))
            .await
            .unwrap_err();
        assert!(matches!(err, SecretError::Unavailable { .. }), "{err}");
        let other = SecretName::new("other").unwrap();
        assert_eq!(
            vault
                .resolve(&acme, std::slice::from_ref(&other))
                .await
                .unwrap_err(),
            SecretError::Missing(other)
        );
    }

    #[tokio::test]
    async fn references_resolve_at_use() {
        let (repository, vault, acme, _, name) = setup();
        repository.rows.lock().unwrap().insert(
            (acme.clone(), name.clone()),
            StoredKind::Reference(Reference::Env("ACME_TOKEN".into())),
        );
        assert_eq!(
            vault
                .resolve_one(&acme, &name)
                .await
                .unwrap()
                .unwrap()
                .expose(),
            "from-env"
        );
        let missing = SecretName::new("missing_env").unwrap();
        repository.rows.lock().unwrap().insert(
            (acme.clone(), missing.clone()),
            StoredKind::Reference(Reference::Env("NOPE".into())),
        );
        let err = vault
            .resolve_one(&acme, &missing)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("NOPE") && err.contains("not set"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "from-file\n").unwrap();
        let file = SecretName::new("file_secret").unwrap();
        repository.rows.lock().unwrap().insert(
            (acme.clone(), file.clone()),
            StoredKind::Reference(Reference::File(path)),
        );
        assert_eq!(
            vault
                .resolve_one(&acme, &file)
                .await
                .unwrap()
                .unwrap()
                .expose(),
            "from-file"
        );
    }

    #[tokio::test]
    async fn rotation_empties_the_cache_and_retired_keys_stop_opening() {
        let (repository, vault, acme, _, name) = setup();
        let sealed = vault.key_ring().seal(&acme, &name, "value");
        repository.rows.lock().unwrap().insert(
            (acme.clone(), name.clone()),
            StoredKind::Sealed {
                ciphertext: sealed.ciphertext,
            },
        );
        vault.resolve_one(&acme, &name).await.unwrap();
        let rotated = vault
            .key_ring()
            .rotated(crate::KeyId::new("k2").unwrap(), &KeyRing::generate_key())
            .unwrap();
        let retired = rotated.retired(&crate::KeyId::new("k1").unwrap()).unwrap();
        vault.set_key_ring(retired);
        let err = vault.resolve_one(&acme, &name).await.unwrap_err();
        assert!(
            matches!(err, SecretsError::UnknownKey(ref id) if id == "k1"),
            "{err}"
        );
    }
}
