//! Arbitrary bytes as a trace, through the invariant checks, the terminal
//! timeline and the HTML page; see `subloop::testing::fuzz_trace`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    subloop::testing::fuzz_trace(data);
});
