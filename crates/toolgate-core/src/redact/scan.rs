//! Value patterns: one compiled alternation per mode, scanned once per string, with the few
//! checks a regex cannot express (Luhn, SSN areas, EIN prefixes, IBAN mod-97, AWS context)
//! applied to each candidate afterwards.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;
use regex_automata::util::primitives::PatternID;
use regex_automata::{Anchored, Input, meta};

use super::REDACTED;

/// Shorter strings cannot hold any pattern (the shortest, an email like `a@b.io`, has 6).
const MIN_LEN: usize = 6;

/// The shortest secret that can sit in what a replacement keeps before its value (an EIN, in
/// a pair's name); shorter prefixes are not scanned again.
const MIN_HIDDEN: usize = 10;

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

/// A compiled alternation for finding where candidates start (one DFA pass), and each
/// alternative compiled alone, searched anchored at that start, for telling which ones match
/// there and where their groups are.
#[derive(Debug)]
struct Scanner {
    any: meta::Regex,
    parts: Vec<Part>,
}

/// One alternative on its own, with the indices of its `v`, `zip` and `key` groups.
#[derive(Debug)]
struct Part {
    kind: Kind,
    regex: meta::Regex,
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
            let regex = meta::Regex::new(&ascii).expect("static regex");
            let group = |name: &str| regex.group_info().to_index(PatternID::ZERO, name);
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
        let any = meta::Regex::new(&alternatives.join("|")).expect("static regex");
        Scanner { any, parts }
    }
}

/// One replacement: `start..end` becomes `with`, followed by the text at `keep` (a postal
/// code).
#[derive(Debug)]
struct Edit {
    start: usize,
    end: usize,
    with: &'static str,
    keep: Option<Range<usize>>,
}

/// What one pattern's match at a candidate start becomes.
enum Verdict {
    Replace(Edit),
    /// Not a secret after all; this pattern is not tried again before `until` (its match is
    /// the whole token, so a shorter piece of it is not one either). Other patterns still are.
    Skip {
        until: usize,
    },
    /// A `name=value` pair whose name is no credential: its name is scanned on its own for the
    /// other patterns, and the scan goes on at the value (which may hold a pair of its own).
    SkipPair {
        key: Range<usize>,
        value: usize,
    },
}

/// The matching rules the scan needs besides the patterns.
struct Context<'a> {
    scanner: &'a Scanner,
    with_pii: bool,
    aws_context: &'a dyn Fn() -> bool,
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
    let context = Context {
        scanner: if with_pii { &SECRETS_AND_PII } else { &SECRETS },
        with_pii,
        aws_context,
    };
    // JSON quoted inside a string (a vendor's error body) writes a newline or a tab as `\n`
    // or `\t`: its letter must not glue to the word after it. The scan reads a copy with such
    // letters as spaces, the same length, so its edits apply to `text` as they are.
    let spaced = text.contains('\\').then(|| escapes_as_spaces(text));
    let haystack = spaced.as_deref().unwrap_or(text);
    let mut edits = Vec::new();
    collect(&context, haystack, 0..haystack.len(), true, &mut edits);
    if edits.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut buffer = String::with_capacity(text.len());
    let mut copied = 0;
    for edit in edits {
        buffer.push_str(&text[copied..edit.start]);
        buffer.push_str(edit.with);
        if let Some(kept) = edit.keep {
            buffer.push(' ');
            buffer.push_str(&text[kept]);
        }
        copied = edit.end;
    }
    buffer.push_str(&text[copied..]);
    Cow::Owned(buffer)
}

/// `text` with the letter of each `\n`, `\r` and `\t` escape turned into a space.
fn escapes_as_spaces(text: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let mut index = 0;
    while index + 1 < bytes.len() {
        if bytes[index] != b'\\' {
            index += 1;
            continue;
        }
        if matches!(bytes[index + 1], b'n' | b'r' | b't') {
            bytes[index + 1] = b' ';
        }
        // An escaped backslash is skipped whole, so `\\n` stays a backslash and an `n`.
        index += 2;
    }
    String::from_utf8(bytes).unwrap_or_else(|_| text.to_owned())
}

/// Appends the edits for `range` of `text`, in order and without overlap.
///
/// No pattern's verdict hides another's match: at each place where some pattern matches,
/// every pattern that matches there is judged, in priority order, until one replaces; when
/// none does, the scan moves on by one character, not past the rejected match (a 40-character
/// run rejected as an AWS key may hold a JWT's header one character later). Only a replaced
/// span is jumped over, and it is widened to cover any pattern that matches where it starts
/// and runs on past it (a card number after `token=`, whose pair value stops at the first
/// space). What a replacement keeps before its value (a pair's name) is scanned too.
fn collect(
    context: &Context<'_>,
    text: &str,
    range: Range<usize>,
    outermost: bool,
    edits: &mut Vec<Edit>,
) {
    let parts = &context.scanner.parts;
    let mut blocked = [0usize; PATTERNS.len()];
    let mut position = range.start;
    while position < range.end {
        let input = Input::new(text).span(position..range.end);
        let Some(found) = context.scanner.any.search(&input) else {
            break;
        };
        let start = found.start();
        let mut decided = None;
        for (index, part) in parts.iter().enumerate() {
            if blocked[index] > start {
                continue;
            }
            match judge(context, part, text, start, range.end) {
                None => {}
                Some(Verdict::Replace(edit)) => {
                    decided = Some(edit);
                    break;
                }
                Some(Verdict::Skip { until }) => blocked[index] = until,
                Some(Verdict::SkipPair { key, value }) => {
                    blocked[index] = value;
                    if outermost {
                        collect(context, text, key, false, edits);
                    }
                    decided = None;
                    position = value;
                    break;
                }
            }
        }
        match decided {
            Some(mut edit) => {
                widen(context, text, range.end, &mut edit);
                if outermost && edit.start >= start + MIN_HIDDEN {
                    collect(context, text, start..edit.start, false, edits);
                }
                position = edit.end.max(start + 1);
                edits.push(edit);
            }
            None if position > start => {}
            None => position = start + 1,
        }
        while !text.is_char_boundary(position) {
            position += 1;
        }
    }
}

/// Stretches a replacement over any pattern that also matches where it starts and goes on
/// past its end, so no tail of a longer secret is left behind.
fn widen(context: &Context<'_>, text: &str, limit: usize, edit: &mut Edit) {
    if edit.end >= limit {
        return;
    }
    for part in &context.scanner.parts {
        let input = Input::new(text)
            .span(edit.start..limit)
            .anchored(Anchored::Yes);
        let Some(found) = part.regex.search(&input) else {
            continue;
        };
        if found.end() <= edit.end {
            continue;
        }
        if let Some(Verdict::Replace(other)) = judge(context, part, text, edit.start, limit) {
            edit.end = edit.end.max(other.end);
        }
    }
}

/// `part`'s verdict on its match starting exactly at `start`, if it has one there.
fn judge(
    context: &Context<'_>,
    part: &Part,
    text: &str,
    start: usize,
    limit: usize,
) -> Option<Verdict> {
    let input = Input::new(text).span(start..limit).anchored(Anchored::Yes);
    let found = part.regex.search(&input)?;
    let end = found.end();
    let needs_groups = part.value.is_some() || part.zip.is_some() || part.key.is_some();
    let captures = needs_groups.then(|| {
        let mut captures = part.regex.create_captures();
        part.regex
            .search_captures(&input.clone().span(start..end), &mut captures);
        captures
    });
    let span_of = |group: Option<usize>| {
        let index = group?;
        captures.as_ref()?.get_group(index).map(|span| span.range())
    };
    let (v_start, v_end) = span_of(part.value).map_or((start, end), |r| (r.start, r.end));
    let span = &text[v_start..v_end];
    let replace = |with: &'static str| {
        Verdict::Replace(Edit {
            start: v_start,
            end: v_end,
            with,
            keep: None,
        })
    };
    let skip = |until: usize| Verdict::Skip { until };
    let verdict = match part.kind {
        Kind::Pem | Kind::UrlUserinfo | Kind::SlackHook | Kind::Vendor => replace(REDACTED),
        Kind::KeyValue => {
            let key = span_of(part.key).unwrap_or(start..start);
            if !super::fields::is_secret_name(&text[key.clone()]) {
                return Some(Verdict::SkipPair {
                    key,
                    value: v_start,
                });
            }
            match quoted_inner(span) {
                Some((open, close)) => Verdict::Replace(Edit {
                    start: v_start + open,
                    end: v_end - close,
                    with: REDACTED,
                    keep: None,
                }),
                None => replace(REDACTED),
            }
        }
        Kind::Bearer if looks_like_credential(span) => replace(REDACTED),
        Kind::AwsSecret if looks_like_aws_secret(text, v_start, v_end, context.aws_context) => {
            replace(REDACTED)
        }
        Kind::AwsSecret => skip(v_end),
        Kind::Card if is_card(text, v_start, v_end) => replace(REDACTED),
        Kind::Ssn if is_ssn_or_itin(span) && standalone(text, v_start, v_end) => replace(REDACTED),
        Kind::Ein if is_ein(span) && standalone(text, v_start, v_end) => replace(REDACTED),
        Kind::Email if context.with_pii && !span.starts_with("git@") => {
            replace(super::REDACTED_EMAIL)
        }
        Kind::Phone if context.with_pii && is_phone(text, start, end) => {
            replace(super::REDACTED_PHONE)
        }
        Kind::Address | Kind::AddressEu if context.with_pii => Verdict::Replace(Edit {
            start,
            end,
            with: super::REDACTED_ADDRESS,
            keep: span_of(part.zip),
        }),
        Kind::Iban if context.with_pii && iban_checksum_ok(span) => {
            replace(super::REDACTED_PAYMENT)
        }
        _ => skip(end),
    };
    Some(verdict)
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
