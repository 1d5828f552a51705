//! The three demo runs of `subloop demo`, through the binary, with exact call
//! counts; the default decision on a non-terminal; a run outside the
//! repository; and bad flags.

use crate::common;

use common::{MARKER, marker_workspace, pairs, tools};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use common::TempDir;

fn subloop_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(common::bin())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

fn subloop(args: &[&str]) -> Output {
    subloop_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("stderr is UTF-8")
}

/// Runs `demo --json ...` and parses the one JSON object it prints.
fn demo_json_in(dir: &Path, args: &[&str]) -> (Option<i32>, Value, String) {
    let mut all = vec!["demo", "--json"];
    all.extend_from_slice(args);
    let output = subloop_in(dir, &all);
    let out = stdout(&output);
    assert_eq!(out.lines().count(), 1, "one JSON line on stdout: {out}");
    let value: Value = serde_json::from_str(&out).expect("stdout is one JSON object");
    (output.status.code(), value, stderr(&output))
}

fn demo_json(args: &[&str]) -> (Option<i32>, Value, String) {
    demo_json_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

fn only_child(value: &Value) -> &Value {
    let children = value["children"].as_array().expect("children array");
    assert_eq!(children.len(), 1, "exactly one child: {value}");
    &children[0]
}

#[test]
fn allow_runs_the_program_and_confirms_42() {
    let (code, value, _) = demo_json(&["--decision", "allow"]);
    assert_eq!(code, Some(0), "{value}");
    assert_eq!(value["status"], "answered");
    assert_eq!(value["calls"], 4);
    let text = value["text"].as_str().unwrap();
    assert!(text.contains("42"), "{text}");
    assert!(text.contains("matches"), "{text}");
    assert!(text.contains("The program printed 42"), "{text}");
    assert_eq!(
        tools(&value),
        pairs(&[
            ("task", "not_required"),
            ("read_file", "not_required"),
            ("run_main", "allowed"),
        ])
    );
    let child = only_child(&value);
    assert_eq!(child["agent"], "child-1");
    assert_eq!(child["status"], "answered");
    assert_eq!(child["calls"], 3);
    assert_eq!(child["summary"], "source derives 42; not run yet");
    assert_eq!(child["is_error"], false);
    assert_eq!(child["parent_tool_use_id"], value["tools"][0]["id"]);
    assert_eq!(
        tools(child),
        pairs(&[("read_file", "not_required"), ("read_file", "not_required")])
    );
}

#[test]
fn allow_on_a_marker_workspace_starts_the_program() {
    // The control for the deny run below: the marker does appear when allowed.
    let ws = marker_workspace();
    let path = ws.path().to_str().unwrap();
    let (code, value, _) = demo_json(&["--decision", "allow", "--workspace", path]);
    assert_eq!(code, Some(0), "{value}");
    assert!(value["text"].as_str().unwrap().contains("matches"));
    assert!(ws.path().join(MARKER).exists());
}

#[test]
fn deny_does_not_start_the_program() {
    let ws = marker_workspace();
    let path = ws.path().to_str().unwrap();
    let (code, value, _) = demo_json(&["--decision", "deny", "--workspace", path]);
    assert_eq!(code, Some(0), "{value}");
    assert_eq!(value["status"], "answered");
    assert_eq!(value["calls"], 4);
    let text = value["text"].as_str().unwrap();
    assert!(text.contains("not run"), "{text}");
    assert!(text.contains("not executed: permission denied"), "{text}");
    assert!(!text.contains("matches expected"), "{text}");
    assert_eq!(
        tools(&value),
        pairs(&[
            ("task", "not_required"),
            ("read_file", "not_required"),
            ("run_main", "denied"),
        ])
    );
    assert_eq!(value["tools"][2]["is_error"], true);
    let child = only_child(&value);
    assert_eq!(child["status"], "answered");
    assert_eq!(child["calls"], 3);
    assert!(!ws.path().join(MARKER).exists(), "no process may start");
}

#[test]
fn one_child_call_ends_in_call_limit_and_the_parent_gives_up() {
    let (code, value, _) = demo_json(&["--decision", "allow", "--child-calls", "1"]);
    assert_eq!(code, Some(0), "{value}");
    assert_eq!(value["status"], "answered");
    assert_eq!(value["calls"], 2);
    let text = value["text"].as_str().unwrap();
    assert!(text.contains("could not conclude"), "{text}");
    assert!(text.contains("call_limit"), "{text}");
    assert_eq!(tools(&value), pairs(&[("task", "not_required")]));
    assert_eq!(value["tools"][0]["is_error"], true);
    let child = only_child(&value);
    assert_eq!(child["status"], "call_limit");
    assert_eq!(child["calls"], 1);
    assert_eq!(child["is_error"], true);
    assert_eq!(tools(child), pairs(&[("read_file", "not_required")]));
}

#[test]
fn the_default_decision_asks_and_a_non_terminal_denies() {
    let ws = marker_workspace();
    let path = ws.path().to_str().unwrap();
    let (code, value, err) = demo_json(&["--workspace", path]);
    assert_eq!(code, Some(0), "{value}");
    assert_eq!(value["calls"], 4);
    assert_eq!(
        tools(&value),
        pairs(&[
            ("task", "not_required"),
            ("read_file", "not_required"),
            ("run_main", "denied"),
        ])
    );
    assert!(value["text"].as_str().unwrap().contains("not run"));
    assert!(err.contains("--decision allow"), "says how to allow: {err}");
    assert!(!ws.path().join(MARKER).exists());
}

/// The workspace the demo announces on stderr.
fn announced_workspace(err: &str) -> PathBuf {
    let line = err
        .lines()
        .find_map(|line| line.strip_prefix("[demo] workspace: "))
        .unwrap_or_else(|| panic!("no workspace line in {err}"));
    PathBuf::from(line.split(" (").next().unwrap_or(line))
}

#[test]
fn outside_the_repository_the_demo_makes_a_fresh_workspace() {
    let dir = TempDir::new("demo-elsewhere");
    assert!(!dir.path().join("examples").exists());
    let (code, value, err) = demo_json_in(dir.path(), &["--decision", "allow"]);
    let workspace = announced_workspace(&err);
    let inside_examples = workspace.ends_with("examples/workspace");
    assert!(err.contains("removed afterwards"), "{err}");
    assert!(
        workspace.starts_with(std::env::temp_dir()),
        "{}",
        workspace.display()
    );
    assert!(
        !workspace.exists(),
        "the temporary workspace is removed after the run"
    );
    assert!(!inside_examples, "{}", workspace.display());
    assert_eq!(code, Some(0), "{value}");
    assert_eq!(value["status"], "answered");
    assert_eq!(value["calls"], 4);
    let text = value["text"].as_str().unwrap();
    assert!(text.contains("42") && text.contains("matches"), "{text}");
    assert_eq!(only_child(&value)["calls"], 3);
}

#[test]
fn the_text_output_is_the_final_answer() {
    let output = subloop(&["demo", "--decision", "allow", "--quiet"]);
    assert_eq!(output.status.code(), Some(0));
    let out = stdout(&output);
    assert!(
        out.starts_with("The program printed 42, which matches expected.txt"),
        "{out}"
    );
    assert!(stderr(&output).is_empty(), "--quiet prints no progress");
}

#[test]
fn bad_flags_exit_2_with_one_line_and_no_stdout() {
    let cases: &[&[&str]] = &[
        &["demo", "--decision", "maybe"],
        &["demo", "--child-calls", "9"],
        &["demo", "--child-calls", "0"],
        &["demo", "--child-calls", "many"],
        &["demo", "--max-calls", "0"],
        &["demo", "--frobnicate"],
        &["demo", "--decision"],
        &["frobnicate"],
    ];
    for args in cases {
        let output = subloop(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert_eq!(stdout(&output), "", "{args:?}");
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("subloop: "), "{args:?}: {err}");
    }
    let err = stderr(&subloop(&["demo", "--decision", "maybe"]));
    assert!(err.contains("maybe"), "{err}");
    let err = stderr(&subloop(&["demo", "--child-calls", "9"]));
    assert!(err.contains("1 to 8"), "{err}");
    let err = stderr(&subloop(&["frobnicate"]));
    assert!(err.contains("frobnicate"), "{err}");
}

#[test]
fn a_demo_that_stops_before_running_leaves_no_temporary_workspace() {
    let dir = TempDir::new("demo-no-key");
    let child = Command::new(common::bin())
        .args(["demo", "--live"])
        .current_dir(dir.path())
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let prefix = format!("subloop-demo-{}-", child.id());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
