//! The redaction corpus (true and false positives, with rates asserted) and a property test that
//! hides generated secrets in random JSON. All samples are
//! fabricated or published test values, never real credentials.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use toolgate_core::Redactor;

/// Which redaction a corpus entry needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A credential: both `redact_text` and `redact_output_text` must remove it.
    Secret,
    /// Personal data: `redact_output_text` must remove it.
    Pii,
}

/// (mode, text, the substring that must be gone).
const TRUE_POSITIVES: &[(Mode, &str, &str)] = &[
    // AWS access key ids and secret keys.
    (
        Mode::Secret,
        "key AKIAIOSFODNN7EXAMPLE here",
        "AKIAIOSFODNN7EXAMPLE",
    ),
    (Mode::Secret, "ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A"),
    (
        Mode::Secret,
        "id=ABIA0123456789ABCDEF;",
        "ABIA0123456789ABCDEF",
    ),
    (
        Mode::Secret,
        "(ACCAZZZZ1111YYYY2222)",
        "ACCAZZZZ1111YYYY2222",
    ),
    (
        Mode::Secret,
        "aws keys: AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    (
        Mode::Secret,
        "AWS_SECRET_ACCESS_KEY=je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
        "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
    ),
    (
        Mode::Secret,
        "the secret half is Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdo",
        "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdo",
    ),
    // Slack tokens and webhooks.
    (
        Mode::Secret,
        "tok xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx end",
        "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    ),
    (
        Mode::Secret,
        "xoxp-2222222222-3333333333-4444444444-0123456789abcdef0123456789abcdef",
        "xoxp-2222222222-3333333333-4444444444",
    ),
    (
        Mode::Secret,
        "app token xapp-1-A0123456789-1234567890123-abcdef0123456789abcdef",
        "xapp-1-A0123456789",
    ),
    (
        Mode::Secret,
        "refresh xoxe.xoxp-1-Mi0yLTEyMzQ1Njc4OTAxMi0xMjM0NTY3ODkw",
        "Mi0yLTEyMzQ1Njc4OTAxMi0xMjM0NTY3ODkw",
    ),
    (
        Mode::Secret,
        "xoxe-1-My0xLTEyMzQ1Njc4OTAxMi0xMjM0",
        "My0xLTEyMzQ1Njc4OTAxMi0xMjM0",
    ),
    (
        Mode::Secret,
        "legacy xoxa-2-123456789012-abcdefghijkl",
        "xoxa-2-123456789012-abcdefghijkl",
    ),
    (
        Mode::Secret,
        "xoxr-123456789012-abcdefghijklmnop",
        "xoxr-123456789012-abcdefghijklmnop",
    ),
    (
        Mode::Secret,
        "post to https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX now",
        "T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    ),
    (
        Mode::Secret,
        "https://hooks.slack.com/workflows/T012AB3C4D5/A012ABCDEF/123456789012345678/AbCdEfGh",
        "T012AB3C4D5/A012ABCDEF",
    ),
    // Shopify.
    (
        Mode::Secret,
        "shpat_0123456789abcdef0123456789abcdef",
        "0123456789abcdef0123456789abcdef",
    ),
    (
        Mode::Secret,
        "X-Shopify: 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",
        "fedcba9876543210fedcba9876543210",
    ),
    (
        Mode::Secret,
        "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",
        "00112233445566778899aabbccddeeff",
    ),
    (
        Mode::Secret,
        "secret shpss_ABCDEF0123456789ABCDEF0123456789.",
        "ABCDEF0123456789ABCDEF0123456789",
    ),
    // GitHub.
    (
        Mode::Secret,
        "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
        "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    ),
    (
        Mode::Secret,
        "token gho_16C7e42F292c6912E7710c838347Ae178B4a",
        "gho_16C7e42F292c6912E7710c838347Ae178B4a",
    ),
    (
        Mode::Secret,
        "ghu_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA1",
        "ghu_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA1",
    ),
    (
        Mode::Secret,
        "ghs_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz99",
        "ghs_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz99",
    ),
    (
        Mode::Secret,
        "ghr_1234567890abcdefghij1234567890ABCDEF",
        "ghr_1234567890abcdefghij1234567890ABCDEF",
    ),
    (
        Mode::Secret,
        "github_pat_11ABCDEFG0123456789abc_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVW",
        "github_pat_11ABCDEFG0123456789abc",
    ),
    (
        Mode::Secret,
        "git clone https://x-access-token:ghs_notreallyatoken123@github.com/o/r",
        "ghs_notreallyatoken123",
    ),
    // JWTs.
    (
        Mode::Secret,
        "jwt eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    ),
    (
        Mode::Secret,
        "id_token=eyJraWQiOiIxIn0.eyJpc3MiOiJodHRwczovL2lkcCJ9.c2lnbmF0dXJlMTIz",
        "eyJpc3MiOiJodHRwczovL2lkcCJ9",
    ),
    (
        Mode::Secret,
        "unsigned eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
        "eyJzdWIiOiJ4In0",
    ),
    // PEM private keys.
    (
        Mode::Secret,
        "x -----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAfabricatedKeyMaterial\nmoreLines==\n-----END RSA PRIVATE KEY----- y",
        "fabricatedKeyMaterial",
    ),
    (
        Mode::Secret,
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAAfabricated\n-----END OPENSSH PRIVATE KEY-----",
        "b3BlbnNzaC1rZXktdjEAAAAAfabricated",
    ),
    (
        Mode::Secret,
        "-----BEGIN PRIVATE KEY-----\\nMIGHAgEAMBMGByqGSM49fabricated\\n-----END PRIVATE KEY-----",
        "MIGHAgEAMBMGByqGSM49fabricated",
    ),
    (
        Mode::Secret,
        "truncated -----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIfabricatedCutOff",
        "MHcCAQEEIfabricatedCutOff",
    ),
    // Authorization values.
    (
        Mode::Secret,
        "Authorization: Bearer abc123def456ghi789",
        "abc123def456ghi789",
    ),
    (
        Mode::Secret,
        "curl -H 'Authorization: Basic dXNlcjpwYXNzd29yZA=='",
        "dXNlcjpwYXNzd29yZA",
    ),
    (
        Mode::Secret,
        "sent bearer 9f8e7d6c5b4a39281706 upstream",
        "9f8e7d6c5b4a39281706",
    ),
    (Mode::Secret, "Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    (
        Mode::Secret,
        "proxy-authorization=Digest abcdef0123456789",
        "abcdef0123456789",
    ),
    // Credential-named pairs in text, query strings and URL userinfo.
    (Mode::Secret, "password=hunter2", "hunter2"),
    (
        Mode::Secret,
        r#"{"password": "correct horse battery staple"}"#,
        "correct horse battery staple",
    ),
    (
        Mode::Secret,
        r#"{\"client_secret\":\"s3cr3t-v4lue\"}"#,
        "s3cr3t-v4lue",
    ),
    (Mode::Secret, "X-Api-Key: 1f2e3d4c5b6a", "1f2e3d4c5b6a"),
    (
        Mode::Secret,
        "Set-Cookie: session=abc123xyz; Path=/",
        "abc123xyz",
    ),
    (
        Mode::Secret,
        "https://api.example.com/v1/orders?limit=5&access_token=abcd1234efgh&page=2",
        "abcd1234efgh",
    ),
    (
        Mode::Secret,
        "GET /cb?api_key=XyZ987654321 HTTP/1.1",
        "XyZ987654321",
    ),
    (
        Mode::Secret,
        "https://s3.example.com/b/o?X-Amz-Credential=AKIDEXAMPLE%2F20240101&X-Amz-Signature=0a1b2c3d4e5f",
        "0a1b2c3d4e5f",
    ),
    (
        Mode::Secret,
        "postgres://admin:hunter2pass@db.internal:5432/app",
        "hunter2pass",
    ),
    (
        Mode::Secret,
        "https://user:p4ssw0rd@example.com/path",
        "p4ssw0rd",
    ),
    // Other vendor keys.
    (
        Mode::Secret,
        "stripe sk_live_51H8abcdEFGHijklMNOPqrst",
        "sk_live_51H8abcdEFGHijklMNOPqrst",
    ),
    (
        Mode::Secret,
        "OPENAI sk-proj-abcdefghijklmnopqrstuvwxyz012345",
        "abcdefghijklmnopqrstuvwxyz012345",
    ),
    (
        Mode::Secret,
        "key=AIzaSyA1234567890abcdefghijklmnopqrstuv",
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    ),
    // Luhn-valid card numbers (published test numbers).
    (
        Mode::Secret,
        "card 4111111111111111 exp 12/29",
        "4111111111111111",
    ),
    (Mode::Secret, "5555 5555 5555 4444", "5555 5555 5555 4444"),
    (Mode::Secret, "amex 3782-822463-10005.", "3782-822463-10005"),
    (Mode::Secret, "378282246310005", "378282246310005"),
    (
        Mode::Secret,
        "disc 6011-1111-1111-1117",
        "6011-1111-1111-1117",
    ),
    (Mode::Secret, "mc2 2223003122003222", "2223003122003222"),
    (Mode::Secret, "visa13 4222222222222", "4222222222222"),
    (Mode::Secret, "(4012888888881881)", "4012888888881881"),
    // SSNs, ITINs and EINs.
    (Mode::Secret, "SSN 123-45-6789", "123-45-6789"),
    (Mode::Secret, "ssn: 078-05-1120.", "078-05-1120"),
    (Mode::Secret, "219-09-9999", "219-09-9999"),
    (Mode::Secret, "ITIN 912-70-1234", "912-70-1234"),
    (Mode::Secret, "EIN 12-3456789", "12-3456789"),
    (Mode::Secret, "tax id 98-7654321;", "98-7654321"),
    (Mode::Secret, "45-1234567", "45-1234567"),
    // Personal data in outputs.
    (
        Mode::Pii,
        "contact alice.smith@example.com today",
        "alice.smith@example.com",
    ),
    (
        Mode::Pii,
        "bob+orders@shop.example.co.uk",
        "bob+orders@shop.example.co.uk",
    ),
    (
        Mode::Pii,
        "<carol_99@mail.example.org>",
        "carol_99@mail.example.org",
    ),
    (Mode::Pii, "call +1 650 253 0000", "650 253 0000"),
    (Mode::Pii, "+14155552671", "4155552671"),
    (Mode::Pii, "phone (415) 555-2671", "555-2671"),
    (Mode::Pii, "415-555-2671", "415-555-2671"),
    (Mode::Pii, "415.555.2671", "415.555.2671"),
    (Mode::Pii, "+44 20 7946 0958", "7946 0958"),
    (Mode::Pii, "tel 020 7946 0958", "020 7946 0958"),
    (Mode::Pii, "mobile 07700 900123", "07700 900123"),
    (Mode::Pii, "+49 30 12345678", "12345678"),
    (Mode::Pii, "06 12 34 56 78", "06 12 34 56 78"),
    (
        Mode::Pii,
        "1600 Amphitheatre Parkway, Mountain View, CA 94043",
        "1600 Amphitheatre Parkway",
    ),
    (
        Mode::Pii,
        "ship to 350 Fifth Avenue, New York, NY 10118",
        "350 Fifth Avenue",
    ),
    (
        Mode::Pii,
        "221B Baker Street, London NW1 6XE",
        "221B Baker Street",
    ),
    (
        Mode::Pii,
        "1 Infinite Loop, Cupertino, CA 95014",
        "1 Infinite Loop",
    ),
    (
        Mode::Pii,
        "123 N Main St, Apt 4B, Springfield, IL 62701",
        "123 N Main St, Apt 4B",
    ),
    (Mode::Pii, "Hauptstraße 5, 10115 Berlin", "Hauptstraße 5"),
    (
        Mode::Pii,
        "IBAN GB82 WEST 1234 5698 7654 32",
        "GB82 WEST 1234 5698 7654 32",
    ),
    (
        Mode::Pii,
        "DE89370400440532013000",
        "DE89370400440532013000",
    ),
];

/// Texts that must come out of both modes unchanged.
const FALSE_POSITIVES: &[&str] = &[
    "#1001",
    "Order #1001 shipped",
    "order 5123456789012 created",
    "https://shop.example.com/admin/orders/5123456789012",
    "gid://shopify/Product/7891234567890",
    "tracking 1Z999AA10123456784",
    "USPS 9400111899223856929484",
    "9400 1118 9922 3856 9294 84",
    "EC2 instance i-0abcd1234ef567890 in us-east-1",
    "i-1234567890abcdef0",
    "request 550e8400-e29b-41d4-a716-446655440000",
    "x-request-id: 4716-446655440000",
    "req_01HZX3J5K7M9P1Q3R5T7V9W1Y3",
    "trace 12345678-1234-1234-1234-123456789012",
    "total $1,234.56",
    "€99.00 incl. VAT",
    "2024-01-15",
    "2024-01-15T10:30:00Z",
    "created_at 2024-01-15 10:30:00.123",
    "reset your password in settings",
    "Please reset your password in settings.",
    "the token expired, please sign in again",
    "Your API key is shown only once",
    "The cookie banner was dismissed",
    "authorization pending approval",
    "Set a strong passphrase for the vault",
    "Token usage was 1,234 tokens",
    "max_tokens=1024",
    "tokens_used: 512",
    "Bearer of bad news",
    "Basic authentication is disabled",
    "commit e83c5163316f89bfbde7d9ab23ca2e25604af290",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "blob QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNk",
    "version 1.2.3",
    "host 192.168.1.10",
    "10.0.0.1:8080",
    "https://example.com/orders?page=2&limit=50",
    "Amazon order 112-3456789-1234567",
    "SKU-12-3456789",
    "Invoice INV-2024-000123",
    "Line 1600 of 2000",
    "1,000,000 requests served",
    "epoch ms 1700000000000",
    "port 5432",
    "HTTP 404 Not Found",
    "ISBN 978-3-16-148410-0",
    "arn:aws:iam::123456789012:role/deploy",
    "git@github.com:org/repo.git",
    "user@localhost",
    "npm install lodash@4.17.21",
    "@scope/pkg@1.2.3",
    "call at 10:30",
    "3 items in cart",
    "Route 66",
    "price: 19.99 USD",
    "phone numbers are hidden",
    "The address was updated",
    "order ids 1001, 1002, 1003",
    "weight 1.250 kg",
    "range 100-200",
    "2024 sales were 1234567",
    "ticket 000-00-0000",
    "area 666-12-3456",
    "temp 900-12-3456",
    "prefix 00-1234567",
    "from 9:00 to 17:00",
    "+5 points",
    "score +100",
];

fn check_true_positive(redactor: &Redactor, mode: Mode, text: &str, secret: &str) -> Vec<String> {
    let mut failures = Vec::new();
    let output = redactor.redact_output_text(text);
    if output.contains(secret) {
        failures.push(format!("output mode kept {secret:?} in {output:?}"));
    }
    if mode == Mode::Secret {
        let input = redactor.redact_text(text);
        if input.contains(secret) {
            failures.push(format!("input mode kept {secret:?} in {input:?}"));
        }
        let json = redactor.redact_json(&json!({ "note": text }));
        if json["note"].as_str().unwrap_or_default().contains(secret) {
            failures.push(format!("json mode kept {secret:?} in {json}"));
        }
    }
    failures
}

#[test]
fn every_true_positive_is_redacted() {
    let redactor = Redactor::new();
    let failures: Vec<String> = TRUE_POSITIVES
        .iter()
        .flat_map(|(mode, text, secret)| check_true_positive(&redactor, *mode, text, secret))
        .collect();
    let samples = TRUE_POSITIVES.len();
    eprintln!(
        "true positives: {samples} samples, {} misses",
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn false_positives_stay_readable() {
    let redactor = Redactor::new();
    let touched: Vec<String> = FALSE_POSITIVES
        .iter()
        .filter_map(|text| {
            let input = redactor.redact_text(text);
            let output = redactor.redact_output_text(text);
            (input != *text || output != *text).then(|| format!("{text:?} -> {output:?}"))
        })
        .collect();
    let rate = touched.len() * 1000 / FALSE_POSITIVES.len();
    eprintln!(
        "false positives: {} samples, {} touched ({}.{}%)",
        FALSE_POSITIVES.len(),
        touched.len(),
        rate / 10,
        rate % 10
    );
    assert!(rate <= 10, "more than 1% touched: {touched:#?}");
    assert!(touched.is_empty(), "{touched:#?}");
}

/// Expected outputs where the shape of the result matters, not only the secret's absence.
#[test]
fn redactions_keep_the_readable_parts() {
    let cases: &[(&str, &str)] = &[
        (
            "https://api.example.com/v1/orders?limit=5&access_token=abcd1234efgh&page=2",
            "https://api.example.com/v1/orders?limit=5&access_token=[REDACTED]&page=2",
        ),
        (
            "postgres://admin:hunter2pass@db.internal:5432/app",
            "postgres://[REDACTED]@db.internal:5432/app",
        ),
        (
            "1600 Amphitheatre Parkway, Mountain View, CA 94043",
            "[REDACTED ADDRESS] 94043",
        ),
        (
            "ship to 221B Baker Street, London NW1 6XE today",
            "ship to [REDACTED ADDRESS] NW1 6XE today",
        ),
        (
            r#"{"password": "hunter 2", "user": "bob"}"#,
            r#"{"password": "[REDACTED]", "user": "bob"}"#,
        ),
        (
            "Authorization: Bearer abc.def-ghi",
            "Authorization: [REDACTED]",
        ),
        (
            "post to https://hooks.slack.com/services/T0/B0/XXXXXXXX",
            "post to https://hooks.slack.com/services/[REDACTED]",
        ),
        (
            "mail alice@example.com or call +1 650 253 0000",
            "mail [REDACTED EMAIL] or call [REDACTED PHONE]",
        ),
    ];
    let redactor = Redactor::new();
    for (input, expected) in cases {
        assert_eq!(redactor.redact_output_text(input), *expected, "{input}");
    }
}

// ---- property test: generated secrets hidden in random JSON ----

/// A generated secret: the text to embed and the part that must not survive.
#[derive(Clone, Debug)]
struct Planted {
    embedded: String,
    secret: String,
    pii: bool,
}

fn planted(embedded: String, secret: String, pii: bool) -> Planted {
    Planted {
        embedded,
        secret,
        pii,
    }
}

fn same(secret: String) -> Planted {
    planted(secret.clone(), secret, false)
}

fn luhn_complete(mut digits: Vec<u32>) -> String {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            if i % 2 == 0 {
                let x = d * 2;
                if x > 9 { x - 9 } else { x }
            } else {
                *d
            }
        })
        .sum();
    digits.push((10 - sum % 10) % 10);
    digits
        .iter()
        .filter_map(|d| char::from_digit(*d, 10))
        .collect()
}

fn card() -> impl Strategy<Value = Planted> {
    let visa = proptest::collection::vec(0u32..10, 14).prop_map(|rest| {
        let mut digits = vec![4];
        digits.extend(rest);
        luhn_complete(digits)
    });
    let amex = (
        prop_oneof![Just(4u32), Just(7u32)],
        proptest::collection::vec(0u32..10, 12),
    )
        .prop_map(|(second, rest)| {
            let mut digits = vec![3, second];
            digits.extend(rest);
            luhn_complete(digits)
        });
    prop_oneof![
        visa.clone().prop_map(same),
        visa.clone().prop_map(|n| {
            let grouped = format!("{} {} {} {}", &n[0..4], &n[4..8], &n[8..12], &n[12..16]);
            same(grouped)
        }),
        visa.prop_map(|n| same(format!(
            "{}-{}-{}-{}",
            &n[0..4],
            &n[4..8],
            &n[8..12],
            &n[12..16]
        ))),
        amex.clone().prop_map(same),
        amex.prop_map(|n| same(format!("{} {} {}", &n[0..4], &n[4..10], &n[10..15]))),
    ]
}

fn secret() -> impl Strategy<Value = Planted> {
    let alnum =
        |n: usize| proptest::string::string_regex(&format!("[A-Za-z0-9]{{{n}}}")).expect("regex");
    let hex =
        |n: usize| proptest::string::string_regex(&format!("[0-9a-f]{{{n}}}")).expect("regex");
    let b64url = |range: &str| {
        proptest::string::string_regex(&format!("[A-Za-z0-9_-]{{{range}}}")).expect("regex")
    };
    prop_oneof![
        (
            prop_oneof![Just("AKIA"), Just("ASIA"), Just("ABIA"), Just("ACCA")],
            proptest::string::string_regex("[A-Z0-9]{16}").expect("regex")
        )
            .prop_map(|(p, s)| same(format!("{p}{s}"))),
        (
            proptest::string::string_regex("[A-Za-z0-9/+]{37}").expect("regex"),
            prop_oneof![Just("AWS secret key"), Just("aws"), Just("secret access")]
        )
            .prop_map(|(s, context)| {
                let key = format!("{s}Aa1");
                planted(format!("{context} {key}"), key, false)
            }),
        (
            prop_oneof![
                Just("xoxb"),
                Just("xoxp"),
                Just("xoxa"),
                Just("xoxr"),
                Just("xoxe")
            ],
            proptest::string::string_regex("[0-9]{10,12}").expect("regex"),
            alnum(24)
        )
            .prop_map(|(p, n, s)| same(format!("{p}-{n}-{n}-{s}"))),
        (
            alnum(10),
            proptest::string::string_regex("[0-9]{13}").expect("regex"),
            hex(64)
        )
            .prop_map(|(a, n, h)| same(format!("xapp-1-A{a}-{n}-{h}"))),
        (proptest::string::string_regex("T[A-Z0-9]{8,10}/B[A-Z0-9]{8,10}/[A-Za-z0-9]{24}")
            .expect("regex"))
        .prop_map(|path| planted(
            format!("https://hooks.slack.com/services/{path}"),
            path,
            false
        )),
        (
            prop_oneof![
                Just("shpat_"),
                Just("shpca_"),
                Just("shppa_"),
                Just("shpss_")
            ],
            hex(32)
        )
            .prop_map(|(p, h)| same(format!("{p}{h}"))),
        (
            prop_oneof![
                Just("ghp_"),
                Just("gho_"),
                Just("ghu_"),
                Just("ghs_"),
                Just("ghr_")
            ],
            alnum(36)
        )
            .prop_map(|(p, s)| same(format!("{p}{s}"))),
        (alnum(22), alnum(59)).prop_map(|(a, b)| same(format!("github_pat_{a}_{b}"))),
        (b64url("10,30"), b64url("10,60"), b64url("20,43"))
            .prop_map(|(h, p, s)| same(format!("eyJ{h}.eyJ{p}.{s}"))),
        (
            prop_oneof![Just("RSA "), Just("EC "), Just("OPENSSH "), Just("")],
            proptest::string::string_regex("[A-Za-z0-9+/]{20,64}").expect("regex")
        )
            .prop_map(|(kind, body)| planted(
                format!(
                    "-----BEGIN {kind}PRIVATE KEY-----\n{body}\n-----END {kind}PRIVATE KEY-----"
                ),
                body,
                false,
            )),
        (
            prop_oneof![Just("Bearer"), Just("bearer"), Just("Basic")],
            proptest::string::string_regex("[A-Za-z0-9+/]{12,40}").expect("regex")
        )
            .prop_map(|(scheme, token)| {
                let token = format!("{token}9");
                planted(format!("{scheme} {token}"), token, false)
            }),
        (
            prop_oneof![
                Just("password"),
                Just("api_key"),
                Just("X-Api-Key"),
                Just("client_secret"),
                Just("access_token"),
                Just("apiKey")
            ],
            prop_oneof![Just("="), Just(": "), Just("=\""), Just(": \"")],
            proptest::string::string_regex("[a-z0-9]{10,24}").expect("regex")
        )
            .prop_map(|(name, sep, value)| {
                let value = format!("{value}7");
                let close = if sep.ends_with('"') { "\"" } else { "" };
                planted(format!("{name}{sep}{value}{close}"), value, false)
            }),
        (
            prop_oneof![Just("token"), Just("api_key"), Just("access_token")],
            proptest::string::string_regex("[A-Za-z0-9]{12,30}").expect("regex")
        )
            .prop_map(|(name, value)| {
                let value = format!("{value}5");
                planted(
                    format!("https://api.example.com/x?page=2&{name}={value}&sort=asc"),
                    value,
                    false,
                )
            }),
        (
            proptest::string::string_regex("[a-z]{3,8}").expect("regex"),
            proptest::string::string_regex("[A-Za-z0-9]{8,20}").expect("regex")
        )
            .prop_map(|(user, pass)| planted(
                format!("https://{user}:{pass}@db.example.com/app"),
                pass,
                false
            )),
        card(),
        (1u32..900, 1u32..100, 1u32..10000)
            .prop_filter("valid area", |(area, _, _)| *area != 666)
            .prop_map(|(area, group, serial)| same(format!("{area:03}-{group:02}-{serial:04}"))),
        (
            prop_oneof![Just(12u32), Just(45u32), Just(98u32), Just(27u32)],
            0u32..10_000_000
        )
            .prop_map(|(prefix, rest)| same(format!("{prefix:02}-{rest:07}"))),
        pii(),
    ]
}

fn pii() -> impl Strategy<Value = Planted> {
    let word = |re: &str| proptest::string::string_regex(re).expect("regex");
    prop_oneof![
        (
            word("[a-z]{3,10}"),
            word("[a-z]{2,8}"),
            word("[a-z]{3,10}"),
            prop_oneof![Just("com"), Just("org"), Just("io")]
        )
            .prop_map(|(a, b, d, tld)| {
                let email = format!("{a}.{b}@{d}.{tld}");
                planted(email.clone(), email, true)
            }),
        (200u32..1000, 200u32..1000, 0u32..10000, 0usize..4).prop_map(
            |(area, exchange, line, format)| {
                let phone = match format {
                    0 => format!("+1 {area} {exchange} {line:04}"),
                    1 => format!("({area}) {exchange}-{line:04}"),
                    2 => format!("{area}-{exchange}-{line:04}"),
                    _ => format!("+1{area}{exchange}{line:04}"),
                };
                planted(phone.clone(), phone, true)
            }
        ),
        (
            1u32..20000,
            prop_oneof![
                Just("Main"),
                Just("Oak"),
                Just("Amphitheatre"),
                Just("Fifth"),
                Just("Elm")
            ],
            prop_oneof![
                Just("Street"),
                Just("Ave"),
                Just("Parkway"),
                Just("Rd"),
                Just("Blvd"),
                Just("Lane")
            ],
            prop_oneof![Just("Springfield"), Just("Mountain View"), Just("Austin")],
            10000u32..99999,
        )
            .prop_map(|(number, name, suffix, city, zip)| {
                let street = format!("{number} {name} {suffix}");
                planted(format!("{street}, {city}, TX {zip}"), street, true)
            }),
    ]
}

/// A random JSON skeleton whose leaves may carry planted secrets.
#[derive(Clone, Debug)]
enum Tree {
    Text(String),
    Number(i64),
    Planted(String, Planted, String),
    List(Vec<Tree>),
    Object(Vec<(String, Tree)>),
}

fn tree() -> impl Strategy<Value = Tree> {
    let prefix = (
        proptest::string::string_regex("[a-zA-Z ]{0,12}").expect("regex"),
        prop_oneof![
            Just(" "),
            Just("\n"),
            Just(": "),
            Just("("),
            Just("\""),
            Just(", "),
            Just("\t")
        ],
    )
        .prop_map(|(text, separator)| format!("{text}{separator}"));
    let suffix = (
        prop_oneof![
            Just(" "),
            Just("\n"),
            Just(", "),
            Just(")"),
            Just("\""),
            Just("; ")
        ],
        proptest::string::string_regex("[a-zA-Z ]{0,12}").expect("regex"),
    )
        .prop_map(|(separator, text)| format!("{separator}{text}"));
    let leaf = prop_oneof![
        proptest::string::string_regex("[a-zA-Z0-9 #.,:-]{0,24}")
            .expect("regex")
            .prop_map(Tree::Text),
        any::<i64>().prop_map(Tree::Number),
        (prefix, secret(), suffix).prop_map(|(p, s, x)| Tree::Planted(p, s, x)),
    ];
    let key = || proptest::string::string_regex("[a-z][a-z_]{0,10}").expect("regex");
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Tree::List),
            proptest::collection::vec((key(), inner), 0..6).prop_map(Tree::Object),
        ]
    })
}

fn build(tree: &Tree, planted: &mut Vec<Planted>) -> Value {
    match tree {
        Tree::Text(text) => Value::String(text.clone()),
        Tree::Number(number) => json!(number),
        Tree::Planted(prefix, secret, suffix) => {
            planted.push(secret.clone());
            Value::String(format!("{prefix}{}{suffix}", secret.embedded))
        }
        Tree::List(items) => Value::Array(items.iter().map(|item| build(item, planted)).collect()),
        Tree::Object(fields) => {
            let mut map = Map::new();
            for (key, field) in fields {
                map.insert(key.clone(), build(field, planted));
            }
            Value::Object(map)
        }
    }
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_planted_secret_survives(shape in tree()) {
        let redactor = Redactor::new();
        let mut planted = Vec::new();
        let value = build(&shape, &mut planted);
        let mut output_strings = Vec::new();
        strings(&redactor.redact_output_json(&value), &mut output_strings);
        let mut input_strings = Vec::new();
        strings(&redactor.redact_json(&value), &mut input_strings);
        for secret in &planted {
            for text in &output_strings {
                prop_assert!(!text.contains(&secret.secret), "output kept {:?} in {:?}", secret.secret, text);
            }
            if !secret.pii {
                for text in &input_strings {
                    prop_assert!(!text.contains(&secret.secret), "input kept {:?} in {:?}", secret.secret, text);
                }
            }
        }
    }

    #[test]
    fn embedded_secrets_in_text_are_redacted(
        prefix in "[a-zA-Z ]{0,20}",
        planted in secret(),
        suffix in "[a-zA-Z ]{0,20}",
    ) {
        let text = format!("{prefix} {} {suffix}", planted.embedded);
        let redacted = Redactor::new().redact_output_text(&text);
        prop_assert!(!redacted.contains(&planted.secret), "{:?} -> {:?}", text, redacted);
    }
}

// ---- cost ----

/// A typical small tool call: a Shopify-style order lookup's input and output.
fn typical_call() -> (Value, Value) {
    let input = json!({
        "shop": "example-store",
        "order_id": "#1001",
        "include_line_items": true,
        "max_tokens": 1024,
        "api_key": "shpat_0123456789abcdef0123456789abcdef",
    });
    let output = json!({
        "id": 5123456789012u64,
        "name": "#1001",
        "email": "alice.smith@example.com",
        "created_at": "2024-01-15T10:30:00Z",
        "financial_status": "paid",
        "total_price": "1234.56",
        "currency": "USD",
        "shipping_address": {
            "first_name": "Alice",
            "address1": "1600 Amphitheatre Parkway",
            "city": "Mountain View",
            "zip": "94043",
            "phone": "+1 650 253 0000"
        },
        "line_items": [
            {"sku": "TSHIRT-M", "quantity": 2, "price": "19.99", "title": "Classic tee"},
            {"sku": "MUG-01", "quantity": 1, "price": "9.50", "title": "Mug"}
        ],
        "tracking_number": "1Z999AA10123456784",
        "note": "Leave at the front desk, thanks!"
    });
    (input, output)
}

#[test]
fn a_typical_call_keeps_what_an_operator_needs() {
    // Its cost is measured by `cargo xtask bench` (the whole call path), not by a timed test.
    let redactor = Redactor::new();
    let (input, output) = typical_call();
    let redacted = redactor.redact_output_json(&output);
    assert_eq!(
        redacted["shipping_address"]["address1"],
        "[REDACTED ADDRESS]"
    );
    assert_eq!(redacted["shipping_address"]["zip"], "94043");
    assert_eq!(redacted["tracking_number"], "1Z999AA10123456784");
    assert_eq!(redactor.redact_json(&input)["max_tokens"], 1024);
}
