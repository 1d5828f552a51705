//! Arbitrary bytes as a history of one format, through its reader, the
//! pairing rules, repair and view; see `subloop::testing::fuzz_history_as`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use subloop::record::history::Format;

fuzz_target!(|data: &[u8]| {
    subloop::testing::fuzz_history_as(data, Format::OpenAi);
});
