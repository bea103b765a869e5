//! The config loader under generated input (the fuzz targets cover the parsers of the other
//! crates; this one is covered here): TOML documents built from the known sections and keys, misspelled ones and
//! values of every type, with `TOOLGATE_*` variables beside them. Loading never panics, a
//! refusal names what it refused, and what loads is validated.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{Config, ENV_KEYS, RawConfig};

/// Every key the file accepts, by section.
const KEYS: &[(&str, &[&str])] = &[
    (
        "server",
        &[
            "listen",
            "drain_timeout_ms",
            "max_concurrent_calls",
            "max_queued_calls",
            "worker_threads",
        ],
    ),
    ("storage", &["database", "schema"]),
    ("auth", &["admin_token_file"]),
    (
        "engine",
        &[
            "max_timeout_ms",
            "default_max_calls",
            "max_calls_limit",
            "max_argument_bytes",
            "cache_ttl_ms",
            "pending_expiry_ms",
            "answer_retention_ms",
        ],
    ),
    ("connectors", &["disabled"]),
    (
        "console",
        &[
            "enabled",
            "public_url",
            "allowed_origins",
            "session_idle_ms",
            "session_max_ms",
            "client_link_ttl_ms",
        ],
    ),
    (
        "connectors.slack",
        &["api_base_url", "allow_hosts", "webhook_hosts"],
    ),
    ("secrets", &["key_file"]),
];

/// A TOML value of any type, as text.
fn value() -> impl Strategy<Value = String> {
    let text = prop_oneof![
        Just("127.0.0.1:0".to_owned()),
        Just("[::1]:50051".to_owned()),
        Just("postgres://u@127.0.0.1:5432/db".to_owned()),
        Just("sqlite:/tmp/x.db".to_owned()),
        Just("https://slack.com/api".to_owned()),
        "[ -~]{0,24}",
        "\\PC{0,12}",
    ];
    prop_oneof![
        text.clone()
            .prop_map(|s| toml::Value::String(s).to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(u64::from(u32::MAX) + 1),
            0u64..100_000
        ]
        .prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<f64>().prop_map(|f| toml::Value::Float(f).to_string()),
        proptest::collection::vec(text, 0..3)
            .prop_map(|items| toml::Value::from(items).to_string()),
    ]
}

/// A key of `section`, or a misspelled one.
fn key(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(keys).prop_map(str::to_owned),
        1 => (proptest::sample::select(keys), "[a-z_]{1,3}")
            .prop_map(|(key, extra)| format!("{key}{extra}")),
    ]
}

/// A section (or a misspelled one) with some of its keys.
fn section() -> impl Strategy<Value = (String, BTreeMap<String, String>)> {
    proptest::sample::select(KEYS).prop_flat_map(|(name, keys)| {
        (
            prop_oneof![9 => Just(name.to_owned()), 1 => Just(format!("{name}x"))],
            proptest::collection::btree_map(key(keys), value(), 0..4),
        )
    })
}

/// A document of a few sections.
fn document() -> impl Strategy<Value = String> {
    proptest::collection::vec(section(), 0..5).prop_map(|sections| {
        let mut seen = std::collections::BTreeSet::new();
        let mut text = String::new();
        for (name, fields) in sections {
            if !seen.insert(name.clone()) {
                continue;
            }
            text.push_str(&format!("[{name}]\n"));
            for (key, value) in fields {
                text.push_str(&format!("{key} = {value}\n"));
            }
        }
        text
    })
}

/// Some `TOOLGATE_*` variables: known ones, unknown ones, with any text.
fn environment() -> impl Strategy<Value = BTreeMap<String, String>> {
    let name = prop_oneof![
        4 => proptest::sample::select(ENV_KEYS).prop_map(|(name, _)| (*name).to_owned()),
        1 => "TOOLGATE_[A-Z_]{1,12}",
    ];
    let text = prop_oneof!["[0-9]{1,8}", "[ -~]{0,16}", Just("127.0.0.1:0".to_owned()),];
    proptest::collection::btree_map(name, text, 0..3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn loading_never_panics_and_refusals_name_the_problem(
        text in document(),
        env in environment(),
    ) {
        let raw: RawConfig = match toml::from_str(&text) {
            Ok(raw) => raw,
            Err(error) => {
                prop_assert!(!error.to_string().is_empty());
                return Ok(());
            }
        };
        match Config::from_raw(raw, &env, None, None) {
            Ok(config) => {
                prop_assert!(config.engine.max_argument_bytes > 0);
                prop_assert!(config.engine.max_argument_bytes <= 64 * 1024 * 1024);
            }
            Err(message) => {
                let names_it = message.contains('`')
                    || message.contains("TOOLGATE_")
                    || KEYS.iter().any(|(section, keys)| {
                        message.contains(section) || keys.iter().any(|k| message.contains(k))
                    });
                prop_assert!(names_it, "{message:?} names no key or variable");
            }
        }
    }

    #[test]
    fn any_text_is_read_or_refused(text in "\\PC{0,200}") {
        if let Err(error) = toml::from_str::<RawConfig>(&text) {
            prop_assert!(!error.to_string().is_empty());
        }
    }
}
