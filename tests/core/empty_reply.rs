//! `--on-empty-reply`: an empty `end_turn` is `protocol_error` by default, or
//! is answered once in a row with "Please continue." — for the parent and
//! every child — and the trace and the JSON say so.

use crate::common;

use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use subloop::core::protocol::Message;
use subloop::record::trace::RebuiltRequest;

fn script() -> Value {
    json!({
        "parent": [
            {"content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "main.py"}}], "stop_reason": "tool_use"},
            {"content": [], "stop_reason": "end_turn"},
            {"content": [{"type": "tool_use", "id": "toolu_2", "name": "task", "input": {"task": "Read expected.txt and say what it holds."}}], "stop_reason": "tool_use"},
            {"content": [{"type": "text", "text": "All checked."}], "stop_reason": "end_turn"}
        ],
        "children": [[
            {"content": [], "stop_reason": "end_turn"},
            {"content": [{"type": "text", "text": "It holds the expected output."}], "stop_reason": "end_turn"}
        ]]
    })
}

fn run(dir: &common::TempDir, extra: &[&str]) -> Output {
    let script = dir.write("script.json", script().to_string());
    let workspace = common::examples().join("workspace");
    Command::new(common::bin())
        .arg("run")
        .arg("--workspace")
        .arg(&workspace)
        .arg("--script")
        .arg(&script)
        .args(["--json", "--quiet"])
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

#[test]
fn continue_answers_empty_replies_of_the_parent_and_the_child_and_says_so() {
    let dir = common::TempDir::new("empty-reply");
    let trace = dir.path().join("trace.jsonl");
    let trace_arg = trace.to_str().expect("utf-8 path");
    let output = run(
        &dir,
        &["--on-empty-reply", "continue", "--trace", trace_arg],
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(json["status"], "answered");
    assert_eq!(json["text"], "All checked.");
    assert_eq!(
        json["calls"], 4,
        "the empty reply counts against the budget"
    );
    assert_eq!(json["empty_replies_continued"], 1);
    assert_eq!(json["children"][0]["status"], "answered");
    assert_eq!(json["children"][0]["calls"], 2);
    assert_eq!(json["children"][0]["empty_replies_continued"], 1);

    let text = std::fs::read_to_string(&trace).expect("trace written");
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect();
    let empties: Vec<(&str, u64)> = lines
        .iter()
        .filter(|line| line["kind"] == "empty_reply")
        .map(|line| {
            assert_eq!(
                line["continued_with"],
                subloop::core::conversation::OnEmptyReply::CONTINUE_PROMPT
            );
            (
                line["agent"].as_str().unwrap_or_default(),
                line["call"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(empties, [("parent", 2), ("child-1", 1)]);
    // The prompt is part of the history: the trace rebuilds the requests
    // with it, and it goes in a message of its own, after the tool results.
    let rebuilt = RebuiltRequest::from_trace(&text).expect("the trace rebuilds");
    let parent: Vec<_> = rebuilt.iter().filter(|r| r.agent == "parent").collect();
    assert_eq!(parent.len(), 4);
    assert_eq!(
        parent[2].messages.last(),
        Some(&Message::user_text(
            subloop::core::conversation::OnEmptyReply::CONTINUE_PROMPT
        ))
    );
    assert_eq!(parent[2].messages.len(), 4);
    assert_eq!(parent[2].messages[2].content[0].kind(), "tool_result");
    let child: Vec<_> = rebuilt.iter().filter(|r| r.agent == "child-1").collect();
    assert_eq!(child[1].messages.len(), 2);
    assert_eq!(
        child[1].messages[1],
        Message::user_text(subloop::core::conversation::OnEmptyReply::CONTINUE_PROMPT)
    );
}

#[test]
fn the_default_and_stop_finish_an_empty_reply_protocol_error() {
    let dir = common::TempDir::new("empty-reply-stop");
    for extra in [&[][..], &["--on-empty-reply", "stop"][..]] {
        let output = run(&dir, extra);
        assert_eq!(output.status.code(), Some(1));
        let json: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
        assert_eq!(json["status"], "protocol_error");
        assert_eq!(json["calls"], 2);
        assert_eq!(json["empty_replies_continued"], 0);
        assert!(
            json["text"]
                .as_str()
                .is_some_and(|text| text.contains("end_turn but the reply holds no text")),
            "{json}"
        );
    }
    let bad = run(&dir, &["--on-empty-reply", "retry"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--on-empty-reply takes stop or continue"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
