//! A call's `arguments_json`: decoding and schema validation. The property is `toolgate_fuzz::arguments`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolgate_fuzz::arguments(data));
