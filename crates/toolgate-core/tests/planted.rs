//! Every secret kind planted after every printable ASCII character and in every JSON position
//! (object key, value, nested value, array element, JSON quoted inside a string), redacted in
//! both modes: no pattern may hide another's match. All samples are fabricated or published
//! test values, never real credentials.

use proptest::prelude::*;
use serde_json::{Value, json};
use toolgate_core::Redactor;

/// How a sample may legitimately stop being the same token when a character is glued before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Glue {
    /// Found after any character: the pattern has a distinctive prefix and no leading boundary.
    Never,
    /// Starts with a word boundary: a letter, digit or `_` before it makes it part of a longer
    /// word, which is not the token.
    Word,
    /// A number: a word character before it makes it part of a longer word (an id), and `-`,
    /// `.` or `/` a piece of a dashed id, a decimal or a path.
    Number,
    /// The AWS secret key: exactly 40 base64 characters, so a base64 character (or `=`) before
    /// it makes a 41-character run, which is not a key.
    Base64Run,
}

/// One secret kind: what is planted, the part that must not survive, whether only the output
/// mode removes it, and which glued characters make it another token.
#[derive(Clone, Copy, Debug)]
struct Sample {
    name: &'static str,
    /// What comes before the glued character: the context some kinds need.
    lead: &'static str,
    text: &'static str,
    secret: &'static str,
    pii: bool,
    glue: Glue,
}

const fn sample(
    name: &'static str,
    text: &'static str,
    secret: &'static str,
    glue: Glue,
) -> Sample {
    Sample {
        name,
        lead: "",
        text,
        secret,
        pii: false,
        glue,
    }
}

const fn personal(name: &'static str, text: &'static str, glue: Glue) -> Sample {
    Sample {
        name,
        lead: "",
        text,
        secret: text,
        pii: true,
        glue,
    }
}

const SAMPLES: &[Sample] = &[
    sample(
        "jwt with a 40-character header",
        "eyJhbGciOiAiSFMyNTYiLCAidHlwIjogIkpXVCJ9.eyJzdWIiOiAiMTIzNDU2Nzg5MCJ9.c2lnbmF0dXJlX2hlcmVfMTIzNDU2",
        "eyJhbGciOiAiSFMyNTYiLCAidHlwIjogIkpXVCJ9.eyJzdWIiOiAiMTIzNDU2Nzg5MCJ9.c2lnbmF0dXJlX2hlcmVfMTIzNDU2",
        Glue::Never,
    ),
    sample(
        "jwt with a 36-character header",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
        Glue::Never,
    ),
    sample(
        "aws access key id",
        "AKIAIOSFODNN7EXAMPLE",
        "AKIAIOSFODNN7EXAMPLE",
        Glue::Never,
    ),
    // A bare 40-character key is a secret only with AWS mentioned nearby.
    Sample {
        lead: "aws secret key ",
        ..sample(
            "aws secret access key",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            Glue::Base64Run,
        )
    },
    sample(
        "slack bot token",
        "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        Glue::Never,
    ),
    sample(
        "slack app token",
        "xapp-1-A0123456789-1234567890123-abcdef0123456789abcdef",
        "xapp-1-A0123456789-1234567890123-abcdef0123456789abcdef",
        Glue::Never,
    ),
    sample(
        "slack webhook",
        "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
        "T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
        Glue::Never,
    ),
    sample(
        "shopify token",
        "shpat_0123456789abcdef0123456789abcdef",
        "0123456789abcdef0123456789abcdef",
        Glue::Never,
    ),
    sample(
        "github token",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "abcdefghijklmnopqrstuvwxyz0123456789",
        Glue::Never,
    ),
    sample(
        "github fine-grained token",
        "github_pat_11ABCDEFG0123456789abc_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVW",
        "11ABCDEFG0123456789abc_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVW",
        Glue::Never,
    ),
    sample(
        "stripe key",
        "sk_live_51Hq8sK2eZvKYlo2C0123456789abcdef",
        "51Hq8sK2eZvKYlo2C0123456789abcdef",
        Glue::Word,
    ),
    sample(
        "openai-style key",
        "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789",
        "abcdefghijklmnopqrstuvwxyz0123456789",
        Glue::Word,
    ),
    sample(
        "google api key",
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
        "SyA1234567890abcdefghijklmnopqrstuv",
        Glue::Never,
    ),
    sample(
        "pem private key",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq0J9Qwertyuiop\n-----END RSA PRIVATE KEY-----",
        "MIIEpAIBAAKCAQEA7bq0J9Qwertyuiop",
        Glue::Never,
    ),
    sample(
        "bearer token",
        "Bearer 9f8e7d6c5b4a3210ZYXWVUTS",
        "9f8e7d6c5b4a3210ZYXWVUTS",
        Glue::Word,
    ),
    sample(
        "url userinfo",
        "https://admin:hunter2pass@db.example.com/app",
        "admin:hunter2pass",
        Glue::Word,
    ),
    sample(
        "credential pair",
        "password=correcthorse42battery",
        "correcthorse42battery",
        Glue::Never,
    ),
    sample(
        "card, grouped",
        "4111 1111 1111 1111",
        "4111 1111 1111 1111",
        Glue::Number,
    ),
    sample(
        "card, bare",
        "4111111111111111",
        "4111111111111111",
        Glue::Number,
    ),
    sample("ssn", "123-45-6789", "123-45-6789", Glue::Number),
    sample("ein", "12-3456789", "12-3456789", Glue::Number),
    personal("email", "alice.smith@example.com", Glue::Never),
    personal("phone", "+1 650 253 0000", Glue::Number),
    personal("iban", "DE89 3704 0044 0532 0130 00", Glue::Word),
];

/// Whether `c` before the sample makes it a different token (see [`Glue`]).
fn glued(glue: Glue, c: char) -> bool {
    let word = c.is_ascii_alphanumeric() || c == '_';
    match glue {
        Glue::Never => false,
        Glue::Word => word,
        Glue::Number => word || matches!(c, '-' | '.' | '/'),
        Glue::Base64Run => c.is_ascii_alphanumeric() || matches!(c, '/' | '+' | '='),
    }
}

/// The text planted in a JSON document: a sample after `c`, bare or inside prose.
fn texts(sample: &Sample, c: char) -> Vec<String> {
    let (lead, text) = (sample.lead, sample.text);
    vec![
        format!("{lead}{c}{text}"),
        format!("note {lead}{c}{text} end"),
        format!("token {lead}{c}{text}"),
        format!("AWS {lead}{c}{text}."),
    ]
}

/// Each JSON position a text can take.
fn documents(text: &str) -> Vec<Value> {
    let quoted = json!({ "detail": text }).to_string();
    vec![
        json!({ text: 1 }),
        json!({ "note": text }),
        json!({ "outer": { "inner": text } }),
        json!([text]),
        json!({ "items": ["plain", { "deep": [text] }] }),
        json!({ "body": quoted }),
    ]
}

fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(text) => out.push(text.clone()),
        Value::Array(items) => items.iter().for_each(|item| strings(item, out)),
        Value::Object(map) => {
            for (key, field) in map {
                out.push(key.clone());
                strings(field, out);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// A piece of the secret that survived in `redacted`, if any: any 10 consecutive characters
/// (all of it when shorter) count.
fn survivor(secret: &str, redacted: &Value) -> Option<String> {
    let mut found = Vec::new();
    strings(redacted, &mut found);
    let chars: Vec<char> = secret.chars().collect();
    let width = chars.len().min(10);
    let pieces: Vec<String> = chars.windows(width).map(|w| w.iter().collect()).collect();
    found
        .into_iter()
        .find(|text| pieces.iter().any(|piece| text.contains(piece.as_str())))
}

/// Everything wrong with one planted text, in each mode that must remove it.
fn check(redactor: &Redactor, sample: &Sample, text: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for document in documents(text) {
        let output = redactor.redact_output_json(&document);
        if let Some(kept) = survivor(sample.secret, &output) {
            failures.push(format!(
                "{}: output mode kept {kept:?} of {document}",
                sample.name
            ));
        }
        if !sample.pii {
            let input = redactor.redact_json(&document);
            if let Some(kept) = survivor(sample.secret, &input) {
                failures.push(format!(
                    "{}: input mode kept {kept:?} of {document}",
                    sample.name
                ));
            }
        }
    }
    failures
}

#[test]
fn every_secret_is_redacted_after_every_printable_character_in_every_position() {
    let redactor = Redactor::new();
    let mut failures = Vec::new();
    let mut planted = 0;
    let mut summary: std::collections::BTreeMap<&str, Vec<char>> = Default::default();
    for sample in SAMPLES {
        for c in (b' '..=b'~').map(char::from) {
            if glued(sample.glue, c) {
                continue;
            }
            for text in texts(sample, c) {
                planted += 1;
                let found = check(&redactor, sample, &text);
                if !found.is_empty() {
                    summary.entry(sample.name).or_default().push(c);
                }
                failures.extend(found);
            }
        }
    }
    eprintln!(
        "planted {planted} texts in 6 positions, {} failures",
        failures.len()
    );
    for (name, chars) in &mut summary {
        chars.dedup();
        eprintln!("{name}: after {:?}", chars.iter().collect::<String>());
    }
    assert!(
        failures.is_empty(),
        "{} failures: {:#?}",
        failures.len(),
        &failures[..failures.len().min(40)]
    );
}

#[test]
fn the_reported_jwt_is_redacted_after_a_space_or_a_quote() {
    let jwt = SAMPLES[0].text;
    assert_eq!(jwt.split('.').next().map(str::len), Some(40));
    let redactor = Redactor::new();
    for text in [
        format!("token {jwt}"),
        format!("\"token {jwt}\""),
        format!("'{jwt}"),
    ] {
        let redacted = redactor.redact_text(&text);
        assert!(!redacted.contains("eyJ"), "{text:?} -> {redacted:?}");
    }
}

/// Printable ASCII, the characters around a planted secret in the property test.
fn printable(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(b' '..=b'~', 0..max)
        .prop_map(|bytes| bytes.into_iter().map(char::from).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Random printable text around a sample, with a separator that cannot glue to it.
    #[test]
    fn secrets_survive_no_surrounding_text(
        index in 0..SAMPLES.len(),
        before in printable(12),
        separator in prop_oneof![Just(": "), Just("\""), Just("'"), Just("("), Just("\n"), Just(", "), Just("\t")],
        after in printable(12),
        position in 0usize..6,
    ) {
        let sample = &SAMPLES[index];
        let text = format!("{before}{}{separator}{}, {after}", sample.lead, sample.text);
        let document = documents(&text).swap_remove(position);
        let redactor = Redactor::new();
        let output = redactor.redact_output_json(&document);
        prop_assert!(survivor(sample.secret, &output).is_none(), "{}: output kept it in {}", sample.name, output);
        if !sample.pii {
            let input = redactor.redact_json(&document);
            prop_assert!(survivor(sample.secret, &input).is_none(), "{}: input kept it in {}", sample.name, input);
        }
    }
}
