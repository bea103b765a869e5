//! The SSRF guard: URLs and IPv6 forms embedding IPv4 addresses. The property is `toolgate_fuzz::address`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolgate_fuzz::address(data));
