//! Tenant credentials for toolgate connectors.
//!
//! A credential is either *sealed* (AES-256-GCM under a key from a [`KeyRing`], the key id
//! inside every ciphertext, the associated data binding tenant, secret name and key id, so a
//! ciphertext copied to another row or tenant does not open) or a *reference* (an environment
//! variable or a file read at use; a secret-manager kind is reserved and refused clearly).
//!
//! [`Vault`] resolves the secrets a tool declares for one tenant, with a TTL cache, and
//! implements [`toolgate_core::SecretSource`] so the engine can use it directly. Where
//! credentials are stored is behind [`CredentialRepository`]; master keys never come from it.

mod chain_key;
mod error;
mod keyring;
mod reference;
mod vault;

pub use chain_key::LiveKeyRing;
pub use error::SecretsError;
pub use keyring::{KeyId, KeyRing, SealedSecret};
pub use reference::{Environment, ProcessEnvironment, Reference};
pub use vault::{CredentialRepository, StoredCredential, StoredKind, Vault};
