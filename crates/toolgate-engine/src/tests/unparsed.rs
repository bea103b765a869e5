//! Arguments that are not JSON: the ledger keeps a redacted excerpt, redacted whole before it
//! is cut, so a cut falling inside a secret leaves no part of it.

use toolgate_core::ToolCallStatus;

use super::ledgers::{self, Backend, ledger_test};
use super::{EngineConfig, harness_with};

/// Where the old cut (1024 characters) falls inside each secret; the filler before it has
/// multi-byte characters so the cut is a character count, not a byte count.
fn planted_texts() -> Vec<(&'static str, String)> {
    let token = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";
    let card = "4111 1111 1111 1111";
    let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq0J9Qwertyuiop\n-----END RSA PRIVATE KEY-----";
    let filler = |chars: usize| "é ".repeat(chars / 2) + &"x".repeat(chars % 2);
    let tail = " and more".repeat(40);
    vec![
        // 33 of the token's 40 characters before the cut.
        (token, format!("{} {token}{tail}", filler(1024 - 33 - 1))),
        // The card's first 12 digits (and separators) before the cut.
        (
            card,
            format!("{{not json {} {card}{tail}", filler(1024 - 14 - 11)),
        ),
        // A secret longer than what is left before the cut.
        (pem, format!("{} {pem}{tail}", filler(1000))),
        // The cut falls right after the token: nothing to back off.
        (token, format!("{} {token}{tail}", filler(1024 - 40 - 1))),
    ]
}

/// Any six consecutive characters of `secret` found in `stored`.
fn piece_of(secret: &str, stored: &str) -> Option<String> {
    let chars: Vec<char> = secret.chars().collect();
    chars
        .windows(6)
        .map(|w| w.iter().collect::<String>())
        .find(|piece| stored.contains(piece.as_str()))
}

async fn unparsable_arguments_are_redacted_before_they_are_cut(backend: Backend) {
    let config = EngineConfig {
        max_argument_bytes: 64 * 1024,
        ..EngineConfig::default()
    };
    let h = harness_with(&backend, config, None).await;
    let run = h.run(None).await;
    for (secret, arguments) in planted_texts() {
        let outcome = h.call(&run, "testkit.echo", &arguments).await;
        assert_eq!(outcome.status, ToolCallStatus::Failed, "{outcome:?}");
        let row = h.ledger_row(&outcome).await;
        let stored = row.input_redacted.to_string();
        let excerpt = row.input_redacted["_unparsed"]
            .as_str()
            .expect("an excerpt");
        if let Some(piece) = piece_of(secret, &stored) {
            panic!("the ledger kept {piece:?} of {secret:?}: {stored}");
        }
        assert!(excerpt.chars().count() <= 1024 + 32, "{excerpt}");
        assert!(excerpt.contains("bytes omitted"), "{excerpt}");
        let events = h.store.list_events(&h.tenant, 0, 10_000).await.unwrap();
        for event in events {
            let payload = event.payload.to_string();
            if let Some(piece) = piece_of(secret, &payload) {
                panic!("event {} kept {piece:?}: {payload}", event.kind);
            }
        }
    }
}
ledger_test!(unparsable_arguments_are_redacted_before_they_are_cut);
