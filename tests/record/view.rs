//! `subloop view TRACE`: the timeline of a recorded run, children under
//! their `task` call, the outcome, and the invariants; `--check` exits 1
//! when one is broken.

use crate::common;

use std::path::Path;
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

/// The trace of `demo --decision deny`, written to `deny.jsonl` in `dir`.
fn deny_demo_trace(dir: &TempDir) -> std::path::PathBuf {
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
    trace
}

#[test]
fn the_timeline_shows_every_call_with_children_under_their_task() {
    let dir = TempDir::new("view");
    let trace = deny_demo_trace(&dir);
    let trace_arg = trace.to_str().expect("utf-8");
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
    assert_eq!(shown.matches("\n  held ").count(), 7, "{shown}");

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
        shown.contains("  broken denied calls never ran\n      at parent call 3 toolu_parent_3: "),
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

/// A script that reads a file and runs the program, then answers.
const SCRIPT: &str = "examples/scripts/check_and_run.json";

/// The page file is checked like a trace file before anything runs, and
/// without `--trace` the run's temporary trace is gone afterwards.
#[test]
fn the_view_page_is_checked_before_the_run_and_leaves_nothing_behind() {
    let dir = TempDir::new("view-page");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let ws = common::marker_workspace();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--quiet",
            "--decision",
            "allow",
            "--workspace",
            ws.path().to_str().expect("utf-8"),
            "--script",
        ];
        args.push(SCRIPT);
        args.extend_from_slice(extra);
        Command::new(common::bin())
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .output()
            .expect("run subloop")
    };
    let page = dir.path().join("deny.html");
    let page_arg = page.to_str().expect("utf-8");

    // Refused, exit 2, one line, nothing ran: inside the workspace, the
    // script, the trace itself.
    let inside = ws.path().join("main.py");
    let trace = dir.write("t.jsonl", "");
    for (flags, says) in [
        (
            vec!["--view", inside.to_str().expect("utf-8")],
            "is inside the workspace",
        ),
        (vec!["--view", SCRIPT], "is the script"),
        (
            vec![
                "--trace",
                trace.to_str().expect("utf-8"),
                "--view",
                trace.to_str().expect("utf-8"),
            ],
            "is the trace file",
        ),
    ] {
        let out = run(&flags);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flags:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("the view page") && err.contains(says), "{err}");
        assert!(
            !ws.path().join(common::MARKER).exists(),
            "{flags:?} ran the program"
        );
    }
    assert_eq!(
        std::fs::read_to_string(ws.path().join("main.py")).expect("main.py"),
        format!(
            "open('{}', 'w').write('ran')\nprint(6 * 7)\n",
            common::MARKER
        )
    );

    // Written, from a temporary trace that is then removed.
    let out = run(&["--view", page_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let html = std::fs::read_to_string(&page).expect("page");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(
        html.contains("\"invariant\":\"denied_never_ran\""),
        "the checks are in the page"
    );
    assert_eq!(
        std::fs::read_dir(&tmp).expect("tmp").count(),
        0,
        "the temporary trace is left"
    );

    // A page that cannot be written: the run's answer stands, one line
    // says why, and the exit is 1 (the record asked for is missing).
    let out = run(&["--view", "/dev/full", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("writing the view page /dev/full failed"),
        "{}",
        text(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["status"], "answered");
    assert!(json["warnings"].to_string().contains("view page"), "{json}");

    // `view -o`: the same page from a saved trace; the trace itself is refused.
    let out = run(&["--trace", trace.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let again = dir.path().join("again.html");
    let out = subloop(&[
        "view",
        trace.to_str().expect("utf-8"),
        "-o",
        again.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("every invariant held"));
    assert!(
        std::fs::read_to_string(&again)
            .expect("page")
            .contains("subloop-run")
    );
    let before = std::fs::read_to_string(&trace).expect("trace");
    let out = subloop(&[
        "view",
        trace.to_str().expect("utf-8"),
        "-o",
        trace.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        std::fs::read_to_string(&trace).expect("trace"),
        before,
        "the trace was touched"
    );
}

/// Found by attacking `--view`: a refused page touches no file, a run that
/// is killed keeps the old page, a trace that cannot be read back is
/// refused up front, and the temporary trace is a private, fresh file.
#[test]
fn the_view_page_never_costs_a_file_it_should_not() {
    let dir = TempDir::new("view-safety");
    let ws = common::marker_workspace();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--quiet",
            "--decision",
            "deny",
            "--workspace",
            ws.path().to_str().expect("utf-8"),
            "--script",
            SCRIPT,
        ];
        args.extend_from_slice(extra);
        Command::new(common::bin())
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .output()
            .expect("run subloop")
    };
    // A refused page leaves the trace as it was (it was truncated before).
    let trace = dir.write("kept.jsonl", "keep\n");
    let trace_arg = trace.to_str().expect("utf-8");
    for page in [SCRIPT, trace_arg] {
        let out = run(&["--trace", trace_arg, "--view", page]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert_eq!(
            std::fs::read_to_string(&trace).expect("trace"),
            "keep\n",
            "--view {page}"
        );
    }
    // The trace and the page named alike, the trace not there yet.
    let fresh = dir.path().join("fresh.jsonl");
    let fresh_arg = fresh.to_str().expect("utf-8");
    let out = run(&["--trace", fresh_arg, "--view", fresh_arg]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("is the trace file"),
        "{}",
        text(&out.stderr)
    );
    // A trace that is not a regular file cannot be read back for the page.
    let page = dir.path().join("page.html");
    let page_arg = page.to_str().expect("utf-8");
    let out = run(&["--trace", "/dev/null", "--view", page_arg]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a regular file"),
        "{}",
        text(&out.stderr)
    );
    assert!(!ws.path().join(common::MARKER).exists());
    // An old page stays until the new one is written: a run killed
    // mid-way leaves it as it was.
    std::fs::write(&page, "OLD PAGE").expect("old page");
    let slow = common::marker_workspace();
    slow.write("main.py", "import time\ntime.sleep(30)\n");
    let mut child = Command::new(common::bin())
        .args(["demo", "--quiet", "--decision", "allow", "--workspace"])
        .arg(slow.path())
        .args(["--view", page_arg])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("demo");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: signals the child we spawned.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let status = child.wait().expect("wait");
    assert_ne!(status.code(), Some(0), "the run was killed: {status:?}");
    assert_eq!(std::fs::read_to_string(&page).expect("page"), "OLD PAGE");
    // The page is written when the run ends.
    let out = run(&["--view", page_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        std::fs::read_to_string(&page)
            .expect("page")
            .starts_with("<!DOCTYPE html>")
    );
}

/// A `task` id used again in a follow-up question (some providers number
/// calls per reply) still finds its own child: the check holds, and each
/// child's report is its own.
#[test]
fn a_task_id_reused_across_questions_finds_its_own_child() {
    let dir = TempDir::new("view-reused");
    let ws = common::marker_workspace();
    let trace = dir.path().join("run.jsonl");
    let trace_arg = trace.to_str().expect("utf-8");
    let second = dir.write(
        "second.json",
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/scripts/delegate.json"),
        )
        .expect("script")
        .replace(
            "main.py prints 6 * 7 = 42; not run.",
            "the second child's answer",
        ),
    );
    let first = Command::new(common::bin())
        .args(["run", "--quiet", "--decision", "deny", "--workspace"])
        .arg(ws.path())
        .args([
            "--script",
            "examples/scripts/delegate.json",
            "--trace",
            trace_arg,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run");
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let page = dir.path().join("page.html");
    let again = Command::new(common::bin())
        .args(["run", "--quiet", "--decision", "deny", "--workspace"])
        .arg(ws.path())
        .arg("--script")
        .arg(&second)
        .args(["--resume", trace_arg, "--question", "And again?", "--view"])
        .arg(&page)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("follow-up");
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    let out = subloop(&["view", trace_arg, "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let shown = text(&out.stdout);
    let second_child = shown.find("child-2 call 1").expect("child-2 shown");
    let third_call = shown.find("parent call 3").expect("parent call 3");
    assert!(
        second_child > third_call,
        "child-2 is under the follow-up's task call:\n{shown}"
    );
    let html = std::fs::read_to_string(&page).expect("page");
    let start = html.find("id=\"subloop-run\">").expect("data") + 17;
    let end = start + html[start..].find("</script>").expect("end");
    let data: serde_json::Value = serde_json::from_str(&html[start..end]).expect("json");
    let lanes = data["lanes"].as_array().expect("lanes");
    let child2 = lanes
        .iter()
        .find(|lane| lane["agent"] == "child-2")
        .expect("child-2");
    assert_eq!(child2["report"]["summary"], "the second child's answer");
    assert_eq!(child2["started_in"], 3);
    let parent = &lanes[0];
    assert_eq!(parent["calls"][2]["uses"][0]["child"], "child-2");
    assert_eq!(parent["questions"], 2);
}

#[test]
fn a_last_line_cut_short_by_a_kill_is_left_out_with_a_note() {
    // A run killed while writing a long line leaves it unfinished: the view
    // shows the run up to there, says what it left out, and still refuses
    // a trace broken anywhere else.
    let dir = TempDir::new("view-cut");
    let trace = deny_demo_trace(&dir);
    let trace_arg = trace.to_str().expect("utf-8");
    let whole = std::fs::read_to_string(&trace).expect("trace");
    let last_start = whole.trim_end().rfind('\n').expect("several lines") + 1;
    // Cut as bytes: a kill can stop a write inside a character.
    let cut = &whole.as_bytes()[..last_start + (whole.len() - last_start) / 2];
    std::fs::write(&trace, cut).expect("cut trace");
    let lines_kept = whole[..last_start].lines().count();
    for flags in [&[][..], &["--check"][..]] {
        let mut args = vec!["view", trace_arg];
        args.extend_from_slice(flags);
        let out = subloop(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {err}");
        assert!(
            err.contains(&format!(
                "the last line (line {}) is cut short",
                lines_kept + 1
            )),
            "{err}"
        );
        assert!(text(&out.stdout).contains("parent call 1"), "{flags:?}");
    }
    let page = dir.path().join("deny.html");
    let out = subloop(&["view", trace_arg, "-o", page.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is cut short"));
    assert!(page.exists());
    // A broken line that is not the last one is still an error.
    let mut lines: Vec<&str> = whole.lines().collect();
    lines[1] = "{\"kind\": ";
    let broken = lines.join("\n") + "\n";
    std::fs::write(&trace, broken).expect("broken trace");
    let out = subloop(&["view", trace_arg]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // A complete last line without its newline is kept, not cut.
    std::fs::write(&trace, whole.trim_end()).expect("trace without newline");
    let out = subloop(&["view", trace_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("cut short"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_page_is_titled_after_its_trace_unless_the_trace_is_temporary() {
    let dir = TempDir::new("view-title");
    let title = |page: &Path| {
        let html = std::fs::read_to_string(page).expect("page");
        let start = html.find("<title>").expect("a title") + "<title>".len();
        let end = html.find("</title>").expect("a title's end");
        html[start..end].to_owned()
    };
    let page = dir.path().join("page.html");
    let page_arg = page.to_str().expect("utf-8");
    let trace = dir.path().join("kept.jsonl");
    let trace_arg = trace.to_str().expect("utf-8");
    // Under --view with --trace, and under view -o: the trace's name.
    let out = subloop(&["demo", "--quiet", "--trace", trace_arg, "--view", page_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(title(&page), "subloop run: kept.jsonl");
    let out = subloop(&["view", trace_arg, "-o", page_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(title(&page), "subloop run: kept.jsonl");
    // A temporary trace's name would mean nothing: the page's own name.
    let out = subloop(&["demo", "--quiet", "--view", page_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(title(&page), "subloop run: page.html");
}

/// A `call_limit` trace: run_main (toolu_01), then read_file (toolu_02),
/// with a budget of 2; its lines as JSON values.
fn call_limit_trace(dir: &TempDir) -> Vec<serde_json::Value> {
    use serde_json::json;
    dir.write("ws/main.py", "print(6 * 7)\n");
    dir.write("ws/expected.txt", "42\n");
    let script = dir.write(
        "script.json",
        json!({"parent": [
            {"content": [{"type": "tool_use", "id": "toolu_01", "name": "run_main", "input": {}}],
             "stop_reason": "tool_use"},
            {"content": [{"type": "tool_use", "id": "toolu_02", "name": "read_file",
                          "input": {"path": "expected.txt"}}],
             "stop_reason": "tool_use"}
        ]})
        .to_string(),
    );
    let trace = dir.path().join("limit.jsonl");
    let ws = dir.path().join("ws");
    let out = subloop(&[
        "run",
        "--workspace",
        ws.to_str().expect("utf-8"),
        "--script",
        script.to_str().expect("utf-8"),
        "--decision",
        "allow",
        "--max-calls",
        "2",
        "--trace",
        trace.to_str().expect("utf-8"),
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    std::fs::read_to_string(&trace)
        .expect("trace")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

fn write_lines(dir: &TempDir, name: &str, lines: &[serde_json::Value]) -> std::path::PathBuf {
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    dir.write(name, text)
}

/// `view --check` exit code and output, and whether `run --resume` refused
/// the trace (exit 2) leaving it as it was.
fn check_and_resume(dir: &TempDir, trace: &Path) -> (Option<i32>, String, bool) {
    let before = std::fs::read(trace).expect("trace");
    let path = trace.to_str().expect("utf-8");
    let out = subloop(&["view", path, "--check"]);
    let shown = format!("{}{}", text(&out.stdout), text(&out.stderr));
    let rest = dir.write(
        "rest.json",
        r#"{"parent": [{"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}]}"#,
    );
    let ws = dir.path().join("ws");
    let resumed = subloop(&[
        "run",
        "--workspace",
        ws.to_str().expect("utf-8"),
        "--script",
        rest.to_str().expect("utf-8"),
        "--resume",
        path,
        "--max-calls",
        "8",
        "--decision",
        "deny",
        "--quiet",
    ]);
    let refused = resumed.status.code() == Some(2)
        && std::fs::read(trace).expect("trace") == before
        && !text(&resumed.stderr).is_empty();
    (out.status.code(), shown, refused)
}

/// What resume refuses, `--check` reports broken, with where: a round's
/// results removed from the history, a `tool` line that contradicts the
/// result the model was sent, a last round's `tool` line gone after
/// `call_limit`, an `outcome` edited to `answered`, a child that points at
/// no `task` call.
#[test]
fn check_reports_what_resume_refuses() {
    use serde_json::json;
    let dir = TempDir::new("view-trust");
    let recorded = call_limit_trace(&dir);
    let intact = write_lines(&dir, "intact.jsonl", &recorded);
    let (code, shown, refused) = check_and_resume(&dir, &intact);
    assert_eq!(code, Some(0), "{shown}");
    assert!(!refused, "the intact trace resumes");
    std::fs::write(
        &intact,
        recorded
            .iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    )
    .expect("restore");

    let is_tool = |line: &serde_json::Value, id: &str| line["kind"] == "tool" && line["id"] == id;
    // The results of round 1 removed from request 2, and toolu_01's tool line deleted.
    let mut cut: Vec<serde_json::Value> = recorded
        .iter()
        .filter(|line| !is_tool(line, "toolu_01"))
        .cloned()
        .collect();
    for line in &mut cut {
        if line["kind"] == "request" && line["call"] == 2 {
            let messages = line["messages"].as_array_mut().expect("messages");
            messages.retain(|m| m["content"][0]["type"] != "tool_result");
        }
    }
    // toolu_01's tool line says something the model was never sent.
    let evil: Vec<serde_json::Value> = recorded
        .iter()
        .map(|line| {
            let mut line = line.clone();
            if is_tool(&line, "toolu_01") {
                line["content"] = json!("EVIL");
            }
            line
        })
        .collect();
    // The last round's tool line gone.
    let no_last: Vec<serde_json::Value> = recorded
        .iter()
        .filter(|line| !is_tool(line, "toolu_02"))
        .cloned()
        .collect();
    // The outcome edited to `answered`.
    let answered: Vec<serde_json::Value> = recorded
        .iter()
        .map(|line| {
            let mut line = line.clone();
            if line["kind"] == "outcome" {
                line["status"] = json!("answered");
            }
            line
        })
        .collect();
    for (name, lines, location) in [
        ("cut.jsonl", cut, "parent call 2"),
        ("evil.jsonl", evil, "toolu_01"),
        ("no-last.jsonl", no_last, "toolu_02"),
        ("answered.jsonl", answered, "parent call 2"),
    ] {
        let trace = write_lines(&dir, name, &lines);
        let (code, shown, refused) = check_and_resume(&dir, &trace);
        assert_eq!(code, Some(1), "{name}: --check breaks: {shown}");
        assert!(
            shown.contains("the trace agrees with itself"),
            "{name}: {shown}"
        );
        assert!(shown.contains(location), "{name}: {location} in {shown}");
        assert!(refused, "{name}: resume refuses it and leaves it as it was");
    }

    // A child whose lines point at a tool call that does not exist.
    let deny = deny_demo_trace(&dir);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&deny)
        .expect("trace")
        .lines()
        .map(|line| {
            let mut line: serde_json::Value = serde_json::from_str(line).expect("JSON");
            if line["agent"] == "child-1" {
                line["parent_tool_use_id"] = json!("toolu_nowhere");
            }
            line
        })
        .collect();
    let orphan = write_lines(&dir, "orphan.jsonl", &lines);
    let out = subloop(&["view", orphan.to_str().expect("utf-8"), "--check"]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(
        shown.contains("toolu_nowhere, which is no task call"),
        "{shown}"
    );
}

/// Lines that are JSON of the wrong shape are refused with exit 2 by
/// `view`, `view -o` and `run --resume`, naming the line; nothing is written.
#[test]
fn lines_of_the_wrong_shape_are_refused() {
    use serde_json::json;
    let dir = TempDir::new("view-shape");
    let recorded = call_limit_trace(&dir);
    let tool_at = recorded
        .iter()
        .position(|line| line["kind"] == "tool")
        .expect("a tool line");
    let request_at = 1 + recorded
        .iter()
        .skip(1)
        .position(|line| line["kind"] == "request")
        .expect("a second request");
    let first_at = 0;
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let edits: Vec<(usize, Edit)> = vec![
        (tool_at, Box::new(|line| *line = json!(null))),
        (tool_at, Box::new(|line| *line = json!(12))),
        (tool_at, Box::new(|line| *line = json!([1, 2, 3]))),
        (first_at, Box::new(|line| *line = json!(null))),
        (first_at, Box::new(|line| *line = json!([1, 2, 3]))),
        (tool_at, Box::new(|line| line["kind"] = json!(["tool"]))),
        (
            tool_at,
            Box::new(|line| {
                line.as_object_mut().map(|o| o.remove("kind"));
            }),
        ),
        (tool_at, Box::new(|line| line["decision"] = json!(7))),
        (
            tool_at,
            Box::new(|line| line["decision"] = json!("totally_fine")),
        ),
        (tool_at, Box::new(|line| line["is_error"] = json!("yes"))),
        (tool_at, Box::new(|line| line["content"] = json!({}))),
        (first_at, Box::new(|line| line["system"] = json!({}))),
        (
            request_at,
            Box::new(|line| line["tools"] = json!("read_file")),
        ),
    ];
    let page = dir.path().join("page.html");
    for (number, (at, edit)) in edits.iter().enumerate() {
        let mut lines = recorded.clone();
        edit(&mut lines[*at]);
        let trace = write_lines(&dir, &format!("shape-{number}.jsonl"), &lines);
        let path = trace.to_str().expect("utf-8");
        let line = format!("line {}", at + 1);
        for args in [
            vec!["view", path],
            vec!["view", path, "-o", page.to_str().expect("utf-8")],
        ] {
            let out = subloop(&args);
            assert_eq!(out.status.code(), Some(2), "{number}: {args:?}");
            assert!(
                text(&out.stderr).contains(&line),
                "{number}: {}",
                text(&out.stderr)
            );
            assert!(!page.exists(), "{number}: no page written");
        }
        let (_, _, refused) = check_and_resume(&dir, &trace);
        assert!(refused, "{number}: resume refuses it");
    }
}

/// A follow-up question asked after an answer (`run --resume … --question`)
/// shows in the timeline between the answer and the call that answers it,
/// escaped like the rest of the trace's text; the page's data carries it on
/// that call, as it was asked.
#[test]
fn a_follow_up_question_shows_where_it_was_asked() {
    let dir = TempDir::new("view-follow-up");
    let ws = common::marker_workspace();
    let trace = dir.path().join("session.jsonl");
    let answer = |text: &str| {
        serde_json::json!({"parent": [{
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn"
        }]})
        .to_string()
    };
    let first = dir.write("first.json", answer("The first answer."));
    let second = dir.write("second.json", answer("The second answer."));
    let asked = "And then?\u{1b}[2J\nWhy?";
    for (script, more) in [
        (&first, &["--trace"][..]),
        (&second, &["--question", asked, "--resume"][..]),
    ] {
        let out = Command::new(common::bin())
            .args(["run", "--quiet", "--decision", "deny", "--workspace"])
            .arg(ws.path())
            .arg("--script")
            .arg(script)
            .args(more)
            .arg(&trace)
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let trace_arg = trace.to_str().expect("utf-8");
    let out = subloop(&["view", trace_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        !shown.contains('\u{1b}'),
        "an escape reached stdout:\n{shown}"
    );
    let question = shown
        .find("follow-up question: And then?\\u{1b}[2J\\nWhy?")
        .unwrap_or_else(|| panic!("no follow-up line:\n{shown}"));
    let call_1 = shown.find("parent call 1 ").expect("call 1");
    let call_2 = shown.find("parent call 2 ").expect("call 2");
    assert!(
        call_1 < question && question < call_2,
        "the question is not between the answer and the call that answers it:\n{shown}"
    );

    let page = dir.path().join("page.html");
    let out = subloop(&["view", trace_arg, "-o", page.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let html = std::fs::read_to_string(&page).expect("page");
    let start = html.find("id=\"subloop-run\">").expect("data") + 17;
    let end = start + html[start..].find("</script>").expect("end");
    let data: serde_json::Value = serde_json::from_str(&html[start..end]).expect("json");
    let calls = &data["lanes"][0]["calls"];
    assert_eq!(calls[0].get("asked"), None, "{calls}");
    assert_eq!(calls[1]["asked"], serde_json::json!([asked]), "{calls}");
}

/// An outcome whose text is not the one its last reply gives (the answer's
/// text, a failure's message) is reported broken by `--check` and refused
/// by `run --resume`, with and without a follow-up question; the traces as
/// written pass both.
#[test]
fn an_outcome_text_edited_away_from_the_last_reply_is_reported_and_refused() {
    use serde_json::json;
    let dir = TempDir::new("view-outcome-text");
    dir.write("ws/main.py", "print(6 * 7)\n");
    let ws = dir.path().join("ws");
    let ws_arg = ws.to_str().expect("utf-8");
    let edited = |lines: &[serde_json::Value]| -> Vec<serde_json::Value> {
        lines
            .iter()
            .map(|line| {
                let mut line = line.clone();
                if line["kind"] == "outcome" {
                    let text = line["text"].as_str().expect("text").to_owned();
                    line["text"] = json!(format!("{text} (edited)"));
                }
                line
            })
            .collect()
    };
    let read = |path: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .expect("trace")
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    };

    // model_error: a tool round, then the script runs out.
    let script = dir.write(
        "failing.json",
        json!({"parent": [
            {"content": [{"type": "tool_use", "id": "toolu_01", "name": "read_file",
                          "input": {"path": "main.py"}}],
             "stop_reason": "tool_use"}
        ]})
        .to_string(),
    );
    let failed = dir.path().join("failed.jsonl");
    let out = subloop(&[
        "run",
        "--workspace",
        ws_arg,
        "--script",
        script.to_str().expect("utf-8"),
        "--decision",
        "allow",
        "--trace",
        failed.to_str().expect("utf-8"),
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let recorded = read(&failed);
    assert_eq!(recorded.last().expect("outcome")["status"], "model_error");
    let intact = write_lines(&dir, "failed-intact.jsonl", &recorded);
    let (code, shown, refused) = check_and_resume(&dir, &intact);
    assert_eq!(code, Some(0), "{shown}");
    assert!(!refused, "the trace as written resumes");
    let forged = write_lines(&dir, "failed-edited.jsonl", &edited(&recorded));
    let (code, shown, refused) = check_and_resume(&dir, &forged);
    assert_eq!(code, Some(1), "{shown}");
    assert!(
        shown.contains("  broken the trace agrees with itself"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "at parent call 2: the outcome's text is not the one its last reply gives (model_error)"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("(edited)"),
        "the difference is shown: {shown}"
    );
    assert!(refused, "resume refuses it and leaves it as it was");

    // answered: the outcome's text must be the answer's.
    let script = dir.write(
        "answer.json",
        json!({"parent": [
            {"content": [{"type": "text", "text": "The answer is 42."}], "stop_reason": "end_turn"}
        ]})
        .to_string(),
    );
    let answered = dir.path().join("answered.jsonl");
    let out = subloop(&[
        "run",
        "--workspace",
        ws_arg,
        "--script",
        script.to_str().expect("utf-8"),
        "--trace",
        answered.to_str().expect("utf-8"),
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let recorded = read(&answered);
    let follow_up = |trace: &Path| -> Output {
        let rest = dir.write(
            "rest.json",
            r#"{"parent": [{"content": [{"type": "text", "text": "still 42"}], "stop_reason": "end_turn"}]}"#,
        );
        subloop(&[
            "run",
            "--workspace",
            ws_arg,
            "--script",
            rest.to_str().expect("utf-8"),
            "--resume",
            trace.to_str().expect("utf-8"),
            "--question",
            "Sure?",
            "--quiet",
        ])
    };
    let intact = write_lines(&dir, "answered-intact.jsonl", &recorded);
    let out = subloop(&["view", intact.to_str().expect("utf-8"), "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let out = follow_up(&intact);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let forged = write_lines(&dir, "answered-edited.jsonl", &edited(&recorded));
    let before = std::fs::read(&forged).expect("trace");
    let out = subloop(&["view", forged.to_str().expect("utf-8"), "--check"]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(
        shown.contains("at parent call 1: the outcome's text is not the one its last reply gives (answered): it reads \"The answer is 42. (edited)\" where the reply gives \"The answer is 42.\""),
        "{shown}"
    );
    let out = follow_up(&forged);
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("the trace contradicts itself at parent call 1: the outcome's text is not the one its last reply gives (answered)"),
        "{said}"
    );
    assert_eq!(std::fs::read(&forged).expect("trace"), before, "untouched");
}
