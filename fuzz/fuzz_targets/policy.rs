//! Cedar policy upload: compile and strict validation, then evaluation. The property is `toolgate_fuzz::policy`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolgate_fuzz::policy(data));
