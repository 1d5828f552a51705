//! Arbitrary bytes as model replies and tool arguments, through parse →
//! `receive` → tools → `submit`; see `subloop::testing::fuzz_bytes`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    subloop::testing::fuzz_bytes(data);
});
