//! The properties toolgate's parsers are fuzzed against, one function per fuzz target. Each
//! takes the fuzzer's bytes, feeds them to one parser the way untrusted input reaches it, and
//! panics when a property does not hold (a panic inside the parser is a finding too). The
//! cargo-fuzz targets (`fuzz/fuzz_targets/`, run by `cargo xtask fuzz`) call them; this
//! crate's test replays every seed corpus file (`fuzz/corpus/<target>/`) through them, so a
//! normal `cargo test` exercises them without nightly features.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};
use serde_json::Value;
use toolgate_core::{AgentId, Redactor, RunId, TenantId, ToolRegistry};
use toolgate_engine::{Catalog, decode_arguments};
use toolgate_policy::{CompiledPolicy, PolicyRequest};
use toolgate_slack::{SlackConfig, SlackConnector};

/// One target's property: it panics when the property does not hold for the bytes.
pub type Property = fn(&[u8]);

/// The targets, by the name of their corpus folder and fuzz binary.
pub const TARGETS: &[(&str, Property)] = &[
    ("redact", redact),
    ("address", address),
    ("retry_hints", retry_hints),
    ("policy", policy),
    ("arguments", arguments),
];

/// A JWT planted after the fuzzed text: whatever comes before it, it must not survive.
const PLANTED_JWT: &str = "eyJhbGciOiAiSFMyNTYiLCAidHlwIjogIkpXVCJ9.eyJzdWIiOiAiMTIzNDU2Nzg5MCJ9.c2lnbmF0dXJlX2hlcmVfMTIzNDU2";

/// The redactor on any text, in both modes, on the JSON it parses to, and its excerpts: no
/// panic; an excerpt keeps its length promise; a JWT after the text and a space is removed.
pub fn redact(data: &[u8]) {
    let redactor = Redactor::new();
    let text = String::from_utf8_lossy(data);
    let _ = redactor.redact_text(&text);
    let _ = redactor.redact_output_text(&text);
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        let _ = redactor.redact_json(&value).to_string();
        let _ = redactor.redact_output_json(&value).to_string();
    }
    let max = usize::from(data.first().copied().unwrap_or(0));
    let excerpt = redactor.redact_excerpt(&text, max);
    let note = excerpt.rfind('[').map_or(0, |at| excerpt.len() - at);
    assert!(
        excerpt.chars().count() <= max + note,
        "an excerpt of {max} characters has {}",
        excerpt.chars().count()
    );
    let planted = format!("{text} {PLANTED_JWT} ");
    for redacted in [
        redactor.redact_text(&planted),
        redactor.redact_output_text(&planted),
    ] {
        // The fuzzer may copy pieces of the JWT into the text; only a whole one is a JWT.
        assert!(
            !redacted.contains(PLANTED_JWT),
            "the planted JWT survived after {text:?}"
        );
    }
}

/// The SSRF guard: every IPv6 form embedding a refused IPv4 address is refused, and a URL
/// the guard passes never names a refused literal address.
pub fn address(data: &[u8]) {
    if let Some(bytes) = data.get(..16) {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(bytes);
        let v6 = Ipv6Addr::from(octets);
        let _ = toolgate_http::refused_range(IpAddr::V6(v6));
        let [a, b, c, d] = [octets[12], octets[13], octets[14], octets[15]];
        let v4 = Ipv4Addr::new(a, b, c, d);
        if toolgate_http::refused_range(IpAddr::V4(v4)).is_some() {
            let (hi, lo) = (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
            let forms = [
                v4.to_ipv6_mapped(),
                Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, hi, lo),
                Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
                Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, hi, lo),
                Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1),
                Ipv6Addr::new(0, 0, 0, 0, 0, 0, hi, lo),
            ];
            for form in forms {
                assert!(
                    toolgate_http::refused_range(IpAddr::V6(form)).is_some(),
                    "{form} embeds the refused {v4} and was allowed"
                );
            }
        }
    }
    let text = String::from_utf8_lossy(data);
    let candidates = [
        text.to_string(),
        format!("http://{text}/"),
        format!("http://[{text}]/"),
    ];
    for url in candidates {
        if toolgate_http::check_target(&url, &[]).is_err() {
            continue;
        }
        let Some(ip) = literal_host(&url) else {
            continue;
        };
        assert!(
            toolgate_http::refused_range(ip).is_none(),
            "{url:?} passed the guard with the refused address {ip}"
        );
    }
}

/// The host of `url` when it is a literal IP address, as the URL parser the guard uses reads
/// it (a hand-rolled split disagreed with it on inputs such as `http:0tp://[::/...`).
fn literal_host(url: &str) -> Option<IpAddr> {
    match url::Url::parse(url).ok()?.host()? {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    }
}

/// `Retry-After` and `X-RateLimit-Reset` (the bytes up to the first NUL are one, the rest the
/// other): no panic, and an all-digit `Retry-After` is that many seconds.
pub fn retry_hints(data: &[u8]) {
    let (first, second) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &data[data.len()..]),
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for (name, value, other) in [
        ("retry-after", first, second),
        ("x-ratelimit-reset", first, second),
        ("retry-after", second, first),
    ] {
        let Ok(value) = HeaderValue::from_bytes(value) else {
            continue;
        };
        let mut headers = HeaderMap::new();
        headers.insert(name, value.clone());
        if let Ok(other) = HeaderValue::from_bytes(other) {
            headers.insert("x-ratelimit-reset", other);
        }
        let wait = toolgate_http::requested_wait(&headers, now);
        let text = value.to_str().unwrap_or("").trim();
        if name == "retry-after" && !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            let seconds = text.parse::<u64>().unwrap_or(u64::MAX);
            assert_eq!(wait, Some(Duration::from_secs(seconds)), "{text:?}");
        }
    }
}

/// The tools policies and arguments are checked against: the Slack connector's, which are
/// real.
static CATALOG: LazyLock<Catalog> = LazyLock::new(|| {
    let mut registry = ToolRegistry::new();
    let connector = SlackConnector::new(SlackConfig::default()).expect("default slack config");
    registry
        .register(Arc::new(connector))
        .expect("slack tools register");
    Catalog::new(registry).expect("slack tools compile")
});

/// Uploaded Cedar text: compiled and strictly validated against the tools' schema, and when
/// it compiles, evaluated for a call of each tool, without a panic.
pub fn policy(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(policy) = CompiledPolicy::compile(CATALOG.policy_schema(), &text, 1) else {
        return;
    };
    let tenant = TenantId::new("acme").expect("tenant id");
    let agent = AgentId::new("support").expect("agent id");
    let run = RunId::new("run-1").expect("run id");
    let arguments = serde_json::json!({"channel": "C0123456789", "text": "hello"});
    for spec in CATALOG.registry().specs() {
        let decision = policy.evaluate(&PolicyRequest {
            tenant: &tenant,
            agent: &agent,
            run: &run,
            tool: spec,
            arguments: &arguments,
        });
        assert_eq!(decision.policy_version, 1);
    }
}

/// A call's `arguments_json`, decoded as the pipeline does and checked against every tool's
/// schema: no panic, and a refusal never echoes an argument's string value.
pub fn arguments(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(value) = decode_arguments(&text, 64 * 1024) else {
        return;
    };
    let _ = Redactor::new().redact_json(&value);
    let mut values = Vec::new();
    strings(&value, &mut values);
    for spec in CATALOG.registry().specs() {
        let Err(message) = CATALOG.validate(&spec.name, &value) else {
            continue;
        };
        let schema = spec.input_schema.to_string();
        for echoed in values
            .iter()
            .filter(|v| v.len() >= 12 && !schema.contains(v.as_str()))
        {
            assert!(
                !message.contains(echoed.as_str()),
                "the refusal echoes {echoed:?}: {message}"
            );
        }
    }
}

fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(text) => out.push(text.clone()),
        Value::Array(items) => items.iter().for_each(|item| strings(item, out)),
        Value::Object(map) => map.values().for_each(|item| strings(item, out)),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}
