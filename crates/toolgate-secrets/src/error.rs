//! The secrets crate's error type. Messages name keys, tenants and secret names, never
//! secret material.

/// A credential could not be sealed, opened or resolved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretsError {
    /// A master key is malformed (not base64, not 32 bytes, bad id).
    #[error("invalid master key `{id}`: {reason}")]
    InvalidKey {
        /// The key's id as given.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// A key ring description is malformed.
    #[error("invalid key ring: {0}")]
    InvalidKeyRing(String),
    /// A ciphertext names a key the ring does not hold (never loaded, or retired).
    #[error("the key `{0}` needed to decrypt this credential is not loaded")]
    UnknownKey(String),
    /// The ciphertext is malformed, was tampered with, or belongs to another tenant or name.
    #[error(
        "credential `{name}` could not be decrypted (tampered, or sealed for another tenant or name)"
    )]
    Decrypt {
        /// The secret's name.
        name: String,
    },
    /// A reference is malformed or of an unsupported kind.
    #[error("invalid reference: {0}")]
    InvalidReference(String),
    /// A reference does not resolve (missing variable, unreadable file).
    #[error("reference for `{name}` does not resolve: {reason}")]
    Unresolved {
        /// The secret's name.
        name: String,
        /// Why, without secret material.
        reason: String,
    },
    /// The credential repository failed.
    #[error("credential store unavailable: {0}")]
    Repository(String),
}
