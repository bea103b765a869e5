//! Authenticating the audit trail: a MAC under keys derived from the master key ring, so that
//! whoever can write the database but lacks the keys cannot rewrite history unnoticed. The
//! implementation (HMAC-SHA-256 under a chain key derived per master key) lives in
//! `toolgate-secrets`; this crate only names the interface, so the ledger authenticates its
//! chains without depending on the key ring.

/// The keys the audit chains are MAC'd with, one per master key id.
pub trait AuditKeys: Send + Sync + std::fmt::Debug {
    /// The id of the key new events are MAC'd with (the ring's active key).
    fn active_key_id(&self) -> String;
    /// The MAC of `message` under the chain key of `key_id`; `None` when that key is not loaded
    /// (retired, or a different key file).
    fn mac(&self, key_id: &str, message: &[u8]) -> Option<[u8; 32]>;
}
