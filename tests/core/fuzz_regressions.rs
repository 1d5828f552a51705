//! The fuzz target's checks on its seeds and on inputs kept from fuzzing:
//! any crash input the fuzzer finds goes into `REGRESSIONS` below.

use std::path::Path;
use std::sync::Mutex;

use subloop::testing::FuzzWorkspace;

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
        workspace.fuzz_bytes(input);
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
        workspace.fuzz_bytes(&data);
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

/// Hostile traces for the `trace_view` target: cut, mistyped, with markup,
/// with ids answered twice, with a child that has no parent call.
const TRACE_REGRESSIONS: &[&str] = &[
    "",
    "\n\n",
    "{}",
    "null\n",
    r#"{"agent":"parent","call":1,"kind":"request","messages":[]}"#,
    r#"{"agent":"parent","call":1,"kind":"request","messages":[{"role":"user","content":"</script><!--"}],"system":"","tool_definitions":[],"tools":[]}
{"agent":"parent","call":1,"kind":"response","response":{"content":[{"type":"tool_use","id":"</script>","name":"task","input":{"task":"<b>"}}],"stop_reason":"tool_use"}}
{"agent":"child-9","call":1,"kind":"request","parent_tool_use_id":"nowhere","messages":[{"role":"user","content":"x"}],"system":"","tool_definitions":[],"tools":[]}
{"agent":"parent","kind":"tool","id":"</script>","name":"task","decision":"allowed","is_error":false,"content":"{\"status\":1}"}
{"agent":"parent","kind":"tool","id":"</script>","name":"task","decision":"allowed","is_error":false,"content":"twice"}"#,
    r#"{"agent":"parent","call":1,"kind":"request","messages":[{"role":"user","content":"q"}],"system":"","tool_definitions":[],"tools":[]}
{"agent":"parent","call":7,"kind":"response","response":{"content":[],"stop_reason":"end_turn"}}
{"agent":"parent","kind":"outcome","status":"answered","text":"\u202e\u0007","calls":99}"#,
];

#[test]
fn hostile_traces_are_checked_and_drawn_without_a_panic() {
    for trace in TRACE_REGRESSIONS {
        subloop::testing::fuzz_trace(trace.as_bytes());
    }
    // And every demo-like trace the suite writes, cut at every line.
    let dir = std::env::temp_dir().join(format!("subloop-fuzz-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let trace = dir.join("deny.jsonl");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_subloop"))
        .args(["demo", "--quiet", "--decision", "deny", "--trace"])
        .arg(&trace)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("demo");
    assert!(status.success());
    let text = std::fs::read_to_string(&trace).expect("trace");
    let _ = std::fs::remove_dir_all(&dir);
    for cut in 0..=text.len() {
        if text.is_char_boundary(cut) && (cut % 97 == 0 || text[..cut].ends_with('\n')) {
            subloop::testing::fuzz_trace(&text.as_bytes()[..cut]);
        }
    }
}
