//! `subloop run --script`: replaying scripts through the binary, its output
//! and its exit codes (0 answered, 1 any other status, 2 unusable input).

use crate::common;

use common::{MARKER, marker_workspace, pairs, tools};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use common::TempDir;

fn subloop(args: &[&str]) -> Output {
    Command::new(common::bin())
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("stderr is UTF-8")
}

fn script(name: &str) -> String {
    common::examples()
        .join("scripts")
        .join(name)
        .to_str()
        .unwrap()
        .to_owned()
}

fn workspace() -> String {
    common::examples()
        .join("workspace")
        .to_str()
        .unwrap()
        .to_owned()
}

/// `run --workspace <demo workspace> --script <example script> <extra>`.
fn run_example(name: &str, extra: &[&str]) -> Output {
    let ws = workspace();
    let sc = script(name);
    let mut args = vec!["run", "--workspace", ws.as_str(), "--script", sc.as_str()];
    args.extend_from_slice(extra);
    subloop(&args)
}

/// Parses stdout as exactly one JSON object.
fn one_object(output: &Output) -> Value {
    let out = stdout(output);
    assert_eq!(out.lines().count(), 1, "one line on stdout: {out}");
    let mut stream = serde_json::Deserializer::from_str(&out).into_iter::<Value>();
    let value = stream.next().expect("a JSON value").expect("valid JSON");
    assert!(stream.next().is_none(), "exactly one JSON value: {out}");
    assert!(value.is_object(), "{value}");
    for key in ["status", "text", "calls", "tools"] {
        assert!(value.get(key).is_some(), "missing `{key}` in {value}");
    }
    value
}

fn marker(dir: &TempDir) -> PathBuf {
    dir.path().join(MARKER)
}

/// A script that would run main.py at once if it were replayed.
fn run_main_script() -> Value {
    json!({"parent": [
        {"content": [{"type": "tool_use", "id": "toolu_r", "name": "run_main", "input": {}}],
         "stop_reason": "tool_use"},
        {"content": [{"type": "text", "text": "ran"}], "stop_reason": "end_turn"}
    ]})
}

// ------------------------------------------------------------ the examples

#[test]
fn answer_prints_the_text_and_exits_0() {
    let output = run_example("answer.json", &[]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(stdout(&output), "Hello! I answer without tools.\n");
    assert!(stderr(&output).contains("[parent] finished: answered after 1 model call(s)"));
}

#[test]
fn tool_round_exits_0() {
    let output = run_example("tool_round.json", &[]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        stdout(&output),
        "main.py prints 6 * 7 and expected.txt holds 42: they agree (not run).\n"
    );
    let err = stderr(&output);
    assert!(
        err.contains("[parent]   read_file -> ok: print(6 * 7)"),
        "{err}"
    );
    assert!(err.contains("[parent]   read_file -> ok: 42"), "{err}");

    let output = run_example("tool_round.json", &["--json"]);
    assert_eq!(output.status.code(), Some(0));
    let value = one_object(&output);
    assert_eq!(value["status"], "answered");
    assert_eq!(value["calls"], 2);
    assert_eq!(
        tools(&value),
        pairs(&[("read_file", "not_required"), ("read_file", "not_required")])
    );
}

#[test]
fn protocol_error_exits_1() {
    let output = run_example("protocol_error.json", &[]);
    assert_eq!(output.status.code(), Some(1));
    let out = stdout(&output);
    assert!(out.contains("protocol error"), "{out}");
    assert!(out.contains("toolu_01"), "{out}");

    let value = one_object(&run_example("protocol_error.json", &["--json"]));
    assert_eq!(value["status"], "protocol_error");
    assert_eq!(value["calls"], 1);
    assert_eq!(value["tools"], json!([]));
}

#[test]
fn check_and_run_with_allow_runs_the_program() {
    let output = run_example("check_and_run.json", &["--decision", "allow"]);
    assert_eq!(output.status.code(), Some(0));
    let err = stderr(&output);
    assert!(err.contains("[parent]   run_main -> ok:"), "{err}");
    let run_line = err
        .lines()
        .find(|line| line.contains("run_main -> ok:"))
        .unwrap();
    assert!(
        run_line.ends_with(r#"exit code 0, stdout: "42\n""#),
        "{run_line}"
    );

    let output = run_example("check_and_run.json", &["--decision", "allow", "--json"]);
    assert_eq!(output.status.code(), Some(0));
    let value = one_object(&output);
    assert_eq!(value["status"], "answered");
    assert_eq!(value["calls"], 4);
    assert_eq!(
        tools(&value),
        pairs(&[
            ("read_file", "not_required"),
            ("read_file", "not_required"),
            ("run_main", "allowed"),
        ])
    );
    assert_eq!(value["tools"][2]["is_error"], false);
}

#[test]
fn check_and_run_with_deny_does_not_run_it() {
    let ws = marker_workspace();
    let path = ws.path().to_str().unwrap();
    let sc = script("check_and_run.json");
    let output = subloop(&[
        "run",
        "--workspace",
        path,
        "--script",
        &sc,
        "--decision",
        "deny",
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(0));
    let value = one_object(&output);
    assert_eq!(
        tools(&value),
        pairs(&[
            ("read_file", "not_required"),
            ("read_file", "not_required"),
            ("run_main", "denied"),
        ])
    );
    assert_eq!(value["tools"][2]["is_error"], true);
    let err = stderr(&output);
    assert!(
        err.contains("[parent]   run_main -> error: not executed: permission denied"),
        "{err}"
    );
    assert!(!marker(&ws).exists(), "a denied run_main starts no process");

    // Control: the same workspace and script with allow do leave the marker.
    let output = subloop(&[
        "run",
        "--workspace",
        path,
        "--script",
        &sc,
        "--decision",
        "allow",
    ]);
    assert_eq!(output.status.code(), Some(0));
    assert!(marker(&ws).exists());
}

#[test]
fn the_default_decision_denies_on_a_non_terminal() {
    let output = run_example("check_and_run.json", &["--json"]);
    assert_eq!(output.status.code(), Some(0));
    let value = one_object(&output);
    assert_eq!(value["tools"][2]["decision"], "denied");
    assert!(stderr(&output).contains("--decision allow"));
}

#[test]
fn json_prints_exactly_one_object() {
    let output = run_example("answer.json", &["--json"]);
    assert_eq!(output.status.code(), Some(0));
    let value = one_object(&output);
    assert_eq!(value["status"], "answered");
    assert_eq!(value["text"], "Hello! I answer without tools.");
    assert_eq!(value["calls"], 1);
    assert_eq!(value["tools"], json!([]));
    assert_eq!(value["children"], json!([]));
}

#[test]
fn the_delegate_example_runs_its_child() {
    let output = run_example("delegate.json", &["--json"]);
    assert_eq!(output.status.code(), Some(0));
    let value = one_object(&output);
    assert_eq!(value["text"], "The subagent says main.py derives 42.");
    let child = &value["children"][0];
    assert_eq!(child["agent"], "child-1");
    assert_eq!(child["parent_tool_use_id"], "toolu_p1");
    assert_eq!(child["status"], "answered");
    assert_eq!(child["summary"], "main.py prints 6 * 7 = 42; not run.");
    assert_eq!(child["calls"], 2);
}

// ----------------------------------------------------------- unusable input

fn assert_refused(output: &Output, what: &str) {
    assert_eq!(output.status.code(), Some(2), "{what}");
    assert_eq!(stdout(output), "", "{what}: nothing on stdout");
    let err = stderr(output);
    assert_eq!(err.lines().count(), 1, "{what}: one line on stderr: {err}");
    assert!(err.starts_with("subloop: "), "{what}: {err}");
    assert!(!err.contains("[parent]"), "{what}: nothing ran: {err}");
}

#[test]
fn unusable_scripts_exit_2_and_run_nothing() {
    let ws = marker_workspace();
    let path = ws.path().to_str().unwrap();
    let dir = TempDir::new("cli-scripts");
    let missing = dir.path().join("no-such-script.json");
    let not_json = dir.write("broken.json", "{\"parent\": [");
    let no_parent = dir.write(
        "no_parent.json",
        json!({"children": [run_main_script()["parent"].clone()]}).to_string(),
    );
    let parent_not_list = dir.write(
        "bad_parent.json",
        r#"{"parent": {"stop_reason": "end_turn"}}"#,
    );
    let mut later_not_a_message = run_main_script();
    later_not_a_message["parent"][1] = json!({"content": "oops", "stop_reason": "end_turn"});
    let later_not_a_message = dir.write("not_a_message.json", later_not_a_message.to_string());
    let child_not_a_message = dir.write(
        "child_not_a_message.json",
        json!({"parent": run_main_script()["parent"], "children": [[{"foo": 1}]]}).to_string(),
    );
    let cases: [(&str, &Path); 7] = [
        ("missing file", &missing),
        ("a directory", dir.path()),
        ("invalid JSON", &not_json),
        ("no parent", &no_parent),
        ("parent not a list", &parent_not_list),
        ("a later reply that is not a message", &later_not_a_message),
        ("a child reply that is not a message", &child_not_a_message),
    ];
    for (what, script) in cases {
        let output = subloop(&[
            "run",
            "--workspace",
            path,
            "--script",
            script.to_str().unwrap(),
            "--decision",
            "allow",
        ]);
        assert_refused(&output, what);
        assert!(!marker(&ws).exists(), "{what}");
    }
    let err = stderr(&subloop(&[
        "run",
        "--workspace",
        path,
        "--script",
        no_parent.to_str().unwrap(),
    ]));
    assert!(err.contains("parent"), "{err}");
    let err = stderr(&subloop(&[
        "run",
        "--workspace",
        path,
        "--script",
        missing.to_str().unwrap(),
    ]));
    assert!(err.contains("no-such-script.json"), "{err}");
    let err = stderr(&subloop(&[
        "run",
        "--workspace",
        path,
        "--script",
        later_not_a_message.to_str().unwrap(),
    ]));
    assert!(
        err.contains("parent[1]") && err.contains("not a message"),
        "{err}"
    );
}

#[test]
fn unusable_workspaces_and_flags_exit_2() {
    let dir = TempDir::new("cli-ws");
    let valid = dir.write("run.json", run_main_script().to_string());
    let valid = valid.to_str().unwrap();
    let missing = dir.path().join("no-such-dir");
    let file = dir.write("a-file.txt", "not a directory");

    let output = subloop(&[
        "run",
        "--workspace",
        missing.to_str().unwrap(),
        "--script",
        valid,
        "--decision",
        "allow",
    ]);
    assert_refused(&output, "missing workspace");
    assert!(stderr(&output).contains("no-such-dir"));

    let output = subloop(&[
        "run",
        "--workspace",
        file.to_str().unwrap(),
        "--script",
        valid,
        "--decision",
        "allow",
    ]);
    assert_refused(&output, "workspace is a file");
    assert!(stderr(&output).contains("not a directory"));

    let ws = marker_workspace();
    let path = ws.path().to_str().unwrap();
    let output = subloop(&["run", "--workspace", path, "--decision", "allow"]);
    assert_refused(&output, "missing --script");
    assert!(stderr(&output).contains("--script"));

    let output = subloop(&["run", "--script", valid, "--decision", "allow"]);
    assert_refused(&output, "missing --workspace");

    for extra in [
        &["--max-calls", "0"][..],
        &["--decision", "sometimes"][..],
        &["--child-calls", "9"][..],
        &["--bogus"][..],
    ] {
        let mut args = vec!["run", "--workspace", path, "--script", valid];
        args.extend_from_slice(extra);
        assert_refused(&subloop(&args), &format!("{extra:?}"));
    }
    assert!(!marker(&ws).exists());

    // Control: the same script and workspace do run when nothing is wrong.
    let output = subloop(&[
        "run",
        "--workspace",
        path,
        "--script",
        valid,
        "--decision",
        "allow",
    ]);
    assert_eq!(output.status.code(), Some(0));
    assert!(marker(&ws).exists());
}

// ------------------------------------------------------------- scripts ending

#[test]
fn a_parent_that_runs_out_of_script_is_a_model_error() {
    let dir = TempDir::new("cli-exhausted");
    let script = dir.write(
        "short.json",
        json!({"parent": [
            {"content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file",
                          "input": {"path": "expected.txt"}}],
             "stop_reason": "tool_use"}
        ]})
        .to_string(),
    );
    let ws = workspace();
    let output = subloop(&[
        "run",
        "--workspace",
        &ws,
        "--script",
        script.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let out = stdout(&output);
    assert!(out.contains("script exhausted"), "{out}");

    let output = subloop(&[
        "run",
        "--workspace",
        &ws,
        "--script",
        script.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let value = one_object(&output);
    assert_eq!(value["status"], "model_error");
    assert_eq!(value["calls"], 2);
    assert!(value["text"].as_str().unwrap().contains("script exhausted"));
    assert_eq!(tools(&value), pairs(&[("read_file", "not_required")]));
}

#[test]
fn a_delegation_without_a_child_script_reports_model_error_and_the_parent_continues() {
    let dir = TempDir::new("cli-nochild");
    let script = dir.write(
        "delegate.json",
        json!({"parent": [
            {"content": [{"type": "tool_use", "id": "toolu_p1", "name": "task",
                          "input": {"task": "Read main.py."}}],
             "stop_reason": "tool_use"},
            {"content": [{"type": "text", "text": "The subagent failed; I carry on."}],
             "stop_reason": "end_turn"}
        ]})
        .to_string(),
    );
    let ws = workspace();
    let output = subloop(&[
        "run",
        "--workspace",
        &ws,
        "--script",
        script.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(0));
    let value = one_object(&output);
    assert_eq!(value["status"], "answered");
    assert_eq!(value["text"], "The subagent failed; I carry on.");
    assert_eq!(value["calls"], 2);
    assert_eq!(value["tools"][0]["name"], "task");
    assert_eq!(value["tools"][0]["is_error"], true);
    let children = value["children"].as_array().unwrap();
    assert_eq!(children.len(), 1);
    let child = &children[0];
    assert_eq!(child["agent"], "child-1");
    assert_eq!(child["parent_tool_use_id"], "toolu_p1");
    assert_eq!(child["status"], "model_error");
    assert_eq!(child["calls"], 1);
    assert_eq!(child["is_error"], true);
    let summary = child["summary"].as_str().unwrap();
    assert!(summary.contains("children[0]"), "{summary}");
    assert!(stderr(&output).contains("[child-1] finished: model_error"));
}

/// A `--json` output of megabytes, written straight into the pipe in
/// chunks, is still exactly one JSON object and one line break, with every
/// result's full content.
#[test]
fn a_long_json_output_is_one_complete_object_with_every_content() {
    const TURNS: usize = 300;
    let ws = TempDir::new("long-json");
    let content: String = "0123456789abcdef\"\\\n".repeat(4096 / 19);
    ws.write("data.txt", &content);
    let mut replies: Vec<Value> = (1..=TURNS)
        .map(|turn| {
            json!({
                "content": [{"type": "tool_use", "id": format!("toolu_{turn}"), "name": "read_file", "input": {"path": "data.txt"}}],
                "stop_reason": "tool_use"
            })
        })
        .collect();
    replies.push(json!({"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}));
    let script = ws.write("script.json", json!({ "parent": replies }).to_string());
    let max_calls = (TURNS + 1).to_string();
    let output = subloop(&[
        "run",
        "--quiet",
        "--json",
        "--decision",
        "deny",
        "--max-calls",
        &max_calls,
        "--workspace",
        ws.path().to_str().unwrap(),
        "--script",
        script.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let out = stdout(&output);
    assert!(out.len() > TURNS * 4096, "{} bytes", out.len());
    assert_eq!(out.matches('\n').count(), 1, "one line");
    assert!(out.ends_with('\n'));
    let report = one_object(&output);
    let tools = report["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), TURNS);
    for (index, tool) in tools.iter().enumerate() {
        assert_eq!(tool["id"], format!("toolu_{}", index + 1));
        assert_eq!(tool["content"], content.as_str(), "call {}", index + 1);
    }
}

// ------------------------------------------------------------ --output-schema

fn verdict_schema() -> String {
    common::examples()
        .join("verdict.schema.json")
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn output_schema_sends_a_prose_answer_back_and_puts_the_value_in_the_json() {
    let dir = TempDir::new("structured");
    let trace = dir.path().join("run.jsonl");
    let schema = verdict_schema();
    let output = run_example(
        "structured.json",
        &[
            "--output-schema",
            &schema,
            "--json",
            "--quiet",
            "--trace",
            trace.to_str().unwrap(),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report = one_object(&output);
    assert_eq!(report["status"], "answered");
    assert_eq!(report["output"]["verdict"], "matches");
    assert_eq!(report["output"]["printed"], "42");
    assert_eq!(report["calls"], 3);
    // The trace records the schema and the answer sent back; view shows both.
    let lines = std::fs::read_to_string(&trace).unwrap();
    assert!(lines.contains("\"output_schema\""), "{lines}");
    assert!(lines.contains("\"kind\":\"invalid_answer\""), "{lines}");
    let view = subloop(&["view", trace.to_str().unwrap(), "--check"]);
    assert_eq!(view.status.code(), Some(0), "{}", stdout(&view));
    let text = stdout(&view);
    assert!(
        text.contains("parent answers must match the output schema"),
        "{text}"
    );
    assert!(
        text.contains("parent answer 2 does not match the output schema: the answer is not JSON"),
        "{text}"
    );
    // A replay checks the answers as the recorded run did.
    let replay = subloop(&[
        "replay",
        trace.to_str().unwrap(),
        "--workspace",
        &workspace(),
        "--quiet",
    ]);
    assert!(
        stdout(&replay).starts_with("reproduced"),
        "{}",
        stdout(&replay)
    );
}

#[test]
fn output_schema_ends_invalid_output_with_exit_1_after_the_retries() {
    let schema = verdict_schema();
    let output = run_example(
        "structured.json",
        &[
            "--output-schema",
            &schema,
            "--output-retries",
            "0",
            "--json",
            "--quiet",
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    let report = one_object(&output);
    assert_eq!(report["status"], "invalid_output");
    assert_eq!(report["calls"], 2);
    assert!(report.get("output").is_none());
    assert!(
        report["output_error"]
            .as_str()
            .is_some_and(|error| error.starts_with("the answer is not JSON")),
        "{report}"
    );
    // Without --json: the last answer on stdout, why it is not one on stderr.
    let output = run_example(
        "structured.json",
        &[
            "--output-schema",
            &schema,
            "--output-retries",
            "0",
            "--quiet",
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout(&output).starts_with("main.py prints 6 * 7"));
    assert!(
        stderr(&output).contains(
            "subloop: the answer does not match the output schema: the answer is not JSON"
        ),
        "{}",
        stderr(&output)
    );
}

#[test]
fn an_unusable_output_schema_file_is_a_usage_error() {
    let dir = TempDir::new("bad-schema");
    let not_json = dir.write("schema.json", "{ not json");
    let array = dir.write("array.json", "[1, 2]");
    for (path, says) in [
        (not_json.to_str().unwrap(), "it is not JSON"),
        (
            array.to_str().unwrap(),
            "a JSON Schema file holds an object",
        ),
        ("/nonexistent/schema.json", "cannot read it"),
    ] {
        let output = run_example("answer.json", &["--output-schema", path]);
        assert_eq!(output.status.code(), Some(2), "{path}");
        let err = stderr(&output);
        assert!(
            err.contains("--output-schema") && err.contains(says),
            "{err}"
        );
        assert!(stdout(&output).is_empty());
    }
}
