//! `subloop replay`: a recorded run re-run offline, every request checked
//! against the trace; divergences named by agent, call and block.

use crate::common;
#[cfg(feature = "live")]
use crate::mock_api;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::host::{self, AppError, DecisionMode, Settings};
use common::TempDir;
use subloop::record::replay::{Difference, Part};

fn subloop(args: &[&str]) -> Output {
    Command::new(common::bin())
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A temporary copy of the example workspace, with a directory for traces.
struct Scene {
    dir: TempDir,
}

impl Scene {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        for name in ["main.py", "expected.txt"] {
            let source = common::examples().join("workspace").join(name);
            dir.write(
                &format!("ws/{name}"),
                std::fs::read(source).expect("example file"),
            );
        }
        Self { dir }
    }

    fn workspace(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `subloop run --script examples/scripts/<script> --trace <trace>` on the copy.
    fn record(&self, script: &str, trace: &str, extra: &[&str]) -> String {
        let script = common::examples().join("scripts").join(script);
        let mut args: Vec<String> = vec![
            "run".into(),
            "--workspace".into(),
            self.workspace().display().to_string(),
            "--script".into(),
            script.display().to_string(),
            "--trace".into(),
            self.path(trace).display().to_string(),
            "--quiet".into(),
        ];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = subloop(&args);
        assert!(output.status.code().is_some(), "{}", text(&output.stderr));
        std::fs::read_to_string(self.path(trace)).expect("trace written")
    }

    /// `subloop replay <trace> --workspace <copy> --quiet <extra>`.
    fn replay(&self, trace: &str, extra: &[&str]) -> Output {
        let trace = self.path(trace).display().to_string();
        let workspace = self.workspace().display().to_string();
        let mut args = vec![
            "replay",
            trace.as_str(),
            "--workspace",
            workspace.as_str(),
            "--quiet",
        ];
        args.extend_from_slice(extra);
        subloop(&args)
    }

    fn settings(&self, decision: DecisionMode) -> Settings {
        let mut settings = Settings::new(self.workspace());
        settings.decision = decision;
        settings.progress = false;
        settings
    }
}

fn assert_reproduced(output: &Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        text(&output.stdout),
        text(&output.stderr)
    );
    let stdout = text(&output.stdout);
    assert!(stdout.starts_with("reproduced: "), "{stdout}");
    assert!(stdout.contains("status answered as recorded"), "{stdout}");
}

#[test]
fn every_trace_starts_with_its_format_version() {
    let scene = Scene::new("replay-version-line");
    let trace = scene.record("answer.json", "t.jsonl", &[]);
    let first: Value = serde_json::from_str(trace.lines().next().expect("a line")).expect("JSON");
    assert_eq!(
        first["version"],
        subloop::record::trace::TraceWriter::VERSION
    );
    for line in trace.lines().skip(1) {
        let value: Value = serde_json::from_str(line).expect("JSON");
        assert!(
            value.get("version").is_none(),
            "only the first line: {line}"
        );
    }
}

#[test]
fn a_scripted_run_with_tools_and_approval_replays_as_reproduced() {
    let scene = Scene::new("replay-scripted");
    scene.record("check_and_run.json", "t.jsonl", &["--decision", "allow"]);
    assert_reproduced(&scene.replay("t.jsonl", &["--decision", "allow"]));
}

#[test]
fn a_delegating_run_and_the_demo_replay_as_reproduced() {
    let scene = Scene::new("replay-demo");
    scene.record("delegate.json", "delegate.jsonl", &["--decision", "deny"]);
    let output = scene.replay("delegate.jsonl", &["--decision", "deny"]);
    assert_reproduced(&output);
    assert!(text(&output.stdout).contains("of 2 agent(s)"));

    let trace = scene.path("demo.jsonl").display().to_string();
    let workspace = scene.workspace().display().to_string();
    let demo = subloop(&[
        "demo",
        "--workspace",
        &workspace,
        "--decision",
        "allow",
        "--quiet",
        "--trace",
        &trace,
    ]);
    assert_eq!(demo.status.code(), Some(0), "{}", text(&demo.stderr));
    let output = scene.replay("demo.jsonl", &["--decision", "allow", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let json: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(json["replay"]["reproduced"], true);
    assert_eq!(json["replay"]["recorded_status"], "answered");
    assert_eq!(json["status"], "answered");
    assert_eq!(json["children"][0]["agent"], "child-1");
}

#[test]
fn a_changed_expected_txt_diverges_at_the_parent_call_and_block_that_carry_it() {
    let scene = Scene::new("replay-diverged");
    scene.record("check_and_run.json", "t.jsonl", &["--decision", "allow"]);
    std::fs::write(scene.workspace().join("expected.txt"), "43\n").expect("edit");
    let output = scene.replay("t.jsonl", &["--decision", "allow"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout).trim_end(),
        r#"diverged: parent call 3: tool_result toolu_02 content differs: recorded "42\n", now "43\n""#
    );

    // The same as a typed value, from the library.
    let report = host::replay(
        &scene.settings(DecisionMode::Allow),
        &scene.path("t.jsonl"),
        false,
    )
    .expect("replayable");
    assert!(!report.reproduced());
    assert_eq!(report.divergences.len(), 1);
    let first = &report.divergences[0];
    assert_eq!((first.agent.as_str(), first.call), ("parent", Some(3)));
    assert_eq!(
        first.difference,
        Difference::Request {
            part: Part::ToolResult {
                id: "toolu_02".into(),
                field: "content"
            },
            recorded: Some(r#""42\n""#.into()),
            now: Some(r#""43\n""#.into()),
        }
    );
    // The replay stopped there: run_main (call 3's reply) never ran.
    assert!(
        report.run.tools.iter().all(|tool| tool.name != "run_main"),
        "{:?}",
        report.run.tools
    );
}

#[test]
fn keep_going_runs_on_with_the_recorded_replies_and_lists_every_divergence() {
    let scene = Scene::new("replay-keep-going");
    scene.record("check_and_run.json", "t.jsonl", &["--decision", "allow"]);
    std::fs::write(scene.workspace().join("expected.txt"), "43\n").expect("edit");
    std::fs::write(scene.workspace().join("main.py"), "print(6 * 9)\n").expect("edit");
    let output = scene.replay("t.jsonl", &["--decision", "allow", "--keep-going"]);
    assert_eq!(output.status.code(), Some(1));
    let lines: Vec<String> = text(&output.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 3, "{lines:?}\n{}", text(&output.stderr));
    assert_eq!(
        lines[..2],
        [
            r#"diverged: parent call 2: tool_result toolu_01 content differs: recorded "print(6 * 7)\n", now "print(6 * 9)\n""#,
            r#"diverged: parent call 3: tool_result toolu_02 content differs: recorded "42\n", now "43\n""#,
        ]
    );
    // run_main ran on the changed files: its result is the third divergence.
    assert!(
        lines[2].starts_with(
            r#"diverged: parent call 4: tool_result toolu_03 content differs: recorded "{\"exit_code\":0,\"stdout\":\"42\\n\""#
        ) && lines[2].contains(r#"now "{\"exit_code\":0,\"stdout\":\"54\\n\""#),
        "{}",
        lines[2]
    );
}

/// A run cut by its budget after a tool round: that round's results are in
/// no request, only in the `tool` lines; they are compared too.
#[test]
fn a_last_round_no_request_carried_is_compared_through_the_tool_lines() {
    let scene = Scene::new("replay-last-round");
    scene.record(
        "check_and_run.json",
        "t.jsonl",
        &["--decision", "allow", "--max-calls", "2"],
    );
    let same = scene.replay("t.jsonl", &["--decision", "allow", "--max-calls", "2"]);
    assert_eq!(same.status.code(), Some(1), "call_limit was recorded");
    assert!(
        text(&same.stdout).starts_with("reproduced: "),
        "{}",
        text(&same.stdout)
    );
    assert!(text(&same.stdout).contains("status call_limit as recorded"));

    std::fs::write(scene.workspace().join("expected.txt"), "43\n").expect("edit");
    let output = scene.replay("t.jsonl", &["--decision", "allow", "--max-calls", "2"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        text(&output.stdout).trim_end(),
        r#"diverged: parent: tool toolu_02 content differs: recorded "42\n", now "43\n""#
    );
}

#[test]
fn a_child_divergence_names_the_child_and_its_call() {
    let scene = Scene::new("replay-child");
    scene.record("delegate.json", "t.jsonl", &["--decision", "deny"]);
    std::fs::write(scene.workspace().join("main.py"), "print(6 * 9)\n").expect("edit");
    let output = scene.replay("t.jsonl", &["--decision", "deny"]);
    assert_eq!(output.status.code(), Some(1));
    let stdout = text(&output.stdout);
    assert!(
        stdout.starts_with(
            r#"diverged: child-1 call 2: tool_result toolu_c1 content differs: recorded "print(6 * 7)\n", now "print(6 * 9)\n""#
        ),
        "{stdout}"
    );
}

/// Two `task` calls of one reply run as one concurrent batch; each child
/// still gets the replies recorded under its own delegation number.
#[test]
fn concurrent_children_replay_by_delegation_number() {
    let scene = Scene::new("replay-batch");
    let task = |id: &str, text: &str| serde_json::json!({"type": "tool_use", "id": id, "name": "task", "input": {"task": text}});
    let read = |id: &str, path: &str| {
        serde_json::json!({"content": [{"type": "tool_use", "id": id, "name": "read_file",
            "input": {"path": path}}], "stop_reason": "tool_use"})
    };
    let answer = |text: &str| serde_json::json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"});
    let script = serde_json::json!({
        "parent": [
            {"content": [task("toolu_t1", "Read main.py."), task("toolu_t2", "Read expected.txt.")],
             "stop_reason": "tool_use"},
            answer("Both read."),
        ],
        "children": [
            [read("toolu_a", "main.py"), answer("main.py read")],
            [read("toolu_b", "expected.txt"), answer("expected.txt read")],
        ],
    });
    let script_path = scene.dir.write("batch.json", script.to_string());
    let trace = scene.path("t.jsonl");
    let recorded = subloop(&[
        "run",
        "--workspace",
        &scene.workspace().display().to_string(),
        "--script",
        &script_path.display().to_string(),
        "--trace",
        &trace.display().to_string(),
        "--quiet",
    ]);
    assert_eq!(
        recorded.status.code(),
        Some(0),
        "{}",
        text(&recorded.stderr)
    );
    let output = scene.replay("t.jsonl", &[]);
    assert_reproduced(&output);
    assert!(text(&output.stdout).contains("all 6 recorded request(s) of 3 agent(s)"));

    std::fs::write(scene.workspace().join("expected.txt"), "43\n").expect("edit");
    let output = scene.replay("t.jsonl", &[]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        text(&output.stdout).trim_end(),
        r#"diverged: child-2 call 2: tool_result toolu_b content differs: recorded "42\n", now "43\n""#
    );
}

#[test]
fn another_policy_is_a_divergence_of_the_host() {
    let scene = Scene::new("replay-policy");
    scene.record("check_and_run.json", "t.jsonl", &["--decision", "allow"]);
    let output = scene.replay("t.jsonl", &["--decision", "deny"]);
    assert_eq!(output.status.code(), Some(1));
    let stdout = text(&output.stdout);
    assert!(
        stdout.starts_with(
            r#"diverged: parent call 4: tool_result toolu_03 content differs: recorded "{\"exit_code\":0,"#
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#"now "not executed: permission denied""#),
        "{stdout}"
    );
}

#[test]
fn a_smaller_budget_is_reported_as_fewer_calls_and_another_outcome() {
    let scene = Scene::new("replay-budget");
    scene.record("check_and_run.json", "t.jsonl", &["--decision", "allow"]);
    let report = host::replay(
        &Settings {
            max_calls: 2,
            ..scene.settings(DecisionMode::Allow)
        },
        &scene.path("t.jsonl"),
        false,
    )
    .expect("replayable");
    let shown: Vec<String> = report.divergences.iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert_eq!(shown[0], "parent: recorded 4 request(s), now 2");
    assert!(
        shown[1].starts_with(
            "parent: outcome differs: recorded answered \"I asked to run main.py; its result is above.\", now call_limit"
        ),
        "{shown:?}"
    );
    assert!(!report.success());
}

#[test]
fn a_recorded_status_other_than_answered_exits_1_even_when_reproduced() {
    let scene = Scene::new("replay-not-answered");
    scene.record("protocol_error.json", "t.jsonl", &[]);
    let output = scene.replay("t.jsonl", &[]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(stdout.starts_with("reproduced: "), "{stdout}");
    assert!(
        stdout.contains("status protocol_error as recorded"),
        "{stdout}"
    );
}

#[test]
fn an_unknown_version_is_refused_and_a_trace_without_one_is_read_as_version_1() {
    let scene = Scene::new("replay-versions");
    let trace = scene.record("delegate.json", "t.jsonl", &["--decision", "deny"]);
    let (first, rest) = trace.split_once('\n').expect("several lines");
    let mut first: Value = serde_json::from_str(first).expect("JSON");
    first["version"] = 99.into();
    std::fs::write(scene.path("v99.jsonl"), format!("{first}\n{rest}")).expect("write");
    let output = scene.replay("v99.jsonl", &["--decision", "deny"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "line 1: trace format version 99 is not supported: this subloop reads version 1"
        ),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());

    // A trace of the release before the field existed.
    if let Value::Object(fields) = &mut first {
        fields.remove("version");
    }
    std::fs::write(scene.path("v0.jsonl"), format!("{first}\n{rest}")).expect("write");
    assert_reproduced(&scene.replay("v0.jsonl", &["--decision", "deny"]));
    // `RebuiltRequest::from_trace` reads the same versions.
    assert!(
        subloop::record::trace::RebuiltRequest::from_trace(&format!("{first}\n{rest}")).is_ok()
    );
    let v99 = std::fs::read_to_string(scene.path("v99.jsonl")).expect("read");
    assert!(subloop::record::trace::RebuiltRequest::from_trace(&v99).is_err());
}

#[test]
fn a_truncated_trace_is_a_one_line_error_or_a_divergence_never_a_panic() {
    let scene = Scene::new("replay-truncated");
    let trace = scene.record("delegate.json", "t.jsonl", &["--decision", "deny"]);
    // Cut inside a line: exit 2, one line naming the line.
    let cut = &trace[..trace.len() - 20];
    std::fs::write(scene.path("cut.jsonl"), cut).expect("write");
    let output = scene.replay("cut.jsonl", &["--decision", "deny"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    let last = trace.lines().count();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("invalid trace") && stderr.contains(&format!("line {last}:")),
        "{stderr}"
    );

    // Cut at every line boundary: a proper prefix replays as diverged (the
    // recorded run ends early) or is refused; nothing panics.
    let lines: Vec<&str> = trace.lines().collect();
    for keep in 0..lines.len() {
        let prefix: String = lines[..keep]
            .iter()
            .map(|line| format!("{line}\n"))
            .collect();
        let path = scene.path("prefix.jsonl");
        std::fs::write(&path, &prefix).expect("write");
        match host::replay(&scene.settings(DecisionMode::Deny), &path, false) {
            Ok(report) => assert!(!report.reproduced(), "prefix of {keep} line(s)"),
            Err(AppError::Replay(err)) => {
                assert!(!err.to_string().contains('\n'), "{err}");
                assert_eq!(keep, 0, "only the empty trace is refused here: {err}");
            }
            Err(other) => panic!("prefix of {keep} line(s): {other}"),
        }
    }
}

#[test]
fn an_unreadable_or_foreign_trace_is_bad_input() {
    let scene = Scene::new("replay-bad-input");
    let output = scene.replay("missing.jsonl", &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("cannot read trace"));
    std::fs::write(scene.path("foreign.jsonl"), "{\"hello\": 1}\n").expect("write");
    let output = scene.replay("foreign.jsonl", &[]);
    assert_eq!(output.status.code(), Some(2));
    // A line that is not a trace line is refused with what it lacks.
    assert!(
        text(&output.stderr).contains("line 1: missing field `agent`"),
        "{}",
        text(&output.stderr)
    );
    let output = subloop(&["replay", "--workspace", "."]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("replay needs a TRACE file"));
}

/// A recorded response line may carry more fields than the crate reads (the
/// raw reply as received); the replay takes them as they are.
#[test]
fn extra_fields_on_recorded_lines_are_accepted() {
    let scene = Scene::new("replay-extra-fields");
    let trace = scene.record("delegate.json", "t.jsonl", &["--decision", "deny"]);
    let widened: String = trace
        .lines()
        .map(|line| {
            let mut value: Value = serde_json::from_str(line).expect("JSON");
            if value["kind"] == "response" {
                value["response"]["id"] = "msg_0123".into();
                value["response"]["model"] = "claude-test".into();
                value["response"]["stop_sequence"] = Value::Null;
                value["elapsed_ms"] = 12.into();
            }
            format!("{value}\n")
        })
        .collect();
    std::fs::write(scene.path("wide.jsonl"), widened).expect("write");
    assert_reproduced(&scene.replay("wide.jsonl", &["--decision", "deny"]));
}

#[cfg(feature = "live")]
#[test]
fn a_loopback_live_runs_trace_replays_as_is() {
    use mock_api::{MockServer, demo_handler};

    let server = MockServer::start(demo_handler());
    let scene = Scene::new("replay-live");
    let trace = scene.path("live.jsonl");
    let workspace = scene.workspace();
    let live = Command::new(common::bin())
        .args([
            "demo",
            "--live",
            "--decision",
            "deny",
            "--quiet",
            "--workspace",
        ])
        .arg(&workspace)
        .arg("--trace")
        .arg(&trace)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("ANTHROPIC_API_KEY", "sk-test-replay-0123456789")
        .env("ANTHROPIC_BASE_URL", &server.url)
        .env_remove("ANTHROPIC_MODEL")
        .stdin(Stdio::null())
        .output()
        .expect("run binary");
    assert_eq!(live.status.code(), Some(0), "{}", text(&live.stderr));
    let requests_before = server.recorded().len();
    assert_eq!(requests_before, 7);
    // No key, no server needed: the trace answers.
    let output = Command::new(common::bin())
        .arg("replay")
        .arg(&trace)
        .args(["--decision", "deny", "--quiet", "--workspace"])
        .arg(&workspace)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run binary");
    assert_reproduced(&output);
    assert!(text(&output.stdout).contains("all 7 recorded request(s) of 2 agent(s)"));
    assert_eq!(
        server.recorded().len(),
        requests_before,
        "the replay sent nothing"
    );
}

/// A replay more permissive than the recorded run compares each decision
/// before the call can run: a call the record shows denied diverges, and
/// the program does not run.
#[test]
fn a_call_the_record_shows_denied_diverges_before_it_runs() {
    let dir = common::TempDir::new("replay-permissive");
    dir.write(
        "ws/main.py",
        "open('ran.txt', 'a').write('ran\\n')\nprint(6 * 7)\n",
    );
    let script = dir.write(
        "script.json",
        r#"{"parent": [
            {"content": [{"type": "tool_use", "id": "toolu_01", "name": "run_main", "input": {}}],
             "stop_reason": "tool_use"},
            {"content": [{"type": "text", "text": "It was denied."}], "stop_reason": "end_turn"}
        ]}"#,
    );
    let ws = dir.path().join("ws");
    let trace = dir.path().join("t.jsonl");
    let s = |path: &std::path::Path| path.to_str().expect("utf-8").to_owned();
    let out = subloop(&[
        "run",
        "--workspace",
        &s(&ws),
        "--script",
        &s(&script),
        "--decision",
        "deny",
        "--trace",
        &s(&trace),
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for extra in [&[][..], &["--keep-going"][..]] {
        let mut args = vec![
            "replay".to_owned(),
            s(&trace),
            "--workspace".to_owned(),
            s(&ws),
            "--decision".to_owned(),
            "allow".to_owned(),
            "--quiet".to_owned(),
        ];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = subloop(&args);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {stdout}");
        assert!(
            stdout.starts_with("diverged: parent call 1: tool toolu_01 decision"),
            "{extra:?}: {stdout}"
        );
        assert!(stdout.contains("denied"), "{stdout}");
        assert!(
            !ws.join("ran.txt").exists(),
            "{extra:?}: the program the recorded run did not run did not run now"
        );
    }
}

/// The library's replay, with nothing of the CLI: a run traced through
/// `TraceWriter` (a `read_file` call and an answer) is reproduced by
/// `Replay` with an agent built the same way; an agent whose tool answers
/// differently diverges at the request that carries the result.
#[test]
fn the_library_replays_a_trace_it_wrote() {
    use std::sync::Arc;
    use subloop::policy::permission::AllowAll;
    use subloop::providers::scripted::ScriptedModel;
    use subloop::record::replay::Replay;
    use subloop::record::trace::TraceWriter;
    use subloop::tools::ReadFile;
    use subloop::{AgentBuilder, Budget, ModelResponse};

    let scene = Scene::new("replay-library");
    let trace = scene.dir.path().join("library.jsonl");
    let workspace = scene.workspace();
    let agent = |approver: Arc<dyn subloop::Approver>, workspace: &std::path::Path| {
        AgentBuilder::new(approver)
            .read_only_tool(
                ReadFile::new(workspace, subloop::tools::ReadFile::DEFAULT_LIMIT)
                    .expect("read_file"),
            )
            .expect("tool")
    };
    let replies = vec![
        serde_json::json!({"content": [{"type": "tool_use", "id": "t1", "name": "read_file",
            "input": {"path": "expected.txt"}}], "stop_reason": "tool_use"}),
        serde_json::json!({"content": [{"type": "text", "text": "It prints 42."}],
            "stop_reason": "end_turn"}),
    ];
    let mut model = ScriptedModel::new(
        replies
            .into_iter()
            .map(|reply| Ok(ModelResponse::from_value(reply).expect("reply")))
            .collect(),
    );
    let report = agent(Arc::new(AllowAll), &workspace)
        .monitor(TraceWriter::create(&trace).expect("trace"))
        .build()
        .run(
            "What does main.py print?",
            Budget::new(4).unwrap(),
            &mut model,
        )
        .expect("run");
    assert_eq!(report.outcome.text, "It prints 42.");

    // The same agent: reproduced.
    let replay = Replay::load(&trace).expect("load");
    assert_eq!(
        replay.question().as_deref(),
        Some("What does main.py print?")
    );
    let again = replay
        .run(
            Arc::new(AllowAll),
            Budget::new(4).unwrap(),
            |approver, _children| {
                Ok::<_, Box<dyn std::error::Error>>(agent(approver, &workspace).build())
            },
        )
        .expect("replay");
    assert!(again.reproduced(), "{:?}", again.lines(true));
    assert_eq!(again.run.outcome.text, "It prints 42.");

    // The file read now says something else: the second request differs.
    std::fs::write(workspace.join("expected.txt"), "43\n").unwrap();
    let changed = Replay::load(&trace)
        .expect("load")
        .keep_going(true)
        .run(
            Arc::new(AllowAll),
            Budget::new(4).unwrap(),
            |approver, _children| {
                Ok::<_, Box<dyn std::error::Error>>(agent(approver, &workspace).build())
            },
        )
        .expect("replay");
    assert!(!changed.reproduced());
    let first = changed.divergences.first().expect("a divergence");
    assert_eq!(first.agent, "parent");
    assert_eq!(first.call, Some(2), "{:?}", changed.lines(true));
}
