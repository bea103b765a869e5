//! Master keys and AES-256-GCM sealing.
//!
//! A sealed secret is the text `tgs1.<key id>.<base64(nonce ‖ ciphertext ‖ tag)>`: the key id
//! travels inside every ciphertext, and a fresh random 96-bit nonce is drawn per encryption.
//! The associated data is `toolgate-secret-v1 ‖ tenant ‖ name ‖ key id` (NUL-separated), so a
//! ciphertext moved to another tenant, another secret name or relabelled with another key id
//! fails authentication.

use std::collections::BTreeMap;
use std::fmt;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;
use toolgate_core::{SecretName, SecretValue, TenantId};
use zeroize::Zeroizing;

use crate::error::SecretsError;

const PREFIX: &str = "tgs1";
const AAD_LABEL: &[u8] = b"toolgate-secret-v1";
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// A master key's id: 1 to 64 of `A-Z a-z 0-9 _ -`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(String);

impl KeyId {
    /// Validates an id.
    pub fn new(id: impl Into<String>) -> Result<KeyId, SecretsError> {
        let id = id.into();
        let valid = !id.is_empty()
            && id.len() <= 64
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if valid {
            Ok(KeyId(id))
        } else {
            Err(SecretsError::InvalidKey {
                id: id.chars().take(64).collect(),
                reason: "a key id is 1 to 64 of A-Z, a-z, 0-9, _ and -".into(),
            })
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A sealed credential as stored: the key id (also inside the text) and the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedSecret {
    /// The key it was sealed with.
    pub key_id: KeyId,
    /// `tgs1.<key id>.<base64>`.
    pub ciphertext: String,
}

/// The master keys: one active key that seals, older ones that still open until retired.
#[derive(Clone)]
pub struct KeyRing {
    keys: BTreeMap<KeyId, MasterKey>,
    active: KeyId,
}

/// A master key and its cipher, made once: expanding the AES key schedule and the GHASH key
/// on every seal and open cost more than sealing a short answer. Both are zeroed when dropped
/// (`aes-gcm`'s `zeroize` feature), as the key's bytes are.
#[derive(Clone)]
struct MasterKey {
    bytes: Zeroizing<[u8; 32]>,
    cipher: Aes256Gcm,
}

impl MasterKey {
    fn new(bytes: Zeroizing<[u8; 32]>) -> MasterKey {
        let cipher = Aes256Gcm::new((&*bytes).into());
        MasterKey { bytes, cipher }
    }
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .field("active", &self.active)
            .finish()
    }
}

impl KeyRing {
    /// Parses a key file: one `key-id=base64` per line (32 bytes each), `#` comments and blank
    /// lines ignored. The last key listed is the active one, so rotating appends a line.
    pub fn parse(text: &str) -> Result<KeyRing, SecretsError> {
        let mut entries = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((id, key)) = line.split_once('=') else {
                return Err(SecretsError::InvalidKeyRing(format!(
                    "line {} is not `key-id=base64-key`",
                    number + 1
                )));
            };
            entries.push((id.trim().to_owned(), key.trim().to_owned()));
        }
        KeyRing::from_entries(entries)
    }

    /// Builds a ring from `(id, base64 key)` pairs; the last is active.
    pub fn from_entries(entries: Vec<(String, String)>) -> Result<KeyRing, SecretsError> {
        let mut keys = BTreeMap::new();
        let mut active = None;
        for (id, encoded) in entries {
            let id = KeyId::new(id)?;
            let key = MasterKey::new(decode_key(&id, &encoded)?);
            if keys.insert(id.clone(), key).is_some() {
                return Err(SecretsError::InvalidKeyRing(format!(
                    "key `{id}` is listed twice"
                )));
            }
            active = Some(id);
        }
        let active = active.ok_or_else(|| SecretsError::InvalidKeyRing("no keys".into()))?;
        Ok(KeyRing { keys, active })
    }

    /// A new random key, base64-encoded, for an operator to add to the key file.
    pub fn generate_key() -> Zeroizing<String> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        rand::rng().fill_bytes(bytes.as_mut());
        Zeroizing::new(STANDARD.encode(bytes.as_ref()))
    }

    /// The key that seals.
    pub fn active(&self) -> &KeyId {
        &self.active
    }

    /// Every key id held.
    pub fn key_ids(&self) -> impl Iterator<Item = &KeyId> {
        self.keys.keys()
    }

    /// The raw bytes of master key `id`, for deriving keys of other uses from it.
    pub(crate) fn key_bytes(&self, id: &str) -> Option<&[u8; 32]> {
        self.keys
            .iter()
            .find(|(key_id, _)| key_id.as_str() == id)
            .map(|(_, key)| &*key.bytes)
    }

    /// Whether the ring holds `id`.
    pub fn contains(&self, id: &KeyId) -> bool {
        self.keys.contains_key(id)
    }

    /// A ring with `id` added and made active (rotation).
    pub fn rotated(&self, id: KeyId, encoded: &str) -> Result<KeyRing, SecretsError> {
        if self.keys.contains_key(&id) {
            return Err(SecretsError::InvalidKeyRing(format!(
                "key `{id}` already exists"
            )));
        }
        let key = MasterKey::new(decode_key(&id, encoded)?);
        let mut ring = self.clone();
        ring.keys.insert(id.clone(), key);
        ring.active = id;
        Ok(ring)
    }

    /// A ring without `id` (retirement): credentials sealed with it no longer open. The active
    /// key cannot be retired.
    pub fn retired(&self, id: &KeyId) -> Result<KeyRing, SecretsError> {
        if *id == self.active {
            return Err(SecretsError::InvalidKeyRing(format!(
                "key `{id}` is the active key; rotate to a new key before retiring it"
            )));
        }
        if !self.keys.contains_key(id) {
            return Err(SecretsError::UnknownKey(id.to_string()));
        }
        let mut ring = self.clone();
        ring.keys.remove(id);
        Ok(ring)
    }

    /// Seals `plaintext` for `(tenant, name)` under the active key.
    pub fn seal(&self, tenant: &TenantId, name: &SecretName, plaintext: &str) -> SealedSecret {
        let ciphertext = self.seal_parts(
            AAD_LABEL,
            &[tenant.as_str(), name.as_str()],
            plaintext.as_bytes(),
        );
        SealedSecret {
            key_id: self.active.clone(),
            ciphertext,
        }
    }

    /// Opens a sealed credential of `(tenant, name)`.
    pub fn open(
        &self,
        tenant: &TenantId,
        name: &SecretName,
        ciphertext: &str,
    ) -> Result<SecretValue, SecretsError> {
        let decrypt_error = || SecretsError::Decrypt {
            name: name.to_string(),
        };
        let plaintext = self
            .open_parts(AAD_LABEL, &[tenant.as_str(), name.as_str()], ciphertext)
            .map_err(|failure| match failure {
                OpenFailure::UnknownKey(id) => SecretsError::UnknownKey(id),
                OpenFailure::Invalid => decrypt_error(),
            })?;
        let text = std::str::from_utf8(&plaintext).map_err(|_| decrypt_error())?;
        Ok(SecretValue::new(text))
    }

    /// Seals `plaintext` under the active key with the associated data
    /// `label ‖ parts… ‖ key id` (NUL-separated).
    fn seal_parts(&self, label: &[u8], parts: &[&str], plaintext: &[u8]) -> String {
        let cipher = &self.keys[&self.active].cipher;
        let mut nonce_bytes = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce_bytes);
        let nonce = Nonce::from(nonce_bytes);
        let aad = associated_data(label, parts, &self.active);
        let sealed = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad: &aad,
                },
            )
            .expect("AES-GCM encryption of an in-memory buffer cannot fail");
        let mut blob = Vec::with_capacity(NONCE_LEN + sealed.len());
        blob.extend_from_slice(&nonce_bytes);
        blob.extend_from_slice(&sealed);
        // Written into one string: `format!` of an encoded copy made two more.
        let id = self.active.as_str();
        let mut text =
            String::with_capacity(PREFIX.len() + id.len() + 2 + blob.len().div_ceil(3) * 4);
        text.push_str(PREFIX);
        text.push('.');
        text.push_str(id);
        text.push('.');
        STANDARD.encode_string(&blob, &mut text);
        text
    }

    /// Opens what [`KeyRing::seal_parts`] sealed with the same label and parts.
    fn open_parts(
        &self,
        label: &[u8],
        parts: &[&str],
        ciphertext: &str,
    ) -> Result<Zeroizing<Vec<u8>>, OpenFailure> {
        let mut fields = ciphertext.splitn(3, '.');
        let (Some(PREFIX), Some(key_id), Some(encoded)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(OpenFailure::Invalid);
        };
        let key_id = KeyId::new(key_id).map_err(|_| OpenFailure::Invalid)?;
        let key = self
            .keys
            .get(&key_id)
            .ok_or_else(|| OpenFailure::UnknownKey(key_id.to_string()))?;
        let blob = STANDARD.decode(encoded).map_err(|_| OpenFailure::Invalid)?;
        if blob.len() < NONCE_LEN + TAG_LEN {
            return Err(OpenFailure::Invalid);
        }
        let (nonce_bytes, sealed) = blob.split_at(NONCE_LEN);
        let nonce_array: [u8; NONCE_LEN] =
            nonce_bytes.try_into().map_err(|_| OpenFailure::Invalid)?;
        let aad = associated_data(label, parts, &key_id);
        key.cipher
            .decrypt(
                &Nonce::from(nonce_array),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map(Zeroizing::new)
            .map_err(|_| OpenFailure::Invalid)
    }

    /// Re-seals under the active key; `None` when it already is.
    pub fn rewrap(
        &self,
        tenant: &TenantId,
        name: &SecretName,
        sealed: &SealedSecret,
    ) -> Result<Option<SealedSecret>, SecretsError> {
        if sealed.key_id == self.active {
            return Ok(None);
        }
        let plaintext = self.open(tenant, name, &sealed.ciphertext)?;
        Ok(Some(self.seal(tenant, name, plaintext.expose())))
    }
}

fn decode_key(id: &KeyId, encoded: &str) -> Result<Zeroizing<[u8; 32]>, SecretsError> {
    let bytes =
        Zeroizing::new(
            STANDARD
                .decode(encoded.trim())
                .map_err(|_| SecretsError::InvalidKey {
                    id: id.to_string(),
                    reason: "not valid base64".into(),
                })?,
        );
    let array: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| SecretsError::InvalidKey {
            id: id.to_string(),
            reason: format!("a master key is 32 bytes, this one is {}", bytes.len()),
        })?;
    Ok(Zeroizing::new(array))
}

fn associated_data(label: &[u8], parts: &[&str], key_id: &KeyId) -> Vec<u8> {
    let mut aad = Vec::with_capacity(64);
    aad.extend_from_slice(label);
    aad.push(0);
    for part in parts.iter().chain([&key_id.as_str()]) {
        aad.extend_from_slice(part.as_bytes());
        aad.push(0);
    }
    aad
}

/// Why [`KeyRing::open_parts`] failed.
enum OpenFailure {
    UnknownKey(String),
    Invalid,
}

/// Sealing of values other than credentials (a call's full answer): the associated data
/// starts with its own label, so a credential's ciphertext never opens as one of these, nor
/// the other way round.
const RECORD_LABEL: &[u8] = b"toolgate-record-v1";

impl toolgate_core::Sealer for KeyRing {
    fn seal(&self, context: &[&str], plaintext: &[u8]) -> String {
        self.seal_parts(RECORD_LABEL, context, plaintext)
    }

    fn open(
        &self,
        context: &[&str],
        sealed: &str,
    ) -> Result<Zeroizing<Vec<u8>>, toolgate_core::SealError> {
        self.open_parts(RECORD_LABEL, context, sealed)
            .map_err(|failure| match failure {
                OpenFailure::UnknownKey(id) => toolgate_core::SealError::UnknownKey(id),
                OpenFailure::Invalid => toolgate_core::SealError::Invalid,
            })
    }

    fn key_id_of(&self, sealed: &str) -> Option<String> {
        let mut fields = sealed.splitn(3, '.');
        match (fields.next(), fields.next(), fields.next()) {
            (Some(PREFIX), Some(key_id), Some(_)) if KeyId::new(key_id).is_ok() => {
                Some(key_id.to_owned())
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(ids: &[&str]) -> KeyRing {
        let entries = ids
            .iter()
            .map(|id| ((*id).to_owned(), KeyRing::generate_key().to_string()))
            .collect();
        KeyRing::from_entries(entries).unwrap()
    }

    fn ids() -> (TenantId, TenantId, SecretName, SecretName) {
        (
            TenantId::new("acme").unwrap(),
            TenantId::new("globex").unwrap(),
            SecretName::new("slack_default").unwrap(),
            SecretName::new("shopify_default").unwrap(),
        )
    }

    #[test]
    fn records_open_only_for_their_own_context() {
        use toolgate_core::{SealError, Sealer};
        let keys = ring(&["k1"]);
        let ring = &keys;
        let sealed = Sealer::seal(ring, &["acme", "tc_1"], b"{\"ok\":true}");
        assert!(sealed.starts_with("tgs1.k1."), "{sealed}");
        let opened = Sealer::open(ring, &["acme", "tc_1"], &sealed).unwrap();
        assert_eq!(opened.as_slice(), b"{\"ok\":true}");
        for context in [
            &["globex", "tc_1"][..],
            &["acme", "tc_2"],
            &["acme"],
            &["acmetc_1"],
        ] {
            assert_eq!(
                Sealer::open(ring, context, &sealed),
                Err(SealError::Invalid)
            );
        }
        // A credential's ciphertext is not a record, even with the same parts.
        let (tenant, _, name, _) = ids();
        let credential = ring.seal(&tenant, &name, "xoxb-1");
        assert_eq!(
            Sealer::open(
                ring,
                &[tenant.as_str(), name.as_str()],
                &credential.ciphertext
            ),
            Err(SealError::Invalid)
        );
        let other = super::tests::ring(&["k2"]);
        assert_eq!(
            Sealer::open(&other, &["acme", "tc_1"], &sealed),
            Err(SealError::UnknownKey("k1".into()))
        );
    }

    #[test]
    fn seal_and_open_round_trip_with_fresh_nonces() {
        let ring = ring(&["k1"]);
        let (acme, _, slack, _) = ids();
        let a = ring.seal(&acme, &slack, "xoxb-1-secret");
        let b = ring.seal(&acme, &slack, "xoxb-1-secret");
        assert_ne!(a.ciphertext, b.ciphertext, "a fresh nonce per encryption");
        assert!(a.ciphertext.starts_with("tgs1.k1."));
        assert!(!a.ciphertext.contains("xoxb"));
        assert_eq!(
            ring.open(&acme, &slack, &a.ciphertext).unwrap().expose(),
            "xoxb-1-secret"
        );
    }

    #[test]
    fn tampering_or_moving_a_ciphertext_fails() {
        let ring = ring(&["k1"]);
        let (acme, globex, slack, shopify) = ids();
        let sealed = ring.seal(&acme, &slack, "value");
        let encoded = sealed.ciphertext.rsplit('.').next().unwrap();
        let mut blob = STANDARD.decode(encoded).unwrap();
        for index in [0, NONCE_LEN, blob.len() - 1] {
            blob[index] ^= 0x01;
            let flipped = format!("tgs1.k1.{}", STANDARD.encode(&blob));
            assert!(
                matches!(
                    ring.open(&acme, &slack, &flipped),
                    Err(SecretsError::Decrypt { .. })
                ),
                "byte {index}"
            );
            blob[index] ^= 0x01;
        }
        assert!(
            matches!(
                ring.open(&globex, &slack, &sealed.ciphertext),
                Err(SecretsError::Decrypt { .. })
            ),
            "other tenant"
        );
        assert!(
            matches!(
                ring.open(&acme, &shopify, &sealed.ciphertext),
                Err(SecretsError::Decrypt { .. })
            ),
            "other name"
        );
        for garbage in [
            "",
            "tgs1",
            "tgs1.k1",
            "tgs1.k1.!!!",
            "tgs2.k1.AAAA",
            "tgs1.k1.AAAA",
        ] {
            assert!(ring.open(&acme, &slack, garbage).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn relabelling_the_key_id_fails() {
        let two = ring(&["k1", "k2"]);
        let (acme, _, slack, _) = ids();
        let sealed = two.seal(&acme, &slack, "value");
        let relabelled = sealed.ciphertext.replacen("tgs1.k2.", "tgs1.k1.", 1);
        assert!(two.open(&acme, &slack, &relabelled).is_err());
    }

    #[test]
    fn rotate_rewrap_retire() {
        let one = ring(&["k1"]);
        let (acme, _, slack, _) = ids();
        let old = one.seal(&acme, &slack, "value");
        let two = one
            .rotated(KeyId::new("k2").unwrap(), &KeyRing::generate_key())
            .unwrap();
        assert_eq!(two.active().as_str(), "k2");
        assert_eq!(
            two.open(&acme, &slack, &old.ciphertext).unwrap().expose(),
            "value",
            "old keys still open"
        );
        let new = two.rewrap(&acme, &slack, &old).unwrap().expect("rewrapped");
        assert_eq!(new.key_id.as_str(), "k2");
        assert_eq!(
            two.rewrap(&acme, &slack, &new).unwrap(),
            None,
            "already under the active key"
        );
        let retired = two.retired(&KeyId::new("k1").unwrap()).unwrap();
        assert!(
            matches!(retired.open(&acme, &slack, &old.ciphertext), Err(SecretsError::UnknownKey(id)) if id == "k1")
        );
        assert_eq!(
            retired
                .open(&acme, &slack, &new.ciphertext)
                .unwrap()
                .expose(),
            "value"
        );
        assert!(
            retired.retired(&KeyId::new("k2").unwrap()).is_err(),
            "the active key cannot retire"
        );
    }

    #[test]
    fn bad_keys_are_named() {
        let cases = [
            ("k1=not base64!", "k1"),
            ("k1=AAAA", "32 bytes"),
            ("bad id=AAAA", "key id"),
            ("no equals sign", "line 1"),
            ("# only a comment", "no keys"),
        ];
        for (text, fragment) in cases {
            let err = KeyRing::parse(text).unwrap_err().to_string();
            assert!(err.contains(fragment), "{text}: {err}");
        }
        let key = KeyRing::generate_key();
        let text = format!("# keys\nk1={}\nk1={}\n", *key, *key);
        assert!(
            KeyRing::parse(&text)
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
        let ok =
            KeyRing::parse(&format!("k1={}\n\nk2={}\n", *key, *KeyRing::generate_key())).unwrap();
        assert_eq!(ok.active().as_str(), "k2");
        assert!(
            !format!("{ok:?}").contains(key.as_str()),
            "Debug shows ids only"
        );
    }
}
