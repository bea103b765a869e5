//! The audit chain: how an event's hash is computed from its predecessor's hash and its own
//! fields.
//!
//! Two formats. Keyed events (`key_id` set, everything written with the master keys loaded)
//! carry an HMAC-SHA-256 under the chain key of `key_id` (derived from that master key, see
//! `toolgate-secrets`) over the encoding below with the `v2` tag, the key id and the event's
//! binding (the recorded content of the call it reports, see `binding.rs`). Legacy events
//! (`key_id` NULL: written before the keyed chain, or by a store opened without keys) carry
//! the unkeyed SHA-256 of the `v1` encoding; anyone who can write the database can recompute
//! those, so verification reports them as legacy.
//!
//! The hash input is an unambiguous encoding: a domain tag, then every field in a fixed order,
//! text as an 8-byte big-endian length followed by its UTF-8 bytes, integers as 8 big-endian
//! bytes, and optional text as a presence byte (0 or 1) followed by the text when present. No
//! two different field tuples encode to the same bytes, so moving characters from one field into
//! its neighbour (e.g. `kind = "a", run = "bc"` versus `kind = "ab", run = "c"`) changes the hash.

use sha2::{Digest, Sha256};
use toolgate_core::AuditKeys;

/// The `prev_hash` of the first event of every chain: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Separates this hash from any other SHA-256 use; bump the version if the encoding changes.
const DOMAIN_TAG: &[u8] = b"toolgate.audit_event.v1";

/// The hex SHA-256 of one legacy (unkeyed) audit event, chained to `prev_hash`. The legacy
/// hash predates bindings: `fields.binding` is not part of it.
pub fn event_hash(prev_hash: &str, fields: &EventFields<'_>) -> String {
    let mut hasher = Sha256::new();
    put_text(&mut hasher, DOMAIN_TAG);
    put_text(&mut hasher, prev_hash.as_bytes());
    put_text(&mut hasher, fields.tenant.as_bytes());
    Sink::update(&mut hasher, fields.chain_seq.to_be_bytes());
    put_text(&mut hasher, fields.kind.as_bytes());
    put_optional(&mut hasher, fields.run);
    put_optional(&mut hasher, fields.tool_call_id);
    put_text(&mut hasher, fields.payload.as_bytes());
    Sink::update(&mut hasher, fields.at.to_be_bytes());
    toolgate_core::hex::encode(hasher.finalize())
}

/// Separates keyed event MACs from every other MAC under the chain key.
const KEYED_DOMAIN_TAG: &[u8] = b"toolgate.audit_event.v2";

/// The fields of one event that its hash or MAC covers, besides its predecessor's hash.
#[derive(Clone, Copy, Debug)]
pub struct EventFields<'a> {
    /// The chain's tenant (or the system chain).
    pub tenant: &'a str,
    /// The event's position in its chain.
    pub chain_seq: i64,
    /// The event kind (`tool_call.requested`, ...).
    pub kind: &'a str,
    /// The run, if the event belongs to one.
    pub run: Option<&'a str>,
    /// The call, if the event belongs to one.
    pub tool_call_id: Option<&'a str>,
    /// The payload JSON, as stored.
    pub payload: &'a str,
    /// When, in milliseconds since the epoch.
    pub at: i64,
    /// The call content bound into the event (keyed events only).
    pub binding: Option<&'a str>,
}

/// The hex HMAC-SHA-256 of a keyed event under the chain key of `key_id`; `None` when that
/// key is not loaded.
pub(crate) fn event_mac(
    keys: &dyn AuditKeys,
    key_id: &str,
    prev_hash: &str,
    fields: &EventFields<'_>,
) -> Option<String> {
    // Its exact size: every text is its length (8 bytes) then its bytes, every optional text
    // one byte more, the two numbers 8 bytes each.
    let text = |len: usize| 8 + len;
    let optional = |value: Option<&str>| 1 + value.map_or(0, |value| text(value.len()));
    let size = text(KEYED_DOMAIN_TAG.len())
        + text(key_id.len())
        + text(prev_hash.len())
        + text(fields.tenant.len())
        + 8
        + text(fields.kind.len())
        + optional(fields.run)
        + optional(fields.tool_call_id)
        + text(fields.payload.len())
        + 8
        + optional(fields.binding);
    let mut message = Vec::with_capacity(size);
    put_text(&mut message, KEYED_DOMAIN_TAG);
    put_text(&mut message, key_id.as_bytes());
    put_text(&mut message, prev_hash.as_bytes());
    put_text(&mut message, fields.tenant.as_bytes());
    message.update(fields.chain_seq.to_be_bytes());
    put_text(&mut message, fields.kind.as_bytes());
    put_optional(&mut message, fields.run);
    put_optional(&mut message, fields.tool_call_id);
    put_text(&mut message, fields.payload.as_bytes());
    message.update(fields.at.to_be_bytes());
    put_optional(&mut message, fields.binding);
    debug_assert_eq!(
        message.len(),
        size,
        "the MAC's message is the size computed"
    );
    keys.mac(key_id, &message).map(toolgate_core::hex::encode)
}

/// How a new event is linked: keyed under the active key when the store has keys, else the
/// legacy hash (and no binding, which the legacy hash would not cover).
pub(crate) fn new_link(
    keys: Option<&dyn AuditKeys>,
    prev_hash: &str,
    fields: &EventFields<'_>,
) -> Result<(Option<String>, String), crate::LedgerError> {
    match keys {
        None => Ok((None, event_hash(prev_hash, fields))),
        Some(keys) => {
            let key_id = keys.active_key_id();
            match event_mac(keys, &key_id, prev_hash, fields) {
                Some(mac) => Ok((Some(key_id), mac)),
                None => Err(crate::LedgerError::Corrupt(format!(
                    "the active master key `{key_id}` has no chain key"
                ))),
            }
        }
    }
}

/// Whether any event is keyed (1) or none (0).
pub(crate) const ANY_KEYED: &str = "SELECT count(*) AS count FROM (SELECT 1 FROM audit_events WHERE key_id IS NOT NULL LIMIT 1) AS k";

/// Every chain's head, for [`legacy_record`].
pub(crate) const ALL_HEADS: &str =
    "SELECT tenant, chain_seq, hash FROM audit_heads WHERE chain_seq > 0 ORDER BY tenant";

/// The kind of the system chain event that records, when a ledger's keyed chain begins, where
/// each chain's legacy events end.
pub(crate) const LEGACY_RECORD_EVENT: &str = "audit.keyed_chain_started";

/// The first keyed record of the legacy events, if any.
pub(crate) const FIND_LEGACY_RECORD: &str = "SELECT payload FROM audit_events \
     WHERE tenant = '@system' AND kind = 'audit.keyed_chain_started' AND key_id IS NOT NULL \
     ORDER BY chain_seq LIMIT 1";

/// The system chain event a store opened with keys writes on a ledger holding only legacy
/// events: the position and hash of every chain's last legacy event. Keyed, so it
/// authenticates those legacy prefixes (their content, through the hash chain, and their
/// length): verification with it refuses any other legacy event.
pub(crate) fn legacy_record(heads: Vec<(String, i64, String)>) -> crate::ops::PreparedEvent {
    use toolgate_core::Clock as _;
    let mut chains = serde_json::Map::new();
    for (chain, chain_seq, hash) in heads {
        chains.insert(
            chain,
            serde_json::json!({ "chain_seq": chain_seq, "hash": hash }),
        );
    }
    crate::ops::PreparedEvent {
        tenant: crate::model::SYSTEM_CHAIN.to_owned(),
        kind: LEGACY_RECORD_EVENT.to_owned(),
        run: None,
        tool_call_id: None,
        payload: serde_json::json!({ "legacy_heads": chains }).to_string(),
        at: toolgate_core::SystemClock.now().0,
        binding: None,
    }
}

/// Reads a [`legacy_record`] payload: chain id -> (last legacy position, its hash).
pub(crate) fn parse_legacy_record(
    payload: &str,
) -> Option<std::collections::HashMap<String, (i64, String)>> {
    let value: serde_json::Value = serde_json::from_str(payload).ok()?;
    let chains = value.get("legacy_heads")?.as_object()?;
    let mut heads = std::collections::HashMap::new();
    for (chain, head) in chains {
        let chain_seq = head.get("chain_seq")?.as_i64()?;
        let hash = head.get("hash")?.as_str()?.to_owned();
        heads.insert(chain.clone(), (chain_seq, hash));
    }
    Some(heads)
}

/// Where the encoding goes: a hasher, or a buffer to MAC.
trait Sink {
    fn update(&mut self, bytes: impl AsRef<[u8]>);
}

impl Sink for Sha256 {
    fn update(&mut self, bytes: impl AsRef<[u8]>) {
        Digest::update(self, bytes);
    }
}

impl Sink for Vec<u8> {
    fn update(&mut self, bytes: impl AsRef<[u8]>) {
        self.extend_from_slice(bytes.as_ref());
    }
}

fn put_text(hasher: &mut impl Sink, bytes: &[u8]) {
    // A usize always fits in a u64 on the platforms Rust supports; saturate rather than cast.
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    hasher.update(len.to_be_bytes());
    hasher.update(bytes);
}

fn put_optional(hasher: &mut impl Sink, value: Option<&str>) {
    match value {
        None => hasher.update([0u8]),
        Some(text) => {
            hasher.update([1u8]);
            put_text(hasher, text.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of one event, in `event_hash` order.
    #[derive(Clone, Copy)]
    struct Fields<'a> {
        prev: &'a str,
        tenant: &'a str,
        seq: i64,
        kind: &'a str,
        run: Option<&'a str>,
        call: Option<&'a str>,
        payload: &'a str,
        at: i64,
    }

    impl Fields<'_> {
        fn hash(self) -> String {
            let fields = EventFields {
                tenant: self.tenant,
                chain_seq: self.seq,
                kind: self.kind,
                run: self.run,
                tool_call_id: self.call,
                payload: self.payload,
                at: self.at,
                binding: None,
            };
            event_hash(self.prev, &fields)
        }
    }

    const BASE: Fields<'static> = Fields {
        prev: GENESIS_HASH,
        tenant: "acme",
        seq: 1,
        kind: "tool_call.requested",
        run: Some("run-1"),
        call: Some("call-1"),
        payload: r#"{"tool":"slack.post_message"}"#,
        at: 1_700_000_000_000,
    };

    #[test]
    fn genesis_is_64_zeros() {
        assert_eq!(GENESIS_HASH.len(), 64);
        assert!(GENESIS_HASH.bytes().all(|b| b == b'0'));
    }

    #[test]
    fn hash_is_deterministic_lowercase_hex() {
        let hash = BASE.hash();
        assert_eq!(hash, BASE.hash());
        assert_eq!(hash.len(), 64);
        assert!(
            hash.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
    }

    #[test]
    fn every_field_changes_the_hash() {
        let other_prev = BASE.hash();
        let cases: Vec<(&str, Fields<'_>)> = vec![
            (
                "prev_hash",
                Fields {
                    prev: &other_prev,
                    ..BASE
                },
            ),
            (
                "tenant",
                Fields {
                    tenant: "acme2",
                    ..BASE
                },
            ),
            ("chain_seq", Fields { seq: 2, ..BASE }),
            (
                "kind",
                Fields {
                    kind: "tool_call.failed",
                    ..BASE
                },
            ),
            ("run", Fields { run: None, ..BASE }),
            ("tool_call_id", Fields { call: None, ..BASE }),
            (
                "payload",
                Fields {
                    payload: r#"{"tool":"slack.post_messagf"}"#,
                    ..BASE
                },
            ),
            (
                "at",
                Fields {
                    at: BASE.at + 1,
                    ..BASE
                },
            ),
        ];
        for (field, changed) in cases {
            assert_ne!(
                changed.hash(),
                BASE.hash(),
                "changing {field} kept the hash"
            );
        }
    }

    #[test]
    fn field_boundaries_cannot_shift() {
        // Each pair encodes the same concatenated text with a different split between fields.
        let pairs: Vec<(Fields<'_>, Fields<'_>)> = vec![
            (
                Fields {
                    kind: "ab",
                    run: Some("c"),
                    ..BASE
                },
                Fields {
                    kind: "a",
                    run: Some("bc"),
                    ..BASE
                },
            ),
            (
                Fields {
                    run: Some("x"),
                    call: None,
                    ..BASE
                },
                Fields {
                    run: None,
                    call: Some("x"),
                    ..BASE
                },
            ),
            (
                Fields {
                    run: Some(""),
                    ..BASE
                },
                Fields { run: None, ..BASE },
            ),
            (
                Fields {
                    tenant: "acme",
                    kind: "x",
                    ..BASE
                },
                Fields {
                    tenant: "acmex",
                    kind: "",
                    ..BASE
                },
            ),
        ];
        for (left, right) in pairs {
            assert_ne!(left.hash(), right.hash());
        }
    }

    #[test]
    fn known_answer() {
        // Pins the encoding: a change here breaks every stored chain, so it must be deliberate
        // (and come with a new domain tag). The expected value was computed outside Rust, with
        // Python's hashlib over the encoding described at the top of this file.
        assert_eq!(
            BASE.hash(),
            "f42f77a0df2a89ddc1e5ba5601fdf47d8c9365d603ae854c4831013c59987044"
        );
    }
}
