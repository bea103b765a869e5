//! What the approval console keeps: sign-in sessions and client approval links, both found by
//! the SHA-256 of a random secret the browser holds (the ledger never sees the secret), and
//! who decided a pending invocation. Written through the writer like everything else, so
//! every replica sharing the ledger knows a session or a link the moment it is made.

use toolgate_core::{TenantId, Timestamp};

use crate::error::LedgerError;
use crate::ops::{PreparedEvent, Reply};
use crate::rows::{Fail, SqlRow, write_failure};
use crate::sql::query;
use crate::steps::{Conn, Steps};

/// A console session: a sign-in with an approver or admin token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleSession {
    /// Hex SHA-256 of the session id the cookie carries.
    pub id_hash: String,
    /// Hex SHA-256 of the token it was opened with (looked up again on every request).
    pub token_hash: String,
    /// The session's CSRF token, embedded in every form.
    pub csrf: String,
    /// When it was opened.
    pub created_at: Timestamp,
    /// The last request it made (idle expiry counts from here).
    pub last_seen_at: Timestamp,
    /// When it ends whatever happens (absolute expiry).
    pub expires_at: Timestamp,
}

/// A client approval link: lets its holder decide one pending invocation, once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientLink {
    /// Hex SHA-256 of the link's secret.
    pub hash: String,
    /// The link's public id (in the audit trail).
    pub id: String,
    /// The tenant of the invocation.
    pub tenant: TenantId,
    /// The one pending invocation it decides.
    pub invocation_id: String,
    /// When it was minted.
    pub created_at: Timestamp,
    /// When it stops working.
    pub expires_at: Timestamp,
    /// When it was used, if it was.
    pub used_at: Option<Timestamp>,
    /// `approve` or `reject`, once used.
    pub used_decision: Option<String>,
}

/// What an approver is shown of a pending invocation beyond its row: who decided it, why and
/// when, and the policies that suspended it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingDetails {
    /// The approver's identity as recorded, once decided.
    pub decided_by: Option<String>,
    /// The reason given.
    pub reason: Option<String>,
    /// When.
    pub decided_at: Option<Timestamp>,
    /// Ids of the policies whose decision suspended the call (empty when none fired).
    pub policy_ids: Vec<String>,
}

/// A console write.
#[derive(Debug)]
pub(crate) enum ConsoleOp {
    CreateSession(ConsoleSession),
    /// Moves `last_seen_at` to `at` if the session is still valid then (`idle_ms` since it was
    /// last seen, before its absolute expiry); answers whether it was.
    TouchSession {
        id_hash: String,
        at: Timestamp,
        idle_ms: i64,
    },
    DeleteSession(String),
    /// Removes sessions past their absolute expiry or idle since `idle_before`.
    PurgeSessions {
        now: Timestamp,
        idle_before: Timestamp,
    },
    CreateLink(ClientLink, Vec<PreparedEvent>),
    /// Marks the link used if it is unused and unexpired at `at`; answers whether it did.
    UseLink {
        hash: String,
        at: Timestamp,
        decision: String,
        events: Vec<PreparedEvent>,
    },
    /// Makes a link used at `used_at` usable again (its decision did not happen) while its
    /// invocation is still pending; answers whether it did.
    ReleaseLink {
        hash: String,
        used_at: Timestamp,
        events: Vec<PreparedEvent>,
    },
}

impl ConsoleOp {
    /// The audit events the operation appends (PostgreSQL's writer locks their chains' heads).
    #[cfg(feature = "postgres")]
    pub(crate) fn events(&self) -> &[PreparedEvent] {
        match self {
            ConsoleOp::CreateLink(_, events)
            | ConsoleOp::UseLink { events, .. }
            | ConsoleOp::ReleaseLink { events, .. } => events,
            _ => &[],
        }
    }
}

pub(crate) fn session_from_row(row: &impl SqlRow) -> Result<ConsoleSession, LedgerError> {
    Ok(ConsoleSession {
        id_hash: row.text("id_hash")?,
        token_hash: row.text("token_hash")?,
        csrf: row.text("csrf")?,
        created_at: Timestamp(row.int("created_at")?),
        last_seen_at: Timestamp(row.int("last_seen_at")?),
        expires_at: Timestamp(row.int("expires_at")?),
    })
}

pub(crate) fn link_from_row(row: &impl SqlRow) -> Result<ClientLink, LedgerError> {
    let tenant = row.text("tenant")?;
    Ok(ClientLink {
        hash: row.text("hash")?,
        id: row.text("id")?,
        tenant: TenantId::new(tenant)
            .map_err(|error| LedgerError::Corrupt(format!("column tenant: {error}")))?,
        invocation_id: row.text("invocation_id")?,
        created_at: Timestamp(row.int("created_at")?),
        expires_at: Timestamp(row.int("expires_at")?),
        used_at: row.int_opt("used_at")?.map(Timestamp),
        used_decision: row.text_opt("used_decision")?,
    })
}

pub(crate) fn details_from_row(row: &impl SqlRow) -> Result<PendingDetails, LedgerError> {
    let policy_ids = match row.text_opt("policy_ids")? {
        Some(text) => serde_json::from_str(&text)
            .map_err(|error| LedgerError::Corrupt(format!("column policy_ids: {error}")))?,
        None => Vec::new(),
    };
    Ok(PendingDetails {
        decided_by: row.text_opt("decided_by")?,
        reason: row.text_opt("reason")?,
        decided_at: row.int_opt("decided_at")?.map(Timestamp),
        policy_ids,
    })
}

fn database(what: &'static str) -> impl FnOnce(sqlx::Error) -> Fail {
    move |error| {
        write_failure(
            &error,
            || what.to_owned(),
            || LedgerError::NotFound(what.to_owned()),
        )
    }
}

impl<C: Conn> Steps<'_, C> {
    /// A conditional update's answer: whether it changed the link, with its events appended
    /// only when it did.
    async fn append_if_changed(
        &mut self,
        changed: u64,
        events: &[PreparedEvent],
    ) -> Result<Reply, Fail> {
        if changed == 1 {
            for event in events {
                self.append(event).await?;
            }
        }
        Ok(Reply::Finished(changed == 1))
    }

    pub(crate) async fn console(&mut self, op: &ConsoleOp) -> Result<Reply, Fail> {
        match op {
            ConsoleOp::CreateSession(session) => {
                query(
                    "INSERT INTO console_sessions (id_hash, token_hash, csrf, created_at, \
                     last_seen_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(session.id_hash.as_str())
                .bind(session.token_hash.as_str())
                .bind(session.csrf.as_str())
                .bind(session.created_at.0)
                .bind(session.last_seen_at.0)
                .bind(session.expires_at.0)
                .execute(self.conn.db())
                .await
                .map_err(database("console session"))?;
                Ok(Reply::Done)
            }
            ConsoleOp::TouchSession {
                id_hash,
                at,
                idle_ms,
            } => {
                let changed = query(
                    "UPDATE console_sessions SET last_seen_at = $1 \
                     WHERE id_hash = $2 AND expires_at > $1 AND last_seen_at + $3 > $1",
                )
                .bind(at.0)
                .bind(id_hash.as_str())
                .bind(*idle_ms)
                .execute(self.conn.db())
                .await
                .map_err(database("console session"))?;
                Ok(Reply::Finished(changed == 1))
            }
            ConsoleOp::DeleteSession(id_hash) => {
                let changed = query("DELETE FROM console_sessions WHERE id_hash = $1")
                    .bind(id_hash.as_str())
                    .execute(self.conn.db())
                    .await
                    .map_err(database("console session"))?;
                Ok(Reply::Finished(changed == 1))
            }
            ConsoleOp::PurgeSessions { now, idle_before } => {
                let changed = query(
                    "DELETE FROM console_sessions WHERE expires_at <= $1 OR last_seen_at <= $2",
                )
                .bind(now.0)
                .bind(idle_before.0)
                .execute(self.conn.db())
                .await
                .map_err(database("console sessions"))?;
                Ok(Reply::Count(changed))
            }
            ConsoleOp::CreateLink(link, events) => {
                query(
                    "INSERT INTO client_links (hash, id, tenant, invocation_id, created_at, \
                     expires_at) VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(link.hash.as_str())
                .bind(link.id.as_str())
                .bind(link.tenant.as_str())
                .bind(link.invocation_id.as_str())
                .bind(link.created_at.0)
                .bind(link.expires_at.0)
                .execute(self.conn.db())
                .await
                .map_err(database("client link"))?;
                for event in events {
                    self.append(event).await?;
                }
                Ok(Reply::Done)
            }
            ConsoleOp::UseLink {
                hash,
                at,
                decision,
                events,
            } => {
                let changed = query(
                    "UPDATE client_links SET used_at = $1, used_decision = $2 \
                     WHERE hash = $3 AND used_at IS NULL AND expires_at > $1",
                )
                .bind(at.0)
                .bind(decision.as_str())
                .bind(hash.as_str())
                .execute(self.conn.db())
                .await
                .map_err(database("client link"))?;
                self.append_if_changed(changed, events).await
            }
            ConsoleOp::ReleaseLink {
                hash,
                used_at,
                events,
            } => {
                // Only while the invocation is still pending, checked in the same statement: a
                // decision made meanwhile (by an approver) keeps the link spent.
                let changed = query(
                    "UPDATE client_links SET used_at = NULL, used_decision = NULL \
                     WHERE hash = $1 AND used_at = $2 AND EXISTS (SELECT 1 FROM \
                     pending_invocations p WHERE p.tenant = client_links.tenant \
                     AND p.id = client_links.invocation_id AND p.state = 'pending')",
                )
                .bind(hash.as_str())
                .bind(used_at.0)
                .execute(self.conn.db())
                .await
                .map_err(database("client link"))?;
                self.append_if_changed(changed, events).await
            }
        }
    }
}
