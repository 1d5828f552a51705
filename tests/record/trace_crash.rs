//! A `subloop run --trace` killed with SIGKILL mid-run keeps every line it
//! wrote: each complete line parses, and nothing seen before the kill is lost.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[test]
fn sigkill_mid_run_loses_no_trace_line() {
    let dir = common::TempDir::new("trace-crash");
    let turns = 400;
    let mut parent: Vec<Value> = (0..turns)
        .map(|i| json!({"content": [{"type": "tool_use", "id": format!("toolu_{i}"), "name": "run_main", "input": {}}], "stop_reason": "tool_use"}))
        .collect();
    parent.push(json!({"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}));
    let script = dir.write("script.json", json!({"parent": parent}).to_string());
    // The trace may not live in the workspace, where the program could read it.
    let outside = common::TempDir::new("crash-trace");
    let trace = outside.path().join("trace.jsonl");
    let mut child = Command::new(common::bin())
        .args([
            "run",
            "--quiet",
            "--decision",
            "allow",
            "--max-calls",
            "401",
        ])
        .args(["--run-command", "sh -c 'echo ran >> marks; sleep 0.02'"])
        .arg("--workspace")
        .arg(dir.path())
        .arg("--script")
        .arg(&script)
        .arg("--trace")
        .arg(&trace)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start subloop");

    // Wait until the run is well under way, then take a snapshot and kill it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        let text = std::fs::read_to_string(&trace).unwrap_or_default();
        if text.lines().count() >= 40 {
            break text;
        }
        assert!(Instant::now() < deadline, "the trace did not grow");
        assert!(
            child.try_wait().expect("poll").is_none(),
            "the run ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Let a few more turns happen after the snapshot, so that anything a
    // writer kept in a buffer would be lost by the kill.
    std::thread::sleep(Duration::from_millis(200));
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reap");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );

    let after = std::fs::read_to_string(&trace).expect("trace after the kill");
    let complete_before = &before[..before.rfind('\n').map_or(0, |i| i + 1)];
    assert!(
        after.starts_with(complete_before),
        "lines written before the kill were lost"
    );
    let complete_after = &after[..after.rfind('\n').map_or(0, |i| i + 1)];
    let mut kinds = Vec::new();
    for (number, line) in complete_after.lines().enumerate() {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|err| panic!("line {}: {err}: {line}", number + 1));
        assert_eq!(value["agent"], "parent");
        kinds.push(value["kind"].as_str().unwrap_or_default().to_owned());
    }
    assert!(kinds.len() >= 40);
    // Every program that ran before the kill has its `tool` line, except
    // perhaps the one the kill interrupted: nothing sat in a buffer.
    let ran = std::fs::read_to_string(dir.path().join("marks"))
        .unwrap_or_default()
        .lines()
        .count();
    let recorded = kinds.iter().filter(|kind| kind.as_str() == "tool").count();
    assert!(ran >= 10, "only {ran} programs ran");
    assert!(
        recorded + 1 >= ran,
        "{ran} programs ran but only {recorded} tool lines reached the trace"
    );
    assert!(
        !kinds.contains(&"outcome".to_owned()),
        "the run was not cut short"
    );
    assert_eq!(kinds.first().map(String::as_str), Some("request"));
    // The rebuilt requests are a consistent prefix of the run.
    let rebuilt =
        subloop::record::trace::RebuiltRequest::from_trace(complete_after).expect("rebuild");
    assert!(rebuilt.len() >= 10);
    for (index, request) in rebuilt.iter().enumerate() {
        assert_eq!(request.call, index as u64 + 1);
        assert_eq!(request.messages.len(), 2 * index + 1);
    }
}
