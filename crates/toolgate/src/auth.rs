//! Bearer-token authentication. Tokens are random strings shown once; only their SHA-256 is
//! stored. The tenant of every request comes from its token, never from the request body.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tonic::Status;
use toolgate_core::{AgentId, TenantId};
use toolgate_ledger::{Role, Store, TokenRecord};

/// Who is calling.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    /// The token's public id.
    pub(crate) token_id: String,
    /// Its role.
    pub(crate) role: Role,
    /// Its tenant (`None` for admins).
    pub(crate) tenant: Option<TenantId>,
    /// The agent an agent token is bound to.
    pub(crate) agent: Option<AgentId>,
    /// The token's label (who holds it).
    pub(crate) label: String,
}

impl Caller {
    /// The tenant of an agent or approver token.
    pub(crate) fn tenant(&self) -> Result<&TenantId, Status> {
        self.tenant
            .as_ref()
            .ok_or_else(|| Status::permission_denied("this call needs a tenant token"))
    }
}

/// PERMISSION_DENIED for a valid token of another role: the caller is known, the call is not
/// theirs to make (a missing or unknown token is UNAUTHENTICATED instead).
pub(crate) fn wrong_role(needed: Role, held: Role) -> Status {
    Status::permission_denied(format!(
        "PERMISSION_DENIED: this call needs an {} token, not an {} token",
        needed.as_str(),
        held.as_str()
    ))
}

/// A freshly issued token: its stored record and the secret to show once.
#[derive(Debug)]
pub(crate) struct IssuedToken {
    pub(crate) record: TokenRecord,
    pub(crate) secret: String,
}

/// Issues a new random token for `role`.
pub(crate) fn issue_token(
    role: Role,
    tenant: Option<TenantId>,
    agent: Option<AgentId>,
    label: String,
    now: toolgate_core::Timestamp,
) -> IssuedToken {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let secret = format!(
        "tg_{}_{}",
        role.as_str(),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let record = TokenRecord {
        id: format!("tok_{}", uuid::Uuid::now_v7().simple()),
        hash: hash_token(&secret),
        role,
        tenant,
        agent,
        label,
        created_at: now,
        revoked: false,
    };
    IssuedToken { record, secret }
}

/// Hex SHA-256 of a token. Tokens carry 256 random bits, so a plain hash is enough (no
/// password stretching needed) and keeps authentication cheap on every call.
pub(crate) fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Verifies bearer tokens against the store, caching hits briefly (revocations through this
/// process apply at once; through another replica within the TTL).
#[derive(Debug)]
pub(crate) struct Authenticator {
    store: Arc<dyn Store>,
    cache: RwLock<HashMap<String, (Caller, Instant)>>,
    ttl: Duration,
}

const CACHE_LIMIT: usize = 10_000;

impl Authenticator {
    pub(crate) fn new(store: Arc<dyn Store>, ttl: Duration) -> Authenticator {
        Authenticator {
            store,
            cache: RwLock::new(HashMap::new()),
            ttl,
        }
    }

    /// The caller of a request, or UNAUTHENTICATED.
    pub(crate) async fn authenticate<T>(
        &self,
        request: &tonic::Request<T>,
    ) -> Result<Caller, Status> {
        let header = request.metadata().get("authorization").ok_or_else(|| {
            Status::unauthenticated(
                "UNAUTHENTICATED: missing `authorization: Bearer <token>` metadata",
            )
        })?;
        let header = header.to_str().map_err(|_| {
            Status::unauthenticated("UNAUTHENTICATED: the authorization header is not text")
        })?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or_else(|| {
                Status::unauthenticated(
                    "UNAUTHENTICATED: the authorization header must be `Bearer <token>`",
                )
            })?
            .trim();
        let hash = hash_token(token);
        if let Some((caller, at)) = self.cache.read().expect("token cache lock").get(&hash)
            && at.elapsed() < self.ttl
        {
            return Ok(caller.clone());
        }
        // A store failure answers by its kind, never with the database's text: the caller may
        // not even hold a token.
        let record = self
            .store
            .find_token(&hash)
            .await
            .map_err(|e| crate::convert::store_status(&e))?;
        let Some(record) = record.filter(|r| !r.revoked) else {
            return Err(Status::unauthenticated(
                "UNAUTHENTICATED: unknown or revoked token",
            ));
        };
        let caller = Caller {
            token_id: record.id,
            role: record.role,
            tenant: record.tenant,
            agent: record.agent,
            label: record.label,
        };
        let mut cache = self.cache.write().expect("token cache lock");
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(hash, (caller.clone(), Instant::now()));
        Ok(caller)
    }

    /// Authenticates and requires `role`.
    pub(crate) async fn require<T>(
        &self,
        request: &tonic::Request<T>,
        role: Role,
    ) -> Result<Caller, Status> {
        let caller = self.authenticate(request).await?;
        if caller.role != role {
            return Err(wrong_role(role, caller.role));
        }
        Ok(caller)
    }

    /// Drops every cached token: after another replica changed tokens.
    pub(crate) fn forget_all(&self) {
        self.cache.write().expect("token cache lock").clear();
    }

    /// Drops a revoked token from the cache.
    pub(crate) fn forget_token(&self, token_id: &str) {
        self.cache
            .write()
            .expect("token cache lock")
            .retain(|_, (caller, _)| caller.token_id != token_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_role_is_permission_denied_and_says_so() {
        let cases = [
            (
                Role::Admin,
                Role::Agent,
                "needs an admin token, not an agent token",
            ),
            (
                Role::Agent,
                Role::Admin,
                "needs an agent token, not an admin token",
            ),
            (
                Role::Approver,
                Role::Agent,
                "needs an approver token, not an agent token",
            ),
        ];
        for (needed, held, says) in cases {
            let status = wrong_role(needed, held);
            assert_eq!(status.code(), tonic::Code::PermissionDenied);
            assert!(status.message().contains(says), "{}", status.message());
            assert!(
                !status.message().contains("UNAUTHENTICATED"),
                "{}",
                status.message()
            );
        }
    }
}
