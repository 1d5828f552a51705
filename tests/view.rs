//! `subloop view TRACE`: the timeline of a recorded run, children under
//! their `task` call, the outcome, and the invariants; `--check` exits 1
//! when one is broken.

mod common;

use std::process::{Command, Output, Stdio};

use common::TempDir;

fn subloop(args: &[&str]) -> Output {
    Command::new(common::bin())
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_timeline_shows_every_call_with_children_under_their_task() {
    let dir = TempDir::new("view");
    let trace = dir.path().join("deny.jsonl");
    let trace_arg = trace.to_str().expect("utf-8");
    let out = subloop(&[
        "demo",
        "--decision",
        "deny",
        "--quiet",
        "--trace",
        trace_arg,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = subloop(&[
        "view",
        trace_arg,
        "--check",
        "--max-calls",
        "8",
        "--child-calls",
        "4",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(!shown.contains('\u{1b}'), "no colour when piped: {shown}");
    let lines: Vec<&str> = shown.lines().collect();
    assert!(
        lines[0].starts_with("parent call 1 (4 tools offered) -> tool_use"),
        "{shown}"
    );
    let task = lines
        .iter()
        .position(|line| line.starts_with("    tool task "))
        .expect("a task call");
    assert!(
        lines[task + 1].starts_with("    child-1 call 1 (1 tools offered) -> tool_use"),
        "{shown}"
    );
    assert!(
        lines[task + 2].starts_with("        tool read_file "),
        "{shown}"
    );
    assert!(shown.contains("tool run_main toolu_"), "{shown}");
    assert!(shown.contains("[denied error]: not executed"), "{shown}");
    assert!(shown.contains("\noutcome: answered — "), "{shown}");
    assert!(shown.contains("\n2 agent(s), "), "{shown}");
    assert_eq!(shown.matches("\n  held ").count(), 6, "{shown}");

    // A forged result for the denied call: the check fails and says where.
    let forged = std::fs::read_to_string(&trace)
        .expect("trace")
        .lines()
        .map(|line| {
            if line.contains("\"decision\":\"denied\"") {
                let mut value: serde_json::Value = serde_json::from_str(line).expect("json");
                value["content"] = serde_json::json!("42\n");
                value["is_error"] = serde_json::json!(false);
                value.to_string()
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let forged_path = dir.write("forged.jsonl", forged + "\n");
    let forged_arg = forged_path.to_str().expect("utf-8");
    let out = subloop(&["view", forged_arg]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "without --check the view is only shown"
    );
    let out = subloop(&["view", forged_arg, "--check"]);
    assert_eq!(out.status.code(), Some(1));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("  broken denied calls never ran\n      at parent toolu_"),
        "{shown}"
    );
    // A child whose task result is not on record (a run killed while it
    // ran) is still shown, after the parent, with the call that started it.
    let cut = std::fs::read_to_string(&trace)
        .expect("trace")
        .lines()
        .filter(|line| !(line.contains("\"kind\":\"tool\"") && line.contains("\"name\":\"task\"")))
        .map(|line| format!("{line}\n"))
        .collect::<String>();
    let cut_path = dir.write("cut.jsonl", cut);
    let out = subloop(&["view", cut_path.to_str().expect("utf-8")]);
    let shown = text(&out.stdout);
    assert!(shown.contains("\nchild-1 (started by toolu_parent_1, whose result is not recorded):\n    child-1 call 1 "), "{shown}");
    // An unreadable trace is a usage error.
    let out = subloop(&[
        "view",
        dir.path().join("missing.jsonl").to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).lines().count(),
        1,
        "{}",
        text(&out.stderr)
    );
    let out = subloop(&["view"]);
    assert_eq!(out.status.code(), Some(2));
}
