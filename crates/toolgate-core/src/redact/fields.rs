//! Field-name heuristics: which JSON keys hold credentials, which hold personal data, and the
//! LLM usage counters (`max_tokens`, `prompt_tokens`, ...) that only look like credentials.

use std::sync::LazyLock;

use regex::bytes::Regex;

/// What a field's name says about its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FieldClass {
    /// Nothing; the value is scanned like any other.
    Plain,
    /// A credential. `token_only` is set when the only hint is the word "token", in which case
    /// a JSON number under it is a count, not a credential, and is kept.
    Secret { token_only: bool },
    /// Personal data; replaced only by the output redaction.
    Personal(Pii),
}

/// The kinds of personal data recognised by field name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pii {
    Email,
    Phone,
    Address,
    Name,
    BirthDate,
    Payment,
    TaxId,
}

/// Stems that mark a credential wherever they appear in the name, compared against the name
/// lowercased with separators removed (so `apiKey`, `X-Api-Key` and `api_key` all hit `apikey`).
const SECRET_STEMS: &[&str] = &[
    "secret",
    "password",
    "passwd",
    "passphrase",
    "apikey",
    "accesskey",
    "privatekey",
    "authorization",
    "cookie",
    "credential",
    "signature",
];

/// Words that turn a "token" name into a usage counter (`max_tokens`, `promptTokenCount`,
/// `cache_read_input_tokens`, `tokens_used`). Compared word by word, never as substrings, so
/// `admin_token` or `account_token` stay credentials.
const COUNTER_WORDS: &[&str] = &[
    "max",
    "min",
    "total",
    "count",
    "counts",
    "used",
    "usage",
    "limit",
    "limits",
    "remaining",
    "budget",
    "input",
    "output",
    "prompt",
    "completion",
    "completions",
    "candidates",
    "cache",
    "cached",
    "reasoning",
    "num",
    "number",
    "per",
    "new",
    "estimated",
    "tokenizer",
    "tokenize",
];

/// Personal-data stems compared against the folded name, checked in order (email before
/// address, so `email_address` is an email).
const PII_STEMS: &[(&str, Pii)] = &[
    ("email", Pii::Email),
    ("phone", Pii::Phone),
    ("faxnumber", Pii::Phone),
    ("firstname", Pii::Name),
    ("lastname", Pii::Name),
    ("middlename", Pii::Name),
    ("fullname", Pii::Name),
    ("givenname", Pii::Name),
    ("familyname", Pii::Name),
    ("surname", Pii::Name),
    ("customername", Pii::Name),
    ("dateofbirth", Pii::BirthDate),
    ("birthdate", Pii::BirthDate),
    ("birthday", Pii::BirthDate),
    ("cardnumber", Pii::Payment),
    ("creditcard", Pii::Payment),
    ("accountnumber", Pii::Payment),
    ("routingnumber", Pii::Payment),
    ("bankaccount", Pii::Payment),
    ("socialsecurity", Pii::TaxId),
    ("taxid", Pii::TaxId),
    ("taxnumber", Pii::TaxId),
    ("nationalid", Pii::TaxId),
    ("passportnumber", Pii::TaxId),
    ("address", Pii::Address),
    ("street", Pii::Address),
];

/// Short personal-data names that are only safe to match as whole words (`ssn` is inside
/// `classname`).
const PII_WORDS: &[(&str, Pii)] = &[
    ("ssn", Pii::TaxId),
    ("ein", Pii::TaxId),
    ("dob", Pii::BirthDate),
    ("fax", Pii::Phone),
    ("iban", Pii::Payment),
    ("cvv", Pii::Payment),
    ("cvc", Pii::Payment),
];

/// Words that make an "address" field technical rather than postal (`ip_address`).
const NOT_POSTAL_WORDS: &[&str] = &[
    "ip", "ipv4", "ipv6", "mac", "remote", "local", "server", "host", "bind", "listen", "web",
    "url", "wallet", "contract", "node", "peer", "socket", "memory", "mail",
];

/// Every stem above in one alternation over the folded name, so a name costs one search.
static STEMS: LazyLock<Regex> = LazyLock::new(|| {
    let mut stems: Vec<&str> = SECRET_STEMS.to_vec();
    stems.push("token");
    stems.extend(PII_STEMS.iter().map(|(stem, _)| *stem));
    stems.extend(PII_WORDS.iter().map(|(word, _)| *word));
    Regex::new(&stems.join("|")).expect("static regex")
});

/// Classifies a field by its name alone.
pub(super) fn classify(name: &str) -> FieldClass {
    let mut stack = [0u8; 64];
    let mut heap = Vec::new();
    let folded = fold(name, &mut stack, &mut heap);
    let mut token = false;
    // The best personal-data hit so far, as (priority, kind): whole-word stems first, then
    // the folded stems in list order.
    let mut personal: Option<(usize, Pii)> = None;
    for found in STEMS.find_iter(folded) {
        let stem = found.as_bytes();
        if SECRET_STEMS.iter().any(|s| s.as_bytes() == stem) {
            return FieldClass::Secret { token_only: false };
        }
        if stem == b"token" {
            token = true;
            continue;
        }
        let hit = PII_WORDS
            .iter()
            .position(|(w, _)| w.as_bytes() == stem)
            .filter(|_| has_word(name, stem))
            .map(|i| (i, PII_WORDS[i].1))
            .or_else(|| {
                PII_STEMS
                    .iter()
                    .position(|(s, _)| s.as_bytes() == stem)
                    .map(|i| (PII_WORDS.len() + i, PII_STEMS[i].1))
            });
        if let Some(hit) = hit
            && personal.is_none_or(|best| hit.0 < best.0)
        {
            personal = Some(hit);
        }
    }
    if token {
        let counter = words(name).any(|w| COUNTER_WORDS.iter().any(|c| c.eq_ignore_ascii_case(w)));
        if counter {
            return FieldClass::Plain;
        }
        return FieldClass::Secret { token_only: true };
    }
    match personal {
        Some((_, Pii::Address))
            if words(name).any(|w| NOT_POSTAL_WORDS.iter().any(|n| n.eq_ignore_ascii_case(w))) =>
        {
            FieldClass::Plain
        }
        Some((_, pii)) => FieldClass::Personal(pii),
        None => FieldClass::Plain,
    }
}

fn has_word(name: &str, word: &[u8]) -> bool {
    words(name).any(|w| w.as_bytes().eq_ignore_ascii_case(word))
}

/// Whether `name` marks a credential (the usage-counter exception applied).
pub(super) fn is_secret_name(name: &str) -> bool {
    matches!(classify(name), FieldClass::Secret { .. })
}

/// `name` lowercased with everything but ASCII letters and digits dropped; on the stack for
/// ordinary names, on the heap for long ones (a long name is never truncated: the credential
/// word may sit at its end).
fn fold<'a>(name: &str, stack: &'a mut [u8; 64], heap: &'a mut Vec<u8>) -> &'a [u8] {
    let alnum = name.bytes().filter(u8::is_ascii_alphanumeric);
    if name.len() <= stack.len() {
        let mut len = 0;
        for (slot, byte) in stack.iter_mut().zip(alnum) {
            *slot = byte.to_ascii_lowercase();
            len += 1;
        }
        return &stack[..len];
    }
    heap.extend(alnum.map(|b| b.to_ascii_lowercase()));
    heap
}

/// The words of an identifier: split at anything not alphanumeric and at lower-to-upper case
/// humps (`maxOutputTokens` gives `max`, `Output`, `Tokens`).
fn words(name: &str) -> impl Iterator<Item = &str> {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .flat_map(split_humps)
        .filter(|w| !w.is_empty())
}

fn split_humps(segment: &str) -> impl Iterator<Item = &str> {
    let bytes = segment.as_bytes();
    let mut start = 0;
    let mut index = 1;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        while index < bytes.len() {
            let hump = bytes[index - 1].is_ascii_lowercase() && bytes[index].is_ascii_uppercase();
            index += 1;
            if hump {
                let word = &segment[start..index - 1];
                start = index - 1;
                return Some(word);
            }
        }
        let word = &segment[start..];
        start = bytes.len();
        Some(word)
    })
}
