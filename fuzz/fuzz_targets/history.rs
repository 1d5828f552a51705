//! Arbitrary bytes as a history of every format (Messages API and Chat
//! Completions request histories, Claude Code sessions, codex rollouts),
//! through the pairing rules; see `subloop::testing::fuzz_history`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    subloop::testing::fuzz_history(data);
});
