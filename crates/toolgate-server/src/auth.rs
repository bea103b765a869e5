//! Bearer-token authentication. Tokens are random strings shown once; only their SHA-256 is
//! stored. The tenant of every request comes from its token, never from the request body:
//! [`Authenticated`] (the layer in front of each service) puts the [`Caller`] in the
//! request's extensions, where the handlers read it with [`caller`].

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tonic::codegen::http;
use toolgate_core::{AgentId, TenantId};
use toolgate_ledger::{Role, Store, TokenRecord};

use crate::status::ServiceError;

mod layer;

pub(crate) use layer::{AuthLayer, caller};

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
    pub(crate) fn tenant(&self) -> Result<&TenantId, ServiceError> {
        self.tenant.as_ref().ok_or(ServiceError::NoTenant)
    }
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
    toolgate_core::hex::encode(Sha256::digest(token.as_bytes()))
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

    /// The caller presenting `authorization` (the request's header), or UNAUTHENTICATED.
    pub(crate) async fn authenticate(
        &self,
        authorization: Option<&http::HeaderValue>,
    ) -> Result<Caller, ServiceError> {
        let header = authorization.ok_or(ServiceError::MissingToken)?;
        let header = header.to_str().map_err(|_| ServiceError::TokenNotText)?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or(ServiceError::NotBearer)?
            .trim();
        let hash = hash_token(token);
        if let Some((caller, at)) = self.cache.read().expect("token cache lock").get(&hash)
            && at.elapsed() < self.ttl
        {
            return Ok(caller.clone());
        }
        // A store failure answers by its kind, never with the database's text: the caller may
        // not even hold a token.
        let record = self.store.find_token(&hash).await?;
        let Some(record) = record.filter(|r| !r.revoked) else {
            return Err(ServiceError::UnknownToken);
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

    /// Authenticates and requires `role` (a valid token of another role is PERMISSION_DENIED:
    /// the caller is known, the call is not theirs to make).
    pub(crate) async fn require(
        &self,
        authorization: Option<&http::HeaderValue>,
        role: Role,
    ) -> Result<Caller, ServiceError> {
        let caller = self.authenticate(authorization).await?;
        if caller.role != role {
            return Err(ServiceError::WrongRole {
                needed: role,
                held: caller.role,
            });
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
