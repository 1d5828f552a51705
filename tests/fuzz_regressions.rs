//! The fuzz target's checks on its seeds and on inputs kept from fuzzing:
//! any crash input the fuzzer finds goes into `REGRESSIONS` below.
#![cfg(feature = "testing")]

use std::path::Path;
use std::sync::Mutex;

use subloop::testing::{FuzzWorkspace, fuzz_bytes_in};

/// The tests below look for their own leftovers: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The temporary directories of this process's fuzz workspaces still there.
fn leftovers() -> Vec<String> {
    let prefix = format!("subloop-fuzz-{}", std::process::id());
    std::fs::read_dir(std::env::temp_dir())
        .expect("the temporary directory")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&prefix))
        .collect()
}

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
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    let workspace = FuzzWorkspace::new().expect("a fuzz workspace");
    for input in REGRESSIONS {
        fuzz_bytes_in(&workspace, input);
    }
    drop(workspace);
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "left in the temporary directory"
    );
}

#[test]
fn a_fuzz_workspace_is_removed_even_when_a_check_panics() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    let mut path = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let workspace = FuzzWorkspace::new().expect("a fuzz workspace");
        assert!(workspace.path().join("main.py").is_file());
        path = Some(workspace.path().to_owned());
        panic!("a broken invariant");
    }));
    assert!(result.is_err());
    let path = path.expect("the workspace was made");
    assert!(!path.exists(), "{} is left behind", path.display());
    assert_eq!(leftovers(), Vec::<String>::new());
}

#[test]
fn fuzz_seeds_keep_every_invariant() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    let workspace = FuzzWorkspace::new().expect("a fuzz workspace");
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut count = 0;
    for entry in std::fs::read_dir(&seeds).expect("fuzz/seeds") {
        let data = std::fs::read(entry.expect("entry").path()).expect("seed");
        fuzz_bytes_in(&workspace, &data);
        count += 1;
    }
    assert!(count >= 5, "expected the seed corpus, found {count} files");
    drop(workspace);
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "left in the temporary directory"
    );
}
