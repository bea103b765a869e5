//! The audit chain's keys: for each master key, a chain key derived as
//! `HMAC-SHA-256(master key, "toolgate.audit_chain.key.v1")`, and event MACs as
//! `HMAC-SHA-256(chain key, message)`. The master key itself never MACs anything (it seals
//! credentials and answers with AES-256-GCM): one key, one use.
//!
//! A retired master key takes its chain key with it: events MAC'd under it can no longer be
//! authenticated, and verification says so.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::keyring::KeyRing;

/// The label the chain key is derived under; bump it to derive different keys.
const CHAIN_KEY_LABEL: &[u8] = b"toolgate.audit_chain.key.v1";

/// SHA-256's block size, the size HMAC pads its key to.
const BLOCK: usize = 64;

/// HMAC-SHA-256 (RFC 2104) of `message` under a 32-byte key.
fn hmac_sha256(key: &[u8; 32], message: &[u8]) -> [u8; 32] {
    let mut padded = Zeroizing::new([0u8; BLOCK]);
    padded[..key.len()].copy_from_slice(key);
    let mut inner = Sha256::new();
    let mut outer = Sha256::new();
    let mut ipad = Zeroizing::new([0u8; BLOCK]);
    let mut opad = Zeroizing::new([0u8; BLOCK]);
    for index in 0..BLOCK {
        ipad[index] = padded[index] ^ 0x36;
        opad[index] = padded[index] ^ 0x5c;
    }
    inner.update(ipad.as_ref());
    inner.update(message);
    outer.update(opad.as_ref());
    outer.update(inner.finalize());
    outer.finalize().into()
}

impl KeyRing {
    /// The chain key derived from master key `key_id`, if loaded.
    fn chain_key(&self, key_id: &str) -> Option<Zeroizing<[u8; 32]>> {
        let master = self.key_bytes(key_id)?;
        Some(Zeroizing::new(hmac_sha256(master, CHAIN_KEY_LABEL)))
    }
}

impl toolgate_core::AuditKeys for KeyRing {
    fn active_key_id(&self) -> String {
        self.active().as_str().to_owned()
    }

    fn mac(&self, key_id: &str, message: &[u8]) -> Option<[u8; 32]> {
        let key = self.chain_key(key_id)?;
        Some(hmac_sha256(&key, message))
    }
}

/// A key ring that can be replaced while in use (rotation, retirement): the ledger holds one
/// to MAC new events with whatever ring is current. The chain keys are derived once per ring.
pub struct LiveKeyRing(RwLock<Current>);

struct Current {
    ring: Arc<KeyRing>,
    chain_keys: BTreeMap<String, Zeroizing<[u8; 32]>>,
}

impl Current {
    fn new(ring: KeyRing) -> Current {
        let chain_keys = ring
            .key_ids()
            .filter_map(|id| Some((id.as_str().to_owned(), ring.chain_key(id.as_str())?)))
            .collect();
        Current {
            ring: Arc::new(ring),
            chain_keys,
        }
    }
}

impl std::fmt::Debug for LiveKeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LiveKeyRing").field(&self.get()).finish()
    }
}

impl LiveKeyRing {
    /// Starts with `ring`.
    pub fn new(ring: KeyRing) -> LiveKeyRing {
        LiveKeyRing(RwLock::new(Current::new(ring)))
    }

    /// The current ring.
    pub fn get(&self) -> Arc<KeyRing> {
        Arc::clone(&self.0.read().expect("key ring lock").ring)
    }

    /// Replaces the ring.
    pub fn set(&self, ring: KeyRing) {
        *self.0.write().expect("key ring lock") = Current::new(ring);
    }
}

impl toolgate_core::AuditKeys for LiveKeyRing {
    fn active_key_id(&self) -> String {
        self.0
            .read()
            .expect("key ring lock")
            .ring
            .active()
            .as_str()
            .to_owned()
    }

    fn mac(&self, key_id: &str, message: &[u8]) -> Option<[u8; 32]> {
        let current = self.0.read().expect("key ring lock");
        let key = current.chain_keys.get(key_id)?;
        Some(hmac_sha256(key, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgate_core::AuditKeys;

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231 test case 2 uses a 4-byte key; HMAC pads any key shorter than a block with
        // zeros, so the same key padded to 32 bytes gives the same MAC.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let mac = hmac_sha256(&key, b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn each_key_id_macs_differently_and_old_keys_keep_verifying() {
        let first = KeyRing::from_entries(vec![("k1".into(), KeyRing::generate_key().to_string())])
            .unwrap();
        let rotated = first
            .rotated(crate::KeyId::new("k2").unwrap(), &KeyRing::generate_key())
            .unwrap();
        assert_eq!(rotated.active_key_id(), "k2");
        let old = first.mac("k1", b"event").unwrap();
        assert_eq!(rotated.mac("k1", b"event"), Some(old));
        assert_ne!(rotated.mac("k2", b"event"), Some(old));
        assert_eq!(rotated.mac("k3", b"event"), None);
        // The live ring MACs like the ring it holds, and follows a replacement.
        let live = LiveKeyRing::new(first.clone());
        assert_eq!(live.mac("k1", b"event"), Some(old));
        assert_eq!(live.mac("k2", b"event"), None);
        live.set(rotated.clone());
        assert_eq!(live.active_key_id(), "k2");
        assert_eq!(live.mac("k2", b"event"), rotated.mac("k2", b"event"));
        // The chain key is not the master key: a MAC under the master key itself differs.
        let master = *first.key_bytes("k1").unwrap();
        assert_ne!(hmac_sha256(&master, b"event"), old);
    }
}
