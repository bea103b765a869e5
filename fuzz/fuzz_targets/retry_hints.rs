//! `Retry-After` and `X-RateLimit-Reset` parsing. The property is `toolgate_fuzz::retry_hints`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolgate_fuzz::retry_hints(data));
