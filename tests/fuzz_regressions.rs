//! The fuzz target's checks on its seeds and on inputs kept from fuzzing:
//! any crash input the fuzzer finds goes into `REGRESSIONS` below.
#![cfg(feature = "testing")]

use std::path::Path;

/// Inputs kept from fuzzing and hand-written hostile bytes.
const REGRESSIONS: &[&[u8]] = &[
    b"",
    b"\xff",
    b"\xff\xff\xff",
    b"null",
    b"[]",
    b"[{}]",
    b"{\"content\": 5, \"stop_reason\": \"tool_use\"}",
    b"{\"content\": [{\"type\": \"tool_use\", \"id\": \"\", \"name\": \"read_file\", \"input\": {}}], \"stop_reason\": \"tool_use\"}",
    b"{\"content\": [{\"type\": \"tool_use\", \"id\": \"a\", \"name\": \"task\", \"input\": {\"task\": \"   \"}}], \"stop_reason\": \"tool_use\"}",
    b"{\"content\": [{\"type\": \"tool_use\", \"id\": \"a\", \"name\": \"read_file\", \"input\": {\"path\": \"/etc/passwd\"}}], \"stop_reason\": \"tool_use\"}\xff\"../../etc/passwd\"",
    b"[{\"content\": [{\"type\": \"tool_use\", \"id\": \"a\", \"name\": \"todo_write\", \"input\": {\"items\": [{\"id\": \"1\", \"text\": \"x\", \"status\": \"in_progress\"}, {\"id\": \"1\", \"text\": \"y\", \"status\": \"in_progress\"}]}}], \"stop_reason\": \"tool_use\"}]\xff{\"items\": []}",
    b"{\"content\": [{\"type\": \"tool_use\", \"id\": \"a\", \"name\": \"read_file\", \"input\": {}}, {\"type\": \"tool_use\", \"id\": \"b\", \"name\": \"run_main\", \"input\": {}}], \"stop_reason\": \"tool_use\"}\xff[{\"id\": \"b\"}, {\"id\": \"a\"}, {\"id\": \"a\"}]",
    b"{\"content\": [{\"type\": \"text\", \"text\": \"\\ud800\"}], \"stop_reason\": \"end_turn\"}",
    b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    b"{\"content\": [], \"stop_reason\": \"end_turn\", \"usage\": {\"input_tokens\": 18446744073709551615, \"output_tokens\": 18446744073709551615}}",
];

#[test]
fn fuzz_regressions_keep_every_invariant() {
    for input in REGRESSIONS {
        subloop::testing::fuzz_bytes(input);
    }
}

#[test]
fn fuzz_seeds_keep_every_invariant() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut count = 0;
    for entry in std::fs::read_dir(&seeds).expect("fuzz/seeds") {
        let data = std::fs::read(entry.expect("entry").path()).expect("seed");
        subloop::testing::fuzz_bytes(&data);
        count += 1;
    }
    assert!(count >= 5, "expected the seed corpus, found {count} files");
}
