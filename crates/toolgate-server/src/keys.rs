//! Master keys and tenant credentials in the gateway: loading the key ring (key file or
//! `TOOLGATE_MASTER_KEYS`), online rotation, rewrap and retirement, and the ledger as the
//! vault's credential repository.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use tokio::sync::Mutex;
use toolgate_core::{Clock, SecretName, TenantId};
use toolgate_ledger::{
    Actor, CredentialKind, CredentialRecord, KeyChange, LedgerError, LedgerErrorKind, Store,
};
use toolgate_secrets::{
    CredentialRepository, KeyId, KeyRing, LiveKeyRing, Reference, SecretsError, StoredCredential,
    StoredKind, Vault,
};

use crate::files::{refuse_shared_file, write_private_file};

/// Where the key ring comes from, and whether it can change.
#[derive(Debug)]
enum KeySource {
    /// A file of `id=base64` lines this process may rewrite (0600).
    File(PathBuf),
    /// `TOOLGATE_MASTER_KEYS`: fixed for the life of the process.
    Environment,
}

/// Owns key ring changes so two admin calls never interleave them.
#[derive(Debug)]
pub(crate) struct KeyManager {
    source: KeySource,
    vault: Arc<Vault>,
    /// The ring the ledger MACs audit events with; replaced together with the vault's.
    chain_keys: Arc<LiveKeyRing>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    lock: Mutex<()>,
}

/// Reads the key ring for a command that must not create one (`ledger verify`, `ledger
/// checkpoint`): `TOOLGATE_MASTER_KEYS` when set, else the key file; `None` when neither
/// exists.
pub fn read_key_ring(key_file: &Path, inline: Option<&str>) -> anyhow::Result<Option<KeyRing>> {
    if inline.is_none() && !key_file.exists() {
        return Ok(None);
    }
    load_key_ring(key_file, inline).map(|(ring, _)| Some(ring))
}

/// Loads the key ring: `TOOLGATE_MASTER_KEYS` when set, else the key file, created with one
/// fresh key on first start. Returns the ring and whether a file was created.
pub(crate) fn load_key_ring(
    key_file: &Path,
    inline: Option<&str>,
) -> anyhow::Result<(KeyRing, bool)> {
    if let Some(inline) = inline {
        let entries = inline
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|entry| match entry.split_once('=') {
                Some((id, key)) => Ok((id.trim().to_owned(), key.trim().to_owned())),
                None => Err(anyhow::anyhow!(
                    "TOOLGATE_MASTER_KEYS: `{}` is not `id=base64-key`",
                    entry.split('=').next().unwrap_or_default()
                )),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ring = KeyRing::from_entries(entries).context("TOOLGATE_MASTER_KEYS")?;
        return Ok((ring, false));
    }
    if !key_file.exists() {
        let text = format!(
            "# toolgate master keys: one `id=base64` per line; the last one seals new credentials.\nk1={}\n",
            *KeyRing::generate_key()
        );
        write_private_file(key_file, &text)
            .with_context(|| format!("cannot create the key file {}", key_file.display()))?;
        let ring = KeyRing::parse(&text)?;
        return Ok((ring, true));
    }
    refuse_shared_file(key_file, "key file")?;
    let text = std::fs::read_to_string(key_file)
        .with_context(|| format!("cannot read the key file {}", key_file.display()))?;
    let ring = KeyRing::parse(&text).with_context(|| format!("key file {}", key_file.display()))?;
    Ok((ring, false))
}

/// Refuses to start when a stored credential was sealed with a key the ring lacks.
pub(crate) async fn check_keys_present(
    store: &Arc<dyn Store>,
    ring: &KeyRing,
) -> anyhow::Result<()> {
    for (key_id, count) in store.sealed_key_usage().await? {
        let present = KeyId::new(key_id.clone()).is_ok_and(|id| ring.contains(&id));
        if !present {
            bail!(
                "{count} stored credential(s) or pending call(s) are sealed with master key `{key_id}`, which is not loaded; add it back to the key file (or TOOLGATE_MASTER_KEYS) before starting"
            );
        }
    }
    Ok(())
}

impl KeyManager {
    pub(crate) fn new(
        key_file: &Path,
        from_environment: bool,
        vault: Arc<Vault>,
        chain_keys: Arc<LiveKeyRing>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
    ) -> KeyManager {
        let source = if from_environment {
            KeySource::Environment
        } else {
            KeySource::File(key_file.to_path_buf())
        };
        KeyManager {
            source,
            vault,
            chain_keys,
            store,
            clock,
            lock: Mutex::new(()),
        }
    }

    pub(crate) fn vault(&self) -> &Arc<Vault> {
        &self.vault
    }

    /// Seals and stores a credential value (audited with `actor`).
    pub(crate) async fn put_sealed(
        &self,
        mut record: CredentialRecord,
        plaintext: &str,
        actor: &Actor,
    ) -> Result<CredentialRecord, LedgerError> {
        // Sealing and storing happen under the lock, so a rewrap cannot miss this credential.
        let _guard = self.lock.lock().await;
        let sealed = self
            .vault
            .key_ring()
            .seal(&record.tenant, &record.name, plaintext);
        record.kind = CredentialKind::Sealed;
        record.value = sealed.ciphertext;
        record.key_id = Some(sealed.key_id.to_string());
        self.store.put_credential(record.clone(), actor).await?;
        self.vault.invalidate(&record.tenant, &record.name);
        Ok(record)
    }

    /// Stores a reference credential (audited with `actor`).
    pub(crate) async fn put_reference(
        &self,
        record: CredentialRecord,
        actor: &Actor,
    ) -> Result<(), LedgerError> {
        self.store.put_credential(record.clone(), actor).await?;
        self.vault.invalidate(&record.tenant, &record.name);
        Ok(())
    }

    /// Deletes a credential (audited with `actor`).
    pub(crate) async fn delete(
        &self,
        tenant: &TenantId,
        name: &SecretName,
        actor: &Actor,
    ) -> Result<(), LedgerError> {
        self.store.delete_credential(tenant, name, actor).await?;
        self.vault.invalidate(tenant, name);
        Ok(())
    }

    /// Adds a fresh key and makes it active; the file is rewritten atomically first, then the
    /// change is recorded on the system audit chain (see [`KeyManager::record`]).
    pub(crate) async fn rotate(&self, actor: &Actor) -> anyhow::Result<Arc<KeyRing>> {
        let _guard = self.lock.lock().await;
        let path = self.writable_file()?;
        let ring = self.vault.key_ring();
        let id = next_key_id(&ring);
        let key = KeyRing::generate_key();
        let rotated = ring.rotated(id.clone(), &key)?;
        let original = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let mut text = original.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("{id}={}\n", *key));
        replace_file(path, &text)?;
        let change = KeyChange::Rotated {
            key_id: id.to_string(),
            previous: ring.active().to_string(),
        };
        self.record(path, &original, change, actor).await?;
        self.chain_keys.set(rotated.clone());
        self.vault.set_key_ring(rotated);
        Ok(self.vault.key_ring())
    }

    /// Records a key file change on the system audit chain. The file and the ledger cannot
    /// commit together, so the file is changed first and put back when the event cannot be
    /// committed: the ring in use changes only once both are done (callers hold the lock, so
    /// nothing was sealed with a key that is being put back). Only a crash between the two
    /// writes can leave the file changed without its event.
    async fn record(
        &self,
        path: &Path,
        original: &str,
        change: KeyChange,
        actor: &Actor,
    ) -> anyhow::Result<()> {
        let Err(error) = self.store.record_key_change(change, actor).await else {
            return Ok(());
        };
        replace_file(path, original).context(
            "the key change could not be audited and the key file could not be put back",
        )?;
        Err(anyhow::Error::new(error)
            .context("the key change could not be audited, so it was undone"))
    }

    /// Re-seals every credential not under the active key. Calls go on meanwhile: each
    /// credential is replaced only if unchanged since it was read.
    /// Each re-sealed credential gets its own event on its tenant's chain, and the whole run
    /// one on the system chain.
    pub(crate) async fn rewrap(
        &self,
        actor: &Actor,
        engine: &toolgate_engine::Engine,
    ) -> anyhow::Result<(u64, u64)> {
        let _guard = self.lock.lock().await;
        let ring = self.vault.key_ring();
        let active = ring.active().to_string();
        let (mut rewrapped, mut skipped) = (0, 0);
        loop {
            let batch = self.store.list_sealed_not_under(&active, 200).await?;
            if batch.is_empty() {
                break;
            }
            let mut progressed = false;
            for record in batch {
                let key_id = KeyId::new(record.key_id.clone().unwrap_or_default())?;
                let sealed = toolgate_secrets::SealedSecret {
                    key_id,
                    ciphertext: record.value.clone(),
                };
                let Some(new) = ring.rewrap(&record.tenant, &record.name, &sealed)? else {
                    continue;
                };
                let replaced = self
                    .store
                    .replace_sealed(
                        &record.tenant,
                        &record.name,
                        &record.value,
                        &new.ciphertext,
                        new.key_id.as_str(),
                        &Actor::token(actor.token_id.clone(), self.clock.now()),
                    )
                    .await?;
                if replaced {
                    rewrapped += 1;
                    progressed = true;
                    self.vault.invalidate(&record.tenant, &record.name);
                } else {
                    skipped += 1;
                }
            }
            if !progressed {
                break;
            }
        }
        // The arguments of suspended calls are sealed with the same keys; the engine, which
        // seals them, re-seals them.
        let (pending_rewrapped, pending_skipped) = engine.rewrap_pending_arguments(&active).await?;
        rewrapped += pending_rewrapped;
        skipped += pending_skipped;
        let change = KeyChange::Rewrapped {
            active_key_id: active,
            rewrapped,
            skipped,
        };
        let actor = Actor::token(actor.token_id.clone(), self.clock.now());
        self.store.record_key_change(change, &actor).await?;
        Ok((rewrapped, skipped))
    }

    /// Removes a key; refused while a credential is sealed with it, or for the active key.
    /// Recorded on the system audit chain like a rotation.
    pub(crate) async fn retire(&self, id: &str, actor: &Actor) -> anyhow::Result<Arc<KeyRing>> {
        let _guard = self.lock.lock().await;
        let path = self.writable_file()?;
        let key_id = KeyId::new(id)?;
        // The ring refuses the active key and unknown ids first, with its own message.
        let retired = self.vault.key_ring().retired(&key_id)?;
        let in_use = self
            .store
            .sealed_key_usage()
            .await?
            .into_iter()
            .find(|(key, _)| key == id)
            .map_or(0, |(_, count)| count);
        if in_use > 0 {
            bail!(
                "key `{id}` still seals {in_use} value(s) (credentials, arguments of pending calls); run a rewrap first"
            );
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let kept: String = text
            .lines()
            .filter(|line| {
                line.split_once('=')
                    .is_none_or(|(line_id, _)| line_id.trim() != id)
            })
            .map(|line| format!("{line}\n"))
            .collect();
        replace_file(path, &kept)?;
        let change = KeyChange::Retired {
            key_id: id.to_owned(),
        };
        self.record(path, &text, change, actor).await?;
        self.chain_keys.set(retired.clone());
        self.vault.set_key_ring(retired);
        Ok(self.vault.key_ring())
    }

    fn writable_file(&self) -> anyhow::Result<&Path> {
        match &self.source {
            KeySource::File(path) => Ok(path),
            KeySource::Environment => bail!(
                "the master keys come from TOOLGATE_MASTER_KEYS, so they cannot change online; change the variable and restart"
            ),
        }
    }
}

/// `k<n+1>` after the highest `k<n>` in the ring (other ids are left alone).
fn next_key_id(ring: &KeyRing) -> KeyId {
    let highest = ring
        .key_ids()
        .filter_map(|id| id.as_str().strip_prefix('k')?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    KeyId::new(format!("k{}", highest + 1)).expect("k<number> is a valid key id")
}

/// Writes `text` to a private temporary file beside `path`, then renames it over `path`, so
/// a crash leaves the old or the new key file, never half of one.
fn replace_file(path: &Path, text: &str) -> anyhow::Result<()> {
    let temporary = path.with_extension("tmp");
    write_private_file(&temporary, text)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, path)
        .with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}

/// The ledger as the vault's credential repository.
#[derive(Debug)]
pub(crate) struct LedgerCredentials(pub(crate) Arc<dyn Store>);

#[async_trait::async_trait]
impl CredentialRepository for LedgerCredentials {
    async fn get(
        &self,
        tenant: &TenantId,
        name: &SecretName,
    ) -> Result<Option<StoredCredential>, SecretsError> {
        // The reason reaches the agent (in CREDENTIALS_UNAVAILABLE): it names no SQL; the
        // detail goes to the log.
        let record = self.0.get_credential(tenant, name).await.map_err(|error| {
            let detail = error.to_string();
            let detail = toolgate_core::Redactor::new()
                .redact_text(&detail)
                .into_owned();
            tracing::warn!(%tenant, secret = %name, error = %detail, "reading a credential failed");
            SecretsError::Repository(match error.kind() {
                LedgerErrorKind::Transient => "the ledger is unavailable at the moment".to_owned(),
                _ => "the ledger failed; the gateway log has the detail".to_owned(),
            })
        })?;
        let Some(record) = record else {
            return Ok(None);
        };
        let kind = match record.kind {
            CredentialKind::Sealed => StoredKind::Sealed {
                ciphertext: record.value,
            },
            CredentialKind::Reference => StoredKind::Reference(Reference::parse(&record.value)?),
        };
        Ok(Some(StoredCredential {
            tenant: record.tenant,
            name: record.name,
            kind,
        }))
    }
}
