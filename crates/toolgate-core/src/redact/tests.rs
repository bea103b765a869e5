//! Unit tests of the redactor: field names, the modes, and the original pattern cases.

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

#[test]
fn field_names_are_classified() {
    let cases: &[(&str, bool)] = &[
        ("apiKey", true),
        ("X-Api-Key", true),
        ("api_key", true),
        ("client_secret", true),
        ("Set-Cookie", true),
        ("Authorization", true),
        ("password", true),
        ("PASSWD", true),
        ("passphrase", true),
        ("accessKeyId", true),
        ("AWS_SECRET_ACCESS_KEY", true),
        ("private-key", true),
        ("access_token", true),
        ("refreshToken", true),
        ("admin_token", true),
        ("account_token", true),
        ("credentials", true),
        ("x-hub-signature-256", true),
        ("max_tokens", false),
        ("maxTokens", false),
        ("max_output_tokens", false),
        ("token_count", false),
        ("tokens_used", false),
        ("prompt_tokens", false),
        ("completion_tokens", false),
        ("total_tokens", false),
        ("promptTokenCount", false),
        ("cache_read_input_tokens", false),
        ("order_id", false),
        ("quantity", false),
        ("classname", false),
        ("email", false),
    ];
    let redactor = Redactor::new();
    for (name, sensitive) in cases {
        assert_eq!(redactor.is_sensitive_field(name), *sensitive, "{name}");
    }
}

#[test]
fn counters_and_harmless_values_stay_readable() {
    let input = json!({
        "max_tokens": 1024,
        "usage": {"input_tokens": 12, "output_tokens": 34, "tokens": 46},
        "token": 123456,
        "token_string": "abc",
        "has_password": true,
        "password": false,
    });
    let out = Redactor::new().redact_json(&input);
    assert_eq!(
        out,
        json!({
            "max_tokens": 1024,
            "usage": {"input_tokens": 12, "output_tokens": 34, "tokens": 46},
            "token": 123456,
            "token_string": REDACTED,
            "has_password": true,
            "password": false,
        })
    );
}

#[test]
fn output_mode_also_removes_personal_data() {
    let value = json!({
        "email": "alice@example.com",
        "customer": {"first_name": "Alice", "phone": "6502530000", "email_verified": true},
        "shipping_address": {"address1": "1600 Amphitheatre Parkway", "zip": "94043", "city": "Mountain View"},
        "billing_address": "1600 Amphitheatre Parkway, Mountain View, CA 94043",
        "ip_address": "192.168.1.10",
        "note": "call +1 650 253 0000",
        "card": 4111111111111111u64,
        "id": 5123456789012u64,
    });
    let redactor = Redactor::new();
    assert_eq!(
        redactor.redact_output_json(&value),
        json!({
            "email": REDACTED_EMAIL,
            "customer": {"first_name": REDACTED_NAME, "phone": REDACTED_PHONE, "email_verified": true},
            "shipping_address": {"address1": REDACTED_ADDRESS, "zip": "94043", "city": "Mountain View"},
            "billing_address": "[REDACTED ADDRESS] 94043",
            "ip_address": "192.168.1.10",
            "note": "call [REDACTED PHONE]",
            "card": REDACTED,
            "id": 5123456789012u64,
        })
    );
    let input = redactor.redact_json(&value);
    assert_eq!(
        input["email"], "alice@example.com",
        "inputs keep personal data"
    );
    assert_eq!(input["card"], REDACTED, "cards are secrets in both modes");
}

#[test]
fn aws_context_comes_from_the_enclosing_object() {
    let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    let redactor = Redactor::new();
    let with_context = json!({"aws": {"key": secret}});
    assert_eq!(
        redactor.redact_json(&with_context),
        json!({"aws": {"key": REDACTED}})
    );
    let sibling = json!({"id": "AKIAIOSFODNN7EXAMPLE", "key": secret});
    assert_eq!(
        redactor.redact_json(&sibling),
        json!({"id": REDACTED, "key": REDACTED})
    );
    let without = json!({"blob": secret});
    assert_eq!(
        redactor.redact_json(&without),
        without,
        "a lone 40-char string is kept"
    );
}

#[test]
fn keys_are_scanned_too() {
    let value = json!({"ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789": 1});
    assert_eq!(Redactor::new().redact_json(&value), json!({REDACTED: 1}));
}

#[test]
fn unmatched_text_is_borrowed() {
    let redactor = Redactor::new();
    for text in [
        "",
        "short",
        "order #1001 shipped on 2024-01-15",
        "Reset your password",
    ] {
        assert!(
            matches!(redactor.redact_output_text(text), Cow::Borrowed(_)),
            "{text}"
        );
    }
}

#[test]
fn a_slack_webhook_path_alone_is_redacted() {
    let logged = "POST hooks host path=/services/T0AB12CD3/B0XY98ZW7/aBcDeFgHiJkLmNoPqRsTuVwX";
    let redacted = Redactor::new().redact_text(logged);
    assert!(!redacted.contains("aBcDeFgHiJkLmNoPqRsTuVwX"), "{redacted}");
    assert!(redacted.contains("/services/"), "{redacted}");
}

#[test]
fn excerpts_are_redacted_whole_and_cut_between_words() {
    let token = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";
    // (text, max characters, the excerpt expected)
    let cases: Vec<(String, usize, String)> = vec![
        ("short".into(), 10, "short".into()),
        // The cut falls inside a token: redacted before the cut, so only the marker is cut,
        // and it is dropped whole.
        (
            format!("see {token} now"),
            12,
            format!("see [{} bytes omitted]", "[REDACTED] now".len()),
        ),
        // The cut falls inside a plain word: the word goes.
        (
            "alpha beta gamma".into(),
            8,
            "alpha [10 bytes omitted]".into(),
        ),
        // Between words: nothing to drop.
        (
            "alpha beta gamma".into(),
            6,
            "alpha [10 bytes omitted]".into(),
        ),
        // Characters, not bytes: `é` is two bytes.
        ("éé éé éé".into(), 4, "éé [9 bytes omitted]".into()),
        // One word longer than the excerpt: nothing of it is kept.
        ("x".repeat(50), 10, "[50 bytes omitted]".into()),
    ];
    let redactor = Redactor::new();
    for (text, max, expected) in cases {
        assert_eq!(redactor.redact_excerpt(&text, max), expected, "{text:?}");
    }
}

#[test]
fn no_pattern_hides_another() {
    // (text, what must be gone, what must stay)
    let cases: &[(&str, &str, &str)] = &[
        // A 40-character JWT header after a space looked like a rejected AWS secret key.
        (
            "token eyJhbGciOiAiSFMyNTYiLCAidHlwIjogIkpXVCJ9.eyJzdWIiOiAiMTIzNDU2Nzg5MCJ9.c2ln",
            "eyJ",
            "token ",
        ),
        // The same 40-character run holding a Google key one character in.
        ("x+AIzaSyA1234567890abcdefghijklmnopqrstuv", "AIza", "x+"),
        // A pair's value stops at the first space; the card it starts runs on.
        ("token =4111 1111 1111 1111 end", "1111", " end"),
        // A secret inside a pair's name, replaced or not.
        ("AKIAIOSFODNN7EXAMPLE_token=abc", "AKIA", "_token="),
        ("AKIAIOSFODNN7EXAMPLE_max_tokens=5", "AKIA", "max_tokens=5"),
        // A `\n` escape separates words.
        (
            r#"{\"detail\":\"\nsk_live_51Hq8sK2eZvKYlo2C0123456789abcdef\"}"#,
            "sk_live",
            r"\n",
        ),
    ];
    let redactor = Redactor::new();
    for (text, gone, kept) in cases {
        for redacted in [
            redactor.redact_text(text),
            redactor.redact_output_text(text),
        ] {
            assert!(!redacted.contains(gone), "{text:?} -> {redacted:?}");
            assert!(redacted.contains(kept), "{text:?} -> {redacted:?}");
        }
    }
}
