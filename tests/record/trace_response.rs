//! The trace's `response` line is the reply as received: for a script, the
//! entry as written (the live client's form is checked in `tests/providers/live_fidelity.rs`).

use crate::common;

use std::process::{Command, Stdio};

use serde_json::{Value, json};

#[test]
fn a_scripted_reply_is_traced_as_the_script_wrote_it() {
    let parent_first = json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "task", "input": {"task": "Read expected.txt."}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 12, "output_tokens": 7, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "service_tier": "standard",
                  "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}}
    });
    let parent_last = json!({"content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn",
        "container": null, "context_management": {"applied_edits": []}});
    let child = json!({"id": "msg_c1", "model": "claude-haiku-4-5",
        "content": [{"type": "text", "text": "It says 42."}], "stop_reason": "end_turn", "stop_sequence": null});
    let script = json!({"parent": [parent_first, parent_last], "children": [[child]]});
    let dir = common::TempDir::new("trace-response");
    let script_path = dir.write("script.json", script.to_string());
    let trace = dir.path().join("trace.jsonl");
    let output = Command::new(common::bin())
        .arg("run")
        .arg("--workspace")
        .arg(common::examples().join("workspace"))
        .arg("--script")
        .arg(&script_path)
        .arg("--trace")
        .arg(&trace)
        .arg("--quiet")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("run subloop");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&trace).expect("trace written");
    let responses: Vec<(String, Value)> = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("JSON line"))
        .filter(|line| line["kind"] == "response")
        .map(|line| {
            (
                line["agent"].as_str().unwrap_or_default().to_owned(),
                line["response"].clone(),
            )
        })
        .collect();
    assert_eq!(
        responses,
        [
            ("parent".to_owned(), script["parent"][0].clone()),
            ("child-1".to_owned(), script["children"][0][0].clone()),
            ("parent".to_owned(), script["parent"][1].clone()),
        ]
    );
}
