//! The one redaction entry point: everything the gateway stores or streams (ledger rows, audit
//! events, error texts, logs) passes through [`Redactor`] first. The agent itself always gets
//! the unredacted result.
//!
//! Two modes. [`Redactor::redact_json`] / [`Redactor::redact_text`] remove credentials and are
//! meant for tool inputs and error texts; [`Redactor::redact_output_json`] /
//! [`Redactor::redact_output_text`] also remove personal data and are meant for tool outputs
//! (and vendor error texts, which often quote them).
//!
//! Two layers in each mode:
//!
//! - Field names (`secret`, `token`, `password`, `passphrase`, `api[_-]key`, `access[_-]key`,
//!   `private[_-]key`, `authorization`, `cookie`, `credential`, `signature`, in any case and in
//!   camelCase, snake_case or kebab-case) have their whole value replaced; `null` and booleans
//!   are kept since they say nothing. LLM usage counters are not credentials: a "token" name
//!   with a counter word (`max_tokens`, `tokens_used`, `promptTokenCount`, `input_tokens`, ...)
//!   is plain, and a JSON number under any name whose only hint is "token" is kept. In output
//!   mode, personal field names (`email`, `phone`, `first_name`, `address1`, `date_of_birth`,
//!   `card_number`, `ssn`, ...) are replaced too; a postal address keeps its postal code, and
//!   `ip_address`-like names are not postal.
//! - Value patterns anywhere in strings (and in object keys): PEM private keys (the whole
//!   block, or to the end when cut off), URL userinfo (`https://[REDACTED]@host`), Slack webhook
//!   paths, `name=value` / `"name": "value"` pairs with credential names (query strings, headers,
//!   JSON-in-text), bearer/basic values that look machine-made, vendor tokens (AWS key ids,
//!   Slack, Shopify, GitHub, JWT, Stripe, OpenAI/Anthropic-style `sk-`, Google `AIza`), AWS
//!   secret keys (40 base64 characters mixing case and digits, only with AWS mentioned nearby
//!   or in the enclosing JSON object), Luhn-valid card numbers (13-19 digits, issuer digit 2-6,
//!   card-shaped grouping; JSON numbers of 15-19 digits too), SSNs/ITINs (`AAA-GG-SSSS`, valid
//!   areas only) and EINs (`PP-NNNNNNN`, IRS prefixes only). Output mode adds emails, phone
//!   numbers (E.164, NANP, trunk-0 national forms), street addresses (reduced to
//!   `[REDACTED ADDRESS] <postal code>`) and IBANs (mod-97 checked).
//!
//! No pattern hides another: wherever one pattern matches, every pattern that matches at the
//! same place is judged before the scan moves on, a rejected match is not jumped over, and a
//! replacement widens over a longer secret starting where it starts (see `scan::collect`).
//! `\n`, `\r` and `\t` escapes (JSON quoted inside a string) separate words like the
//! characters they stand for.
//!
//! Cost: one pass of one compiled alternation per string to find where candidates start,
//! skipped for strings under 6 bytes; nothing is allocated for a string without a match.
//! `cargo xtask bench` reports the cost of a typical call (its input through `redact_json`,
//! its output through `redact_output_json`).

mod fields;
mod scan;

use std::borrow::Cow;
use std::cell::Cell;

use serde_json::{Map, Number, Value};

use fields::{FieldClass, Pii};

/// What replaces a redacted credential.
pub const REDACTED: &str = "[REDACTED]";
/// What replaces an email address in outputs.
pub const REDACTED_EMAIL: &str = "[REDACTED EMAIL]";
/// What replaces a phone number in outputs.
pub const REDACTED_PHONE: &str = "[REDACTED PHONE]";
/// What replaces a street address in outputs; the postal code, when found, follows it.
pub const REDACTED_ADDRESS: &str = "[REDACTED ADDRESS]";
/// What replaces a person's name in outputs.
pub const REDACTED_NAME: &str = "[REDACTED NAME]";
/// What replaces payment details (IBAN, account numbers, card fields) in outputs.
pub const REDACTED_PAYMENT: &str = "[REDACTED PAYMENT]";

/// Replaces credentials (and, for outputs, personal data) in JSON values and text. Cheap to
/// clone and share: the patterns are compiled once per process.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    _private: (),
}

/// Which layers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Secrets,
    SecretsAndPii,
}

impl Redactor {
    /// The standard redactor.
    pub fn new() -> Redactor {
        Redactor::default()
    }

    /// Whether a field called `name` holds a credential. Usage counters such as `max_tokens`
    /// do not.
    pub fn is_sensitive_field(&self, name: &str) -> bool {
        fields::is_secret_name(name)
    }

    /// A copy of `value` with credentials replaced: for tool inputs.
    pub fn redact_json(&self, value: &Value) -> Value {
        walk(value, Mode::Secrets, &AwsScope::root())
    }

    /// A copy of `value` with credentials and personal data replaced: for tool outputs.
    pub fn redact_output_json(&self, value: &Value) -> Value {
        walk(value, Mode::SecretsAndPii, &AwsScope::root())
    }

    /// `text` with credentials replaced; borrowed when nothing matched.
    pub fn redact_text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        scan::scan(text, false, &|| false)
    }

    /// `text` with credentials and personal data replaced; borrowed when nothing matched.
    pub fn redact_output_text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        scan::scan(text, true, &|| false)
    }

    /// At most `max_chars` characters of `text` with credentials replaced, for keeping an
    /// excerpt of something too long or malformed to keep whole. The whole text is redacted
    /// before it is cut, so a cut can never fall inside a secret and leave its start; the cut
    /// then backs off to the end of the last whole word (a cut word is dropped, not kept in
    /// part), the excerpt is redacted again (a piece can look different once its continuation
    /// is gone), and a note says how many bytes were left out.
    pub fn redact_excerpt(&self, text: &str, max_chars: usize) -> String {
        let redacted = self.redact_text(text);
        let Some((cut, next)) = redacted.char_indices().nth(max_chars) else {
            return redacted.into_owned();
        };
        let mut end = cut;
        if in_word(next) {
            while let Some(last) = redacted[..end].chars().next_back() {
                if !in_word(last) {
                    break;
                }
                end -= last.len_utf8();
            }
        }
        // Redacting the cut text again can lengthen it (a marker longer than what it
        // replaces): drop whole words from its end until it fits. Each round shortens the
        // text, so this ends, at worst with nothing kept.
        loop {
            let kept = self.redact_text(&redacted[..end]);
            if end == 0 || kept.chars().count() <= max_chars {
                return format!("{kept}[{} bytes omitted]", redacted.len() - end);
            }
            end = without_last_word(&redacted[..end]);
        }
    }
}

/// The length of `text` without its last word and whatever follows that word (at least one
/// character shorter, for a non-empty text).
fn without_last_word(text: &str) -> usize {
    let trimmed = text.trim_end_matches(|c: char| !in_word(c));
    let without = trimmed.trim_end_matches(in_word);
    if without.len() == text.len() {
        return text.len() - text.chars().next_back().map_or(0, char::len_utf8);
    }
    without.len()
}

/// Whether the JSON around a value talks about AWS (a key naming it, or an access key id in a
/// sibling field), which makes a bare 40-character key a secret key. Worked out only when a
/// candidate needs it, once per object.
#[derive(Debug)]
struct AwsScope<'a> {
    parent: Option<&'a AwsScope<'a>>,
    object: Option<&'a Map<String, Value>>,
    known: Cell<Option<bool>>,
}

impl AwsScope<'_> {
    /// Outside any JSON object: no context.
    fn root() -> AwsScope<'static> {
        AwsScope {
            parent: None,
            object: None,
            known: Cell::new(Some(false)),
        }
    }

    fn get(&self) -> bool {
        if let Some(known) = self.known.get() {
            return known;
        }
        let here = self.object.is_some_and(|map| {
            map.iter().any(|(key, field)| {
                contains_ignore_case(key, "aws")
                    || matches!(field, Value::String(s) if scan::AWS_KEY_ID.is_match(s))
            })
        });
        let answer = here || self.parent.is_some_and(AwsScope::get);
        self.known.set(Some(answer));
        answer
    }
}

fn walk(value: &Value, mode: Mode, aws: &AwsScope<'_>) -> Value {
    match value {
        Value::Object(map) => walk_object(map, mode, aws),
        Value::Array(items) => {
            Value::Array(items.iter().map(|item| walk(item, mode, aws)).collect())
        }
        Value::String(text) => Value::String(scan_text(text, mode, aws).into_owned()),
        Value::Number(number) if is_card_number(number) => Value::String(REDACTED.to_owned()),
        other => other.clone(),
    }
}

fn walk_object(map: &Map<String, Value>, mode: Mode, parent: &AwsScope<'_>) -> Value {
    let aws = AwsScope {
        parent: Some(parent),
        object: Some(map),
        known: Cell::new(None),
    };
    let mut out = Map::with_capacity(map.len());
    for (key, field) in map {
        let redacted = match fields::classify(key) {
            FieldClass::Secret { .. } if matches!(field, Value::Null | Value::Bool(_)) => {
                field.clone()
            }
            FieldClass::Secret { token_only: true } if field.is_number() => field.clone(),
            FieldClass::Secret { .. } => Value::String(REDACTED.to_owned()),
            FieldClass::Personal(pii) if mode == Mode::SecretsAndPii => {
                redact_personal(field, pii, &aws)
            }
            FieldClass::Plain | FieldClass::Personal(_) => walk(field, mode, &aws),
        };
        let key = scan_text(key, mode, &AwsScope::root()).into_owned();
        out.insert(key, redacted);
    }
    Value::Object(out)
}

/// A personal field's value: strings and numbers replaced (an address keeping its postal
/// code), containers walked, `null` and booleans kept.
fn redact_personal(field: &Value, pii: Pii, aws: &AwsScope<'_>) -> Value {
    let label = match pii {
        Pii::Email => REDACTED_EMAIL,
        Pii::Phone => REDACTED_PHONE,
        Pii::Address => REDACTED_ADDRESS,
        Pii::Name => REDACTED_NAME,
        Pii::Payment => REDACTED_PAYMENT,
        Pii::BirthDate | Pii::TaxId => REDACTED,
    };
    match field {
        Value::String(text) if pii == Pii::Address => match scan::postal_code(text) {
            Some(code) => Value::String(format!("{label} {code}")),
            None => Value::String(label.to_owned()),
        },
        Value::String(_) | Value::Number(_) => Value::String(label.to_owned()),
        Value::Object(_) | Value::Array(_) => walk(field, Mode::SecretsAndPii, aws),
        Value::Null | Value::Bool(_) => field.clone(),
    }
}

fn scan_text<'t>(text: &'t str, mode: Mode, aws: &AwsScope<'_>) -> Cow<'t, str> {
    scan::scan(text, mode == Mode::SecretsAndPii, &|| aws.get())
}

/// JSON integers of 15-19 digits that pass the card checks. Shorter ones are left alone: 13-14
/// digit JSON numbers are overwhelmingly ids (Shopify's), and such cards are retired.
fn is_card_number(number: &Number) -> bool {
    let Some(value) = number.as_u64() else {
        return false;
    };
    (100_000_000_000_000..10_000_000_000_000_000_000).contains(&value)
        && scan::is_card_digits(&value.to_string())
}

/// Whether `c` continues a word for [`Redactor::redact_excerpt`]: everything but white space
/// and the quotes and punctuation that separate values (a token's own `-_./+=:` and a
/// `[REDACTED]` marker's brackets continue it).
fn in_word(c: char) -> bool {
    !(c.is_whitespace()
        || matches!(
            c,
            '"' | '\'' | ',' | ';' | '(' | ')' | '{' | '}' | '<' | '>'
        ))
}

fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    haystack
        .as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

#[cfg(test)]
mod tests;
