//! Sealing what must be kept whole: values the ledger stores for later (a call's full answer
//! for replays) that may hold secrets or personal data. The implementation (AES-256-GCM under
//! the master key ring) lives in `toolgate-secrets`; this crate only names the interface, so
//! the engine seals without depending on a cipher.

/// Seals and opens byte strings bound to a context (associated data: e.g. the tenant and the
/// call id), so a sealed value moved to another row or tenant no longer opens.
pub trait Sealer: Send + Sync + std::fmt::Debug {
    /// Seals `plaintext` for `context` under the active key; the text carries the key id.
    fn seal(&self, context: &[&str], plaintext: &[u8]) -> String;
    /// Opens a value sealed for exactly `context`.
    fn open(
        &self,
        context: &[&str],
        sealed: &str,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, SealError>;
    /// The id of the key that sealed `sealed`, read from the text (nothing is opened);
    /// `None` when it is not a sealed value of this sealer's format.
    fn key_id_of(&self, sealed: &str) -> Option<String>;
}

/// Why a sealed value did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The key it was sealed with is no longer loaded (retired, or a different key file).
    #[error("the key `{0}` that sealed this value is not loaded")]
    UnknownKey(String),
    /// Damaged, truncated, or sealed for another context.
    #[error("the sealed value does not open: damaged or sealed for something else")]
    Invalid,
}
