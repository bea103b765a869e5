//! Checkpoints: the heads of every chain at one moment, MAC'd with the chain key, to be kept
//! away from the database. The database's own `audit_heads` cannot prove a chain's length to
//! someone who can write the database (they can remove the newest events and set the head
//! back to an earlier, genuine event); a checkpoint kept elsewhere can: every chain it names
//! must still reach its position with the same event there.
//!
//! The text is one JSON object:
//!
//! ```text
//! {"format": "toolgate.ledger_checkpoint.v1", "created_at": <unix ms>, "key_id": "k1",
//!  "heads": [{"chain": "acme", "chain_seq": 12, "hash": "..."}, ...],
//!  "mac": "<hex HMAC-SHA-256 under the chain key of key_id>"}
//! ```
//!
//! The MAC covers the format, the time, the key id and every head, in the length-prefixed
//! encoding of `chain.rs`, under its own domain tag (so no event MAC is ever a valid
//! checkpoint MAC, nor the other way round).

use serde_json::{Value, json};
use toolgate_core::AuditKeys;

use crate::error::LedgerError;
use crate::model::{AuditChain, ChainHead, VerifyReport};

/// The `format` of every checkpoint this version writes and reads.
pub const CHECKPOINT_FORMAT: &str = "toolgate.ledger_checkpoint.v1";

const CHECKPOINT_DOMAIN_TAG: &[u8] = b"toolgate.ledger_checkpoint.v1";

/// A parsed checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// When it was taken (unix ms).
    pub created_at: i64,
    /// The master key whose chain key MAC'd it.
    pub key_id: String,
    /// The head of every chain at that moment, in chain id order.
    pub heads: Vec<ChainHead>,
    /// The MAC as written (hex).
    pub mac: String,
}

/// Whether a checkpoint's MAC holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointAuth {
    /// Its MAC is right: it was written by someone holding the keys.
    Authentic,
    /// Its MAC is wrong: the file was changed (or forged).
    Forged,
    /// Its key is not loaded, or no keys were given: it cannot be authenticated.
    Unverifiable,
}

impl Checkpoint {
    /// The checkpoint of a verified ledger: the heads `report` found, MAC'd under the active
    /// key. Refused when the report found a problem (a checkpoint vouches for what it names).
    pub fn of_report(
        report: &VerifyReport,
        keys: &dyn AuditKeys,
        created_at: i64,
    ) -> Result<Checkpoint, LedgerError> {
        if let Some(problem) = &report.first_problem {
            return Err(LedgerError::Corrupt(format!(
                "the ledger does not verify (chain {} at {}: {}); no checkpoint is written for it",
                problem.chain, problem.chain_seq, problem.detail
            )));
        }
        let key_id = keys.active_key_id();
        let mut checkpoint = Checkpoint {
            created_at,
            key_id,
            heads: report.heads.clone(),
            mac: String::new(),
        };
        checkpoint.mac = checkpoint.compute_mac(keys).ok_or_else(|| {
            LedgerError::Corrupt(format!(
                "the active master key `{}` has no chain key",
                checkpoint.key_id
            ))
        })?;
        Ok(checkpoint)
    }

    /// The checkpoint as text (one JSON object and a newline).
    pub fn to_text(&self) -> String {
        let heads: Vec<Value> = self
            .heads
            .iter()
            .map(|head| {
                json!({"chain": head.chain.as_str(), "chain_seq": head.chain_seq, "hash": head.hash})
            })
            .collect();
        let value = json!({
            "format": CHECKPOINT_FORMAT,
            "created_at": self.created_at,
            "key_id": self.key_id,
            "heads": heads,
            "mac": self.mac,
        });
        format!("{value}\n")
    }

    /// Parses a checkpoint's text; names what is wrong with it.
    pub fn parse(text: &str) -> Result<Checkpoint, LedgerError> {
        let bad = |what: &str| LedgerError::Corrupt(format!("not a toolgate checkpoint: {what}"));
        let value: Value =
            serde_json::from_str(text.trim()).map_err(|error| bad(&format!("{error}")))?;
        let format = value.get("format").and_then(Value::as_str);
        if format != Some(CHECKPOINT_FORMAT) {
            return Err(bad(&format!("`format` must be \"{CHECKPOINT_FORMAT}\"")));
        }
        let created_at = value
            .get("created_at")
            .and_then(Value::as_i64)
            .ok_or_else(|| bad("`created_at` must be an integer"))?;
        let key_id = value
            .get("key_id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("`key_id` must be a string"))?
            .to_owned();
        let mac = value
            .get("mac")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("`mac` must be a string"))?
            .to_owned();
        let entries = value
            .get("heads")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("`heads` must be an array"))?;
        let mut heads = Vec::with_capacity(entries.len());
        for entry in entries {
            let chain = entry
                .get("chain")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("every head needs a `chain`"))?;
            let chain = AuditChain::parse(chain)
                .map_err(|error| bad(&format!("chain `{chain}`: {error}")))?;
            let chain_seq = entry
                .get("chain_seq")
                .and_then(Value::as_i64)
                .filter(|seq| *seq >= 1)
                .ok_or_else(|| bad("every head needs a `chain_seq` of 1 or more"))?;
            let hash = entry
                .get("hash")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("every head needs a `hash`"))?
                .to_owned();
            heads.push(ChainHead {
                chain,
                chain_seq,
                hash,
            });
        }
        Ok(Checkpoint {
            created_at,
            key_id,
            heads,
            mac,
        })
    }

    /// Checks the MAC with `keys`.
    pub fn authenticate(&self, keys: Option<&dyn AuditKeys>) -> CheckpointAuth {
        let Some(expected) = keys.and_then(|keys| self.compute_mac(keys)) else {
            return CheckpointAuth::Unverifiable;
        };
        if expected == self.mac {
            CheckpointAuth::Authentic
        } else {
            CheckpointAuth::Forged
        }
    }

    fn compute_mac(&self, keys: &dyn AuditKeys) -> Option<String> {
        let mut message = Vec::new();
        put(&mut message, CHECKPOINT_DOMAIN_TAG);
        put(&mut message, CHECKPOINT_FORMAT.as_bytes());
        message.extend_from_slice(&self.created_at.to_be_bytes());
        put(&mut message, self.key_id.as_bytes());
        let count = u64::try_from(self.heads.len()).unwrap_or(u64::MAX);
        message.extend_from_slice(&count.to_be_bytes());
        for head in &self.heads {
            put(&mut message, head.chain.as_str().as_bytes());
            message.extend_from_slice(&head.chain_seq.to_be_bytes());
            put(&mut message, head.hash.as_bytes());
        }
        keys.mac(&self.key_id, &message)
            .map(toolgate_core::hex::encode)
    }
}

fn put(message: &mut Vec<u8>, bytes: &[u8]) {
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    message.extend_from_slice(&len.to_be_bytes());
    message.extend_from_slice(bytes);
}
