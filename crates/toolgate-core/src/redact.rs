//! The one redaction entry point: everything the gateway stores or streams (ledger rows, audit
//! events, error texts, logs) passes through [`Redactor`] first. The agent itself always gets
//! the unredacted result.
//!
//! Two layers: field names that smell like credentials have their whole value replaced, and
//! string values anywhere are scanned for well-known secret shapes (vendor token prefixes,
//! bearer headers, JWTs, PEM private keys).

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

/// What replaces a redacted value.
pub const REDACTED: &str = "[REDACTED]";

static SENSITIVE_FIELD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(secret|token|passw(or)?d|passphrase|api[_-]?key|access[_-]?key|private[_-]?key|authorization|cookie|credential)",
    )
    .expect("static regex")
});

static SECRET_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    let patterns = [
        // PEM private key blocks.
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
        // Authorization header values.
        r"(?i)\b(?:bearer|basic)\s+[A-Za-z0-9\-._~+/]+=*",
        // AWS access key ids.
        r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",
        // Slack tokens.
        r"\bxox[abposer]-[A-Za-z0-9-]{8,}",
        r"\bxapp-[A-Za-z0-9-]{8,}",
        // Shopify tokens.
        r"\bshp(?:at|ca|pa|ss)_[A-Fa-f0-9]{16,}",
        // GitHub tokens.
        r"\bgh[pousr]_[A-Za-z0-9]{20,}",
        // JWTs.
        r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}",
    ];
    Regex::new(&patterns.join("|")).expect("static regex")
});

/// Replaces credentials in JSON values and text. Cheap to clone and share.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    _private: (),
}

impl Redactor {
    /// The standard redactor.
    pub fn new() -> Redactor {
        Redactor::default()
    }

    /// Whether a field called `name` holds a credential.
    pub fn is_sensitive_field(&self, name: &str) -> bool {
        SENSITIVE_FIELD.is_match(name)
    }

    /// A copy of `value` with sensitive fields and secret-shaped strings replaced.
    pub fn redact_json(&self, value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut out = Map::with_capacity(map.len());
                for (key, field) in map {
                    let redacted = if self.is_sensitive_field(key) && !field.is_null() {
                        Value::String(REDACTED.to_owned())
                    } else {
                        self.redact_json(field)
                    };
                    out.insert(key.clone(), redacted);
                }
                Value::Object(out)
            }
            Value::Array(items) => {
                Value::Array(items.iter().map(|v| self.redact_json(v)).collect())
            }
            Value::String(text) => Value::String(self.redact_text(text).into_owned()),
            other => other.clone(),
        }
    }

    /// `text` with secret-shaped substrings replaced; borrowed when nothing matched.
    pub fn redact_text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        SECRET_VALUE.replace_all(text, REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sensitive_fields_are_replaced_at_any_depth() {
        let input = json!({
            "order_id": "12345",
            "apiKey": "abc",
            "nested": {"Authorization": "anything", "items": [{"password": "p", "qty": 2}]},
            "access_token": null,
        });
        let out = Redactor::new().redact_json(&input);
        assert_eq!(
            out,
            json!({
                "order_id": "12345",
                "apiKey": REDACTED,
                "nested": {"Authorization": REDACTED, "items": [{"password": REDACTED, "qty": 2}]},
                "access_token": null,
            })
        );
    }

    #[test]
    fn secret_shaped_values_are_replaced_inside_text() {
        let cases: &[(&str, &str)] = &[
            ("key AKIAIOSFODNN7EXAMPLE here", "key [REDACTED] here"),
            (
                "Authorization: Bearer abc.def-ghi",
                "Authorization: [REDACTED]",
            ),
            ("tok xoxb-1234567890-abcdefgh end", "tok [REDACTED] end"),
            ("shpat_0123456789abcdef0123456789abcdef", "[REDACTED]"),
            (
                "jwt eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl",
                "jwt [REDACTED]",
            ),
            (
                "order 12345 shipped, tracking 1Z999AA1",
                "order 12345 shipped, tracking 1Z999AA1",
            ),
            ("i-0abcd1234ef567890", "i-0abcd1234ef567890"),
        ];
        let redactor = Redactor::new();
        for (input, expected) in cases {
            assert_eq!(redactor.redact_text(input), *expected, "{input}");
        }
    }

    #[test]
    fn pem_blocks_are_replaced_whole() {
        let pem = "x -----BEGIN RSA PRIVATE KEY-----\nMIIE\nabc\n-----END RSA PRIVATE KEY----- y";
        assert_eq!(Redactor::new().redact_text(pem), "x [REDACTED] y");
    }
}
