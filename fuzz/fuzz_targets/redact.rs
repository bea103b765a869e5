//! The redactor on any text and the JSON it parses to, both modes, and its excerpts. The property is `toolgate_fuzz::redact`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolgate_fuzz::redact(data));
