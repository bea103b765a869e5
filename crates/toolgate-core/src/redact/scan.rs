//! Value patterns: one compiled alternation per mode, scanned once per string, with the few
//! checks a regex cannot express (Luhn, SSN areas, EIN prefixes, IBAN mod-97, AWS context)
//! applied to each candidate afterwards.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

use super::REDACTED;

/// Shorter strings cannot hold any pattern (the shortest, an email like `a@b.io`, has 6).
const MIN_LEN: usize = 6;

/// What a candidate is. The order of [`PATTERNS`] is the priority when two start at the same
/// place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pem,
    UrlUserinfo,
    SlackHook,
    KeyValue,
    Bearer,
    Vendor,
    AwsSecret,
    Card,
    Ssn,
    Ein,
    Email,
    Phone,
    Address,
    AddressEu,
    Iban,
}

/// Each pattern's text; `\b` is rewritten to the ASCII word boundary (the Unicode one makes
/// the lazy DFA give up on non-ASCII input). Named groups inside a pattern mark the span that
/// is replaced (`v`) or kept (`zip`); without `v` the whole match is replaced.
const PATTERNS: &[(Kind, bool, &str)] = &[
    // (kind, PII only, pattern)
    (
        Kind::Pem,
        false,
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\z)",
    ),
    (
        Kind::UrlUserinfo,
        false,
        r#"\b[A-Za-z][A-Za-z0-9+.\-]*://(?P<v>[^\s/?#@:"'<>]+:[^\s/?#@"'<>]*)@"#,
    ),
    (
        Kind::SlackHook,
        false,
        r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<v>[A-Za-z0-9/_\-]+)",
    ),
    (
        // The same secret without its host: a webhook's path as an HTTP client logs it.
        Kind::SlackHook,
        false,
        r"/services/(?P<v>T[A-Z0-9]{6,}/B[A-Z0-9]{6,}/[A-Za-z0-9]{16,})",
    ),
    (
        Kind::KeyValue,
        false,
        r#"(?P<key>[A-Za-z0-9_.\-]*(?i:secret|token|passw(?:or)?d|passphrase|api[_\-]?key|access[_\-]?key|private[_\-]?key|authorization|cookie|credential|signature)[A-Za-z0-9_.\-]*)(?:\\?["'])?[ \t]*[:=][ \t]*(?P<v>"(?:[^"\\\r\n]|\\.)*"|\\"(?:[^"\\\r\n]|\\[^"])*\\"|'[^'\r\n]*'|(?i:(?:bearer|basic|token|digest)[ \t]+)?[^\s"'&,;<>)\]}\\]+)"#,
    ),
    (
        Kind::Bearer,
        false,
        r"(?i:\b(?:bearer|basic)[ \t]+)(?P<v>[A-Za-z0-9\-._~+/]{8,}=*)",
    ),
    (
        Kind::Vendor,
        false,
        concat!(
            r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}",
            r"|xox[abposre](?:\.xox[a-z])?-[A-Za-z0-9\-]{10,}",
            r"|xapp-[0-9]-[A-Za-z0-9\-]{10,}",
            r"|shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32,}",
            r"|gh[pousr]_[A-Za-z0-9]{30,}",
            r"|github_pat_[A-Za-z0-9_]{22,}",
            r"|eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*",
            r"|\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}",
            r"|\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{24,}",
            r"|AIza[0-9A-Za-z_\-]{35}",
        ),
    ),
    (
        Kind::AwsSecret,
        false,
        r"(?:^|[^A-Za-z0-9/+=])(?P<v>[A-Za-z0-9/+]{40})(?:[^A-Za-z0-9/+=]|$)",
    ),
    (
        Kind::Card,
        false,
        r"\b(?P<v>[2-6][0-9](?:[ \-]?[0-9]){11,17})\b",
    ),
    (Kind::Ssn, false, r"\b(?P<v>[0-9]{3}-[0-9]{2}-[0-9]{4})\b"),
    (Kind::Ein, false, r"\b(?P<v>[0-9]{2}-[0-9]{7})\b"),
    (
        Kind::Email,
        true,
        r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}\b",
    ),
    (
        Kind::Phone,
        true,
        concat!(
            r"\+[1-9](?:[ .\-]?\(?[0-9]\)?){6,14}",
            r"|(?:\([2-9][0-9]{2}\)[ ]?|\b[2-9][0-9]{2}[ .\-])[2-9][0-9]{2}[ .\-][0-9]{4}\b",
            r"|\b0[1-9][0-9]{0,4}(?:[ /\-][0-9]{2,8}){1,4}\b",
        ),
    ),
    (
        Kind::Address,
        true,
        concat!(
            r"\b[0-9]{1,6}[A-Za-z]?(?:[ ][A-Z0-9][A-Za-z0-9'.\-]*){1,5}[ ]",
            r"(?:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Way|Parkway|Pkwy|Place|Pl|Terrace|Ter|Circle|Cir|Highway|Hwy|Square|Sq|Loop|Trail|Crescent|Close|Plaza|Alley|Row)\b\.?",
            r"(?:,?[ ](?:Apt|Apartment|Suite|Ste|Unit|Floor|Fl|#)\.?[ ]?#?[A-Za-z0-9\-]+)?",
            r"(?:(?:,?[ ][A-Z][A-Za-z.'\-]*(?:[ ][A-Z][A-Za-z.'\-]*){0,3}){0,2},?[ ](?:[A-Z]{2}[ ]+)?",
            r"(?P<zip>[0-9]{5}(?:-[0-9]{4})?|[A-Z]{1,2}[0-9][A-Z0-9]?[ ][0-9][A-Z]{2}|[A-Z][0-9][A-Z][ ]?[0-9][A-Z][0-9])\b)?",
        ),
    ),
    (
        Kind::AddressEu,
        true,
        r"[A-ZÄÖÜ][a-zäöüß]+(?:straße|strasse|str\.|weg|gasse|platz|allee|damm)[ ][0-9]{1,4}[a-z]?\b(?:,[ ](?P<zip>[0-9]{5})\b)?",
    ),
    (
        Kind::Iban,
        true,
        r"\b[A-Z]{2}[0-9]{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,3})?\b",
    ),
];

/// A compiled alternation for finding candidates fast (one DFA pass, no captures), and each
/// alternative compiled alone for telling which one matched and where its groups are. Running
/// captures on the big alternation costs microseconds per match; on one small pattern, far
/// less.
#[derive(Debug)]
struct Scanner {
    regex: Regex,
    parts: Vec<Part>,
}

/// One alternative on its own, with the indices of its `v`, `zip` and `key` groups.
#[derive(Debug)]
struct Part {
    kind: Kind,
    regex: Regex,
    value: Option<usize>,
    zip: Option<usize>,
    key: Option<usize>,
}

static SECRETS: LazyLock<Scanner> = LazyLock::new(|| Scanner::new(false));
static SECRETS_AND_PII: LazyLock<Scanner> = LazyLock::new(|| Scanner::new(true));

static AWS_CONTEXT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)aws|amz|secret|(?-i:AKIA|ASIA)").expect("static regex"));

/// An AWS access key id anywhere in a string: used to mark a JSON object as AWS context.
pub(super) static AWS_KEY_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}").expect("static regex"));

impl Scanner {
    fn new(with_pii: bool) -> Scanner {
        let mut alternatives = Vec::new();
        let mut parts = Vec::new();
        for (kind, pii, pattern) in PATTERNS {
            if *pii && !with_pii {
                continue;
            }
            let ascii = pattern.replace(r"\b", r"(?-u:\b)");
            let regex = Regex::new(&ascii).expect("static regex");
            let group = |name: &str| regex.capture_names().position(|n| n == Some(name));
            parts.push(Part {
                kind: *kind,
                value: group("v"),
                zip: group("zip"),
                key: group("key"),
                regex,
            });
            let unnamed = ascii
                .replace("?P<v>", "?:")
                .replace("?P<zip>", "?:")
                .replace("?P<key>", "?:");
            alternatives.push(format!("(?:{unnamed})"));
        }
        let regex = Regex::new(&alternatives.join("|")).expect("static regex");
        Scanner { regex, parts }
    }
}

/// What a candidate becomes.
enum Verdict<'t> {
    /// Replace `start..end` with the text, then keep scanning after it.
    Replace {
        start: usize,
        end: usize,
        with: &'static str,
        keep: Option<&'t str>,
    },
    /// Not a secret after all: scan on from here.
    Skip(usize),
}

/// Scans `text` for secrets (and personal data when `with_pii`). `aws_context` says that the
/// surrounding JSON already talks about AWS, so a bare 40-character key is a secret key.
pub(super) fn scan<'t>(
    text: &'t str,
    with_pii: bool,
    aws_context: &dyn Fn() -> bool,
) -> Cow<'t, str> {
    // Lower-case words and underscores (most keys, much prose) can hold no pattern: every one
    // needs a digit, an upper-case letter or punctuation beyond these.
    let plain = text
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b' ');
    if text.len() < MIN_LEN || plain {
        return Cow::Borrowed(text);
    }
    let scanner = if with_pii {
        &*SECRETS_AND_PII
    } else {
        &*SECRETS
    };
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut position = 0;
    while position < text.len() {
        let Some(found) = scanner.regex.find_at(text, position) else {
            break;
        };
        match judge(scanner, found.range(), text, with_pii, aws_context) {
            Verdict::Replace {
                start,
                end,
                with,
                keep,
            } => {
                let buffer = out.get_or_insert_with(|| String::with_capacity(text.len()));
                buffer.push_str(&text[copied..start]);
                buffer.push_str(with);
                if let Some(kept) = keep {
                    buffer.push(' ');
                    buffer.push_str(kept);
                }
                copied = end;
                position = end.max(found.start() + 1);
            }
            Verdict::Skip(next) => position = next.max(found.start() + 1),
        }
        while !text.is_char_boundary(position) {
            position += 1;
        }
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut buffer) => {
            buffer.push_str(&text[copied..]);
            Cow::Owned(buffer)
        }
    }
}

fn judge<'t>(
    scanner: &Scanner,
    found: std::ops::Range<usize>,
    text: &'t str,
    with_pii: bool,
    aws_context: &dyn Fn() -> bool,
) -> Verdict<'t> {
    // Alone, an alternative sees the text up to one character past the candidate: enough for
    // the trailing `\b` or delimiter, and it cannot wander off scanning the rest.
    let mut limit = (found.end + 1).min(text.len());
    while !text.is_char_boundary(limit) {
        limit += 1;
    }
    let window = &text[..limit];
    let mut identified = None;
    for part in &scanner.parts {
        let Some(captures) = part.regex.captures_at(window, found.start) else {
            continue;
        };
        let whole = captures.get(0).map(|m| m.range());
        if whole == Some(found.clone()) {
            identified = Some((part, captures));
            break;
        }
    }
    let Some((part, captures)) = identified else {
        // Not expected: the alternation matched, so one of its parts does too.
        return Verdict::Skip(found.end);
    };
    let span_of = |group: Option<usize>| group.and_then(|g| captures.get(g)).map(|m| m.range());
    let (start, end) = (found.start, found.end);
    let (v_start, v_end) = span_of(part.value).map_or((start, end), |r| (r.start, r.end));
    let zip = span_of(part.zip);
    let kind = part.kind;
    let span = &text[v_start..v_end];
    let replace = |with: &'static str| Verdict::Replace {
        start: v_start,
        end: v_end,
        with,
        keep: None,
    };
    match kind {
        Kind::Pem | Kind::UrlUserinfo | Kind::SlackHook | Kind::Vendor => replace(REDACTED),
        Kind::KeyValue => {
            let key = span_of(part.key).map_or("", |r| &text[r]);
            if !super::fields::is_secret_name(key) {
                return Verdict::Skip(v_start);
            }
            match quoted_inner(span) {
                Some((open, close)) => Verdict::Replace {
                    start: v_start + open,
                    end: v_end - close,
                    with: REDACTED,
                    keep: None,
                },
                None => replace(REDACTED),
            }
        }
        Kind::Bearer if looks_like_credential(span) => replace(REDACTED),
        Kind::AwsSecret if looks_like_aws_secret(text, v_start, v_end, aws_context) => {
            replace(REDACTED)
        }
        Kind::AwsSecret => Verdict::Skip(v_end),
        Kind::Card if is_card(text, v_start, v_end) => replace(REDACTED),
        Kind::Ssn if is_ssn_or_itin(span) && standalone(text, v_start, v_end) => replace(REDACTED),
        Kind::Ein if is_ein(span) && standalone(text, v_start, v_end) => replace(REDACTED),
        Kind::Email if with_pii && !span.starts_with("git@") => replace(super::REDACTED_EMAIL),
        Kind::Phone if with_pii && is_phone(text, start, end) => replace(super::REDACTED_PHONE),
        Kind::Address | Kind::AddressEu if with_pii => Verdict::Replace {
            start,
            end,
            with: super::REDACTED_ADDRESS,
            keep: zip.map(|r| &text[r]),
        },
        Kind::Iban if with_pii && iban_checksum_ok(span) => replace(super::REDACTED_PAYMENT),
        _ => Verdict::Skip(end),
    }
}

/// For a quoted value, how many bytes of quoting sit on each side.
fn quoted_inner(span: &str) -> Option<(usize, usize)> {
    if span.starts_with("\\\"") && span.len() >= 4 {
        return Some((2, 2));
    }
    let first = span.chars().next()?;
    if (first == '"' || first == '\'') && span.len() >= 2 {
        return Some((1, 1));
    }
    None
}

/// A bearer/basic value must look machine-made: a digit, a symbol, or an upper-case letter
/// after the first (so "Basic authentication" and "bearer instruments" stay prose).
fn looks_like_credential(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes
        .iter()
        .any(|b| b.is_ascii_digit() || b"-._~+/=".contains(b))
        || (bytes.iter().skip(1).any(u8::is_ascii_uppercase)
            && bytes.iter().any(u8::is_ascii_lowercase))
}

/// A 40-character base64 run is an AWS secret access key only when it mixes upper case, lower
/// case and digits or `/+` (git SHA-1s are lower-case hex) and AWS is mentioned nearby: within
/// 200 bytes before it or 64 after it, or in the enclosing JSON object.
fn looks_like_aws_secret(
    text: &str,
    start: usize,
    end: usize,
    aws_context: &dyn Fn() -> bool,
) -> bool {
    let value = &text.as_bytes()[start..end];
    let mixed = value.iter().any(u8::is_ascii_uppercase)
        && value.iter().any(u8::is_ascii_lowercase)
        && value
            .iter()
            .any(|b| b.is_ascii_digit() || *b == b'/' || *b == b'+');
    if !mixed {
        return false;
    }
    if aws_context() {
        return true;
    }
    let before = &text[floor_char(text, start.saturating_sub(200))..start];
    let after = &text[end..floor_char(text, (end + 64).min(text.len()))];
    AWS_CONTEXT.is_match(before) || AWS_CONTEXT.is_match(after)
}

fn floor_char(text: &str, mut index: usize) -> usize {
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// Card numbers: 13-19 digits passing Luhn, first digit 2-6 (the issuer ranges in use, which
/// leaves out millisecond timestamps and 9-prefixed postal tracking numbers); when written with
/// separators, one separator kind in card-shaped groups (4-4-4-4[-3], 4-6-5, 4-6-4), and not a
/// piece of a longer digit-group sequence.
fn is_card(text: &str, start: usize, end: usize) -> bool {
    let candidate = &text[start..end];
    let digits: Vec<u32> = candidate.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) || !luhn(&digits) {
        return false;
    }
    let separators = candidate.bytes().any(|b| b == b' ' || b == b'-');
    if !separators {
        return standalone_number(text, start, end);
    }
    if candidate.contains(' ') && candidate.contains('-') {
        return false;
    }
    let groups: Vec<usize> = candidate.split([' ', '-']).map(str::len).collect();
    let card_shaped = matches!(groups.as_slice(), [4, 6, 5] | [4, 6, 4])
        || (groups.len() >= 3
            && groups[..groups.len() - 1].iter().all(|g| *g == 4)
            && (1..=4).contains(&groups[groups.len() - 1]));
    card_shaped && standalone(text, start, end)
}

fn luhn(digits: &[u32]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            if i % 2 == 1 {
                if *d * 2 > 9 { *d * 2 - 9 } else { *d * 2 }
            } else {
                *d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// Not glued to more digit groups: no `1-`/`1 ` before and no `-1`/` 1` after, nor a decimal
/// point or dash directly around it.
fn standalone(text: &str, start: usize, end: usize) -> bool {
    let before = &text.as_bytes()[..start];
    let after = &text.as_bytes()[end..];
    let glued_before = match before {
        [.., b'-' | b'.' | b'/'] => true,
        [.., d, b' '] => d.is_ascii_digit(),
        _ => false,
    };
    let glued_after = match after {
        [b'-' | b' ' | b'/', d, ..] => d.is_ascii_digit(),
        [b'.', d, ..] => d.is_ascii_digit(),
        _ => false,
    };
    !glued_before && !glued_after
}

/// A bare digit run: not part of a decimal number or a dashed id.
fn standalone_number(text: &str, start: usize, end: usize) -> bool {
    let before = &text.as_bytes()[..start];
    let after = &text.as_bytes()[end..];
    !matches!(before, [.., b'.' | b'-' | b'/'])
        && !matches!(after, [b'.' | b'-' | b'/', d, ..] if d.is_ascii_digit())
}

/// SSN `AAA-GG-SSSS`: area not 000, 666 or 9xx, group not 00, serial not 0000. An area of 9xx
/// with group 50-65, 70-88, 90-92 or 94-99 is an ITIN, also a tax id.
fn is_ssn_or_itin(value: &str) -> bool {
    let number = |range: std::ops::Range<usize>| value[range].parse::<u32>().unwrap_or(0);
    let (area, group, serial) = (number(0..3), number(4..6), number(7..11));
    if group == 0 || serial == 0 {
        return false;
    }
    match area {
        0 | 666 => false,
        900..=999 => matches!(group, 50..=65 | 70..=88 | 90..=92 | 94..=99),
        _ => true,
    }
}

/// EIN `PP-NNNNNNN` with a prefix the IRS assigns.
fn is_ein(value: &str) -> bool {
    let prefix = value[0..2].parse::<u32>().unwrap_or(0);
    matches!(
        prefix,
        1..=6 | 10..=16 | 20..=27 | 30..=48 | 50..=68 | 71..=77 | 80..=88 | 90..=95 | 98 | 99
    )
}

/// Phone candidates: 7-15 digits (9 or more without a leading `+`), one separator kind (two
/// when the number has a `+` country code or an area code in parentheses), and not glued to
/// further digit groups.
fn is_phone(text: &str, start: usize, end: usize) -> bool {
    let candidate = &text[start..end];
    let digits = candidate.bytes().filter(u8::is_ascii_digit).count();
    let international = candidate.starts_with('+');
    if !(7..=15).contains(&digits) || (!international && digits < 9) {
        return false;
    }
    let kinds = [b' ', b'.', b'-', b'/']
        .iter()
        .filter(|s| candidate.as_bytes().contains(s))
        .count();
    let allowed = if international || candidate.contains('(') {
        2
    } else {
        1
    };
    kinds <= allowed && standalone(text, start, end)
}

/// IBAN mod-97 over the rearranged number.
fn iban_checksum_ok(value: &str) -> bool {
    let compact: Vec<u8> = value.bytes().filter(|b| *b != b' ').collect();
    if !(15..=34).contains(&compact.len()) {
        return false;
    }
    let rearranged = compact[4..].iter().chain(&compact[..4]);
    let mut remainder: u32 = 0;
    for byte in rearranged {
        let value = match byte {
            b'0'..=b'9' => u32::from(byte - b'0'),
            b'A'..=b'Z' => u32::from(byte - b'A') + 10,
            _ => return false,
        };
        let width = if value >= 10 { 100 } else { 10 };
        remainder = (remainder * width + value) % 97;
    }
    remainder == 1
}

static POSTAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?-u:\b)(?:[0-9]{5}(?:-[0-9]{4})?|[A-Z]{1,2}[0-9][A-Z0-9]? [0-9][A-Z]{2}|[A-Z][0-9][A-Z] ?[0-9][A-Z][0-9])(?-u:\b)",
    )
    .expect("static regex")
});

/// The postal code of an address field's value: the last code-shaped token that is not at
/// the very start (a leading number is the house number).
pub(super) fn postal_code(address: &str) -> Option<&str> {
    POSTAL
        .find_iter(address)
        .filter(|m| m.start() > 0)
        .last()
        .map(|m| m.as_str())
}

/// A bare digit string that is a card number (issuer digit 2-6, Luhn).
pub(super) fn is_card_digits(number: &str) -> bool {
    let digits: Vec<u32> = number.chars().filter_map(|c| c.to_digit(10)).collect();
    matches!(digits.first(), Some(2..=6)) && (13..=19).contains(&digits.len()) && luhn(&digits)
}
