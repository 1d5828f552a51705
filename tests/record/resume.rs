//! `subloop run --resume TRACE`: a run cut short (by its budget, or by
//! SIGKILL in the middle of a tool round) goes on from its trace; a broken
//! trace is refused before anything runs.

use crate::common;
#[cfg(feature = "live")]
use crate::mock_api;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::TempDir;
use subloop::record::recorded::RecordedRun;
use subloop::record::trace::RebuiltRequest;

fn subloop(args: &[&str]) -> Output {
    Command::new(common::bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"content": [{"type": "tool_use", "id": id, "name": name, "input": input}],
           "stop_reason": "tool_use", "usage": {"input_tokens": 100, "output_tokens": 10}})
}

fn answer(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 100, "output_tokens": 10}})
}

/// A workspace (main.py appends a line to `runs.txt`, sleeps `sleep`
/// seconds, prints 42) and a place for scripts and the trace.
struct Scene {
    dir: TempDir,
}

impl Scene {
    fn new(tag: &str, sleep: u32) -> Self {
        let dir = TempDir::new(tag);
        dir.write(
            "ws/main.py",
            format!(
                "import time\nopen('runs.txt', 'a').write('ran\\n')\ntime.sleep({sleep})\nprint(6 * 7)\n"
            ),
        );
        dir.write("ws/expected.txt", "42\n");
        Self { dir }
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn trace(&self) -> PathBuf {
        self.dir.path().join("run.jsonl")
    }

    fn script(&self, name: &str, parent: Vec<Value>) -> PathBuf {
        self.dir.write(
            name,
            serde_json::to_vec(&json!({ "parent": parent })).expect("script"),
        )
    }

    /// A script of two reads (`toolu_01`, `toolu_02`): a run with a
    /// budget of 2 ends `call_limit` after them.
    fn two_reads(&self) -> PathBuf {
        self.script(
            "first.json",
            vec![
                tool_use("toolu_01", "read_file", json!({"path": "main.py"})),
                tool_use("toolu_02", "read_file", json!({"path": "expected.txt"})),
            ],
        )
    }

    /// The rest of that run: `run_main` (`toolu_03`), then `text`.
    fn run_then_answer(&self, text: &str) -> PathBuf {
        self.script(
            "rest.json",
            vec![tool_use("toolu_03", "run_main", json!({})), answer(text)],
        )
    }

    fn runs(&self) -> usize {
        std::fs::read_to_string(self.ws().join("runs.txt"))
            .map(|text| text.lines().count())
            .unwrap_or(0)
    }
}

/// Starts `subloop ARGS` and returns once main.py has started (its first
/// line is in `runs.txt`), so the caller can signal subloop mid-round.
fn start_until_main_runs(scene: &Scene, args: &[&str]) -> std::process::Child {
    let child = Command::new(common::bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let until = Instant::now() + Duration::from_secs(60);
    while scene.runs() == 0 {
        assert!(Instant::now() < until, "main.py never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `subloop run --workspace WS --script SCRIPT EXTRA…`.
fn run_script(ws: &Path, script: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["run", "--workspace", s(ws), "--script", s(script)];
    args.extend_from_slice(extra);
    subloop(&args)
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Every tool_use of the final parent history is answered exactly once, in
/// the message right after it; returns the results by id.
fn answered_once(trace: &Path) -> Vec<(String, String, bool)> {
    let trace = std::fs::read_to_string(trace).expect("trace");
    let last = RebuiltRequest::from_trace(&trace)
        .expect("rebuild")
        .into_iter()
        .rev()
        .find(|request| request.agent == "parent")
        .expect("a parent request");
    let messages = &last.messages;
    for (index, message) in messages.iter().enumerate() {
        let uses: Vec<_> = message
            .content
            .iter()
            .filter_map(|block| match block {
                subloop::core::protocol::Block::ToolUse { id, .. } => Some(id.to_string()),
                _ => None,
            })
            .collect();
        if uses.is_empty() {
            continue;
        }
        let next = messages.get(index + 1).expect("results follow the calls");
        let answered: Vec<String> = common::tool_results(std::slice::from_ref(next))
            .into_iter()
            .map(|(id, ..)| id)
            .collect();
        assert_eq!(answered, uses, "each call answered once, in order");
    }
    let all: Vec<String> = common::tool_results(messages)
        .into_iter()
        .map(|(id, ..)| id)
        .collect();
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "no id answered twice: {all:?}");
    common::tool_results(messages)
}

#[test]
fn a_run_stopped_by_its_budget_goes_on_and_replays_as_reproduced() {
    let scene = Scene::new("resume-budget", 0);
    let first = scene.two_reads();
    let rest = scene.run_then_answer("main.py prints 42, as expected.txt says.");
    let trace = scene.trace();
    let ws = scene.ws();
    let out = run_script(
        &ws,
        &first,
        &[
            "--decision",
            "allow",
            "--max-calls",
            "2",
            "--trace",
            s(&trace),
            "--quiet",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "call_limit: {}",
        text(&out.stderr)
    );
    // The same budget is spent already: the error says what to give.
    let out = run_script(
        &ws,
        &rest,
        &[
            "--decision",
            "allow",
            "--max-calls",
            "2",
            "--resume",
            s(&trace),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr)
            .contains("give a call budget above 2 to continue it (--max-calls above 2)"),
        "{}",
        text(&out.stderr)
    );
    let out = run_script(
        &ws,
        &rest,
        &[
            "--decision",
            "allow",
            "--max-calls",
            "8",
            "--resume",
            s(&trace),
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["status"], "answered");
    assert_eq!(report["calls"], 4, "2 calls before + 2 after");
    assert!(
        text(&out.stderr).contains(
            "[resumed] after parent call 2 (the earlier run ended call_limit; 220 tokens"
        ),
        "{}",
        text(&out.stderr)
    );
    let results = answered_once(&trace);
    assert_eq!(results.len(), 3);
    assert_eq!(scene.runs(), 1);
    // The whole trace, both parts, replays as one run.
    let out = subloop(&[
        "replay",
        s(&trace),
        "--workspace",
        s(&ws),
        "--decision",
        "allow",
        "--max-calls",
        "8",
        "--quiet",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).starts_with("reproduced"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn the_token_budget_counts_both_parts() {
    let scene = Scene::new("resume-tokens", 0);
    let first = scene.script(
        "first.json",
        vec![tool_use(
            "toolu_01",
            "read_file",
            json!({"path": "main.py"}),
        )],
    );
    let rest = scene.script("rest.json", vec![answer("done")]);
    let (ws, trace) = (scene.ws(), scene.trace());
    let out = run_script(
        &ws,
        &first,
        &["--max-calls", "1", "--trace", s(&trace), "--quiet"],
    );
    assert_eq!(out.status.code(), Some(1));
    // 110 tokens were spent before: a budget of 100 is over at once.
    let out = run_script(
        &ws,
        &rest,
        &[
            "--max-calls",
            "4",
            "--max-tokens-total",
            "100",
            "--resume",
            s(&trace),
            "--json",
            "--quiet",
        ],
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["status"], "token_limit", "{report}");
    assert_eq!(report["calls"], 1, "no new model call");
}

#[test]
fn a_run_killed_in_a_tool_round_goes_on_without_running_that_call_again() {
    let scene = Scene::new("resume-kill", 60);
    let first = scene.script(
        "first.json",
        vec![
            tool_use("toolu_01", "run_main", json!({})),
            answer("unreachable"),
        ],
    );
    let (ws, trace) = (scene.ws(), scene.trace());
    let mut child = start_until_main_runs(
        &scene,
        &[
            "run",
            "--workspace",
            s(&ws),
            "--script",
            s(&first),
            "--decision",
            "allow",
            "--run-timeout",
            "120",
            "--trace",
            s(&trace),
            "--quiet",
        ],
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let before = std::fs::read_to_string(&trace).expect("trace");
    assert!(
        !before.contains("\"kind\":\"outcome\""),
        "killed, no outcome: {before}"
    );
    // The model asks again; the gate asks again (here: deny), nothing runs.
    let rest = scene.script(
        "rest.json",
        vec![
            tool_use("toolu_02", "run_main", json!({})),
            answer("main.py was not run again."),
        ],
    );
    let out = run_script(
        &ws,
        &rest,
        &[
            "--decision",
            "deny",
            "--max-calls",
            "4",
            "--resume",
            s(&trace),
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("ended interrupted; 110 tokens, 0 delegations spent); 1 call it left unfinished is answered \"not executed\""),
        "{}",
        text(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["status"], "answered");
    assert_eq!(report["calls"], 3, "1 call before + 2 after");
    let results = answered_once(&trace);
    assert_eq!(results.len(), 2);
    assert_eq!(
        results[0],
        (
            "toolu_01".to_owned(),
            subloop::record::resume::ResumeFile::INTERRUPTED.to_owned(),
            true
        )
    );
    assert!(
        results[1].1.starts_with("not executed"),
        "denied: {:?}",
        results[1]
    );
    assert_eq!(scene.runs(), 1, "the interrupted call was not run again");
    let resumed = std::fs::read_to_string(&trace).expect("trace");
    assert!(
        resumed.starts_with(&before),
        "the earlier lines are kept as they were"
    );
    assert!(resumed.contains("\"interrupted\":[\"toolu_01\"]"));
    let run = RecordedRun::parse(&resumed).expect("the resumed trace reads back");
    assert_eq!(run.calls("parent"), 3);
}

#[test]
fn a_broken_or_finished_trace_is_refused_and_nothing_runs() {
    let scene = Scene::new("resume-refused", 0);
    let first = scene.script(
        "first.json",
        vec![
            tool_use("toolu_01", "read_file", json!({"path": "main.py"})),
            tool_use("toolu_02", "run_main", json!({})),
        ],
    );
    let rest = scene.script(
        "rest.json",
        vec![tool_use("toolu_09", "run_main", json!({})), answer("x")],
    );
    let (ws, trace) = (scene.ws(), scene.trace());
    let out = run_script(
        &ws,
        &first,
        &[
            "--max-calls",
            "2",
            "--trace",
            s(&trace),
            "--quiet",
            "--decision",
            "deny",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let good = std::fs::read_to_string(&trace).expect("trace");
    let resume = |trace: &Path| {
        run_script(
            &ws,
            &rest,
            &[
                "--decision",
                "allow",
                "--max-calls",
                "4",
                "--resume",
                s(trace),
            ],
        )
    };
    let cases = [
        // A result for an id the reply did not ask for.
        (
            good.replace(
                "\"tool_use_id\":\"toolu_01\"",
                "\"tool_use_id\":\"toolu_07\"",
            ),
            Some("parent call 1"),
        ),
        // Another format version.
        (
            good.replacen("\"version\":1", "\"version\":99", 1),
            Some("version 99"),
        ),
        // A reply that breaks the protocol: end_turn with a call.
        (
            good.replacen(
                "\"stop_reason\":\"tool_use\"",
                "\"stop_reason\":\"end_turn\"",
                1,
            ),
            Some("parent call 1"),
        ),
        // No request at all.
        (String::new(), Some("no request of the parent")),
    ];
    for (index, (broken, says)) in cases.iter().enumerate() {
        let path = scene.dir.write(&format!("broken-{index}.jsonl"), broken);
        let out = resume(&path);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {index}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains("cannot resume") || stderr.contains("invalid trace"),
            "{stderr}"
        );
        if let Some(says) = says {
            assert!(stderr.contains(says), "case {index}: {stderr}");
        }
        assert_eq!(
            &std::fs::read_to_string(&path).expect("kept"),
            broken,
            "untouched"
        );
    }
    assert_eq!(scene.runs(), 0, "nothing ran");
    // An answered run has nothing to continue.
    let done = scene.script("done.json", vec![answer("42")]);
    let answered = scene.dir.path().join("answered.jsonl");
    let out = run_script(&ws, &done, &["--trace", s(&answered), "--quiet"]);
    assert_eq!(out.status.code(), Some(0));
    let out = resume(&answered);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("nothing to continue"),
        "{}",
        text(&out.stderr)
    );
    // --trace beside --resume is a usage error.
    let out = subloop(&[
        "run",
        "--workspace",
        s(&ws),
        "--resume",
        s(&trace),
        "--trace",
        s(&answered),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--trace cannot be used with --resume"));
}

#[test]
fn an_answered_conversation_takes_a_follow_up_with_a_budget_of_its_own() {
    use subloop::Budget;
    use subloop::Conversation;
    use subloop::ModelResponse;
    use subloop::core::conversation::AfterTools;
    use subloop::core::conversation::Reply;
    use subloop::core::conversation::ToolOutput;
    // The compile_fail doctest on `follow_up`, with the answered state: it compiles and runs.
    let budget = Budget::new(1).expect("budget");
    let conversation = Conversation::start("hi", budget).expect("start");
    let Reply::Answered(done) = conversation.receive(ModelResponse::answer("hello")) else {
        panic!("answered");
    };
    let (done, err) = done.follow_up("  ", budget).expect_err("a blank question");
    assert_eq!(err, subloop::core::error::InputError::EmptyQuestion);
    let next = done.follow_up("and now?", budget).expect("follow-up");
    assert_eq!(next.calls_made(), 1, "the earlier call still counts");
    assert_eq!(next.history().len(), 3);
    // The new question has its own budget of 1: one tool round, then call_limit.
    let reply = ModelResponse::tool_calls([("t1", "read_file", json!({"path": "a"}))]);
    let Reply::Tools(waiting) = next.receive(reply) else {
        panic!("tools");
    };
    let AfterTools::CallLimit(limited) = waiting.answer_with(|_| ToolOutput::ok("x")) else {
        panic!("the follow-up's budget of 1 is spent");
    };
    assert_eq!(limited.calls_made(), 2);
    assert!(
        limited.text().contains("1 model request(s) used"),
        "{}",
        limited.text()
    );
}

#[test]
fn a_follow_up_question_continues_an_answered_run_with_its_whole_history() {
    let scene = Scene::new("resume-follow-up", 0);
    let first = scene.script(
        "q1.json",
        vec![
            tool_use("toolu_01", "read_file", json!({"path": "main.py"})),
            answer("It prints 42."),
        ],
    );
    let second = scene.script("q2.json", vec![answer("expected.txt says 42 too.")]);
    let (ws, trace) = (scene.ws(), scene.trace());
    let out = run_script(
        &ws,
        &first,
        &["--max-calls", "2", "--trace", s(&trace), "--quiet"],
    );
    assert_eq!(out.status.code(), Some(0));
    let out = run_script(
        &ws,
        &second,
        &[
            "--max-calls",
            "1",
            "--resume",
            s(&trace),
            "--question",
            "And expected.txt?",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["status"], "answered");
    assert_eq!(report["text"], "expected.txt says 42 too.");
    assert_eq!(
        report["calls"], 3,
        "its own budget of 1; 3 calls in the run"
    );
    let all = std::fs::read_to_string(&trace).expect("trace");
    let requests = RebuiltRequest::from_trace(&all).expect("rebuild");
    let last = requests.last().expect("a request");
    assert_eq!(last.call, 3);
    let texts: Vec<String> = last
        .messages
        .iter()
        .map(subloop::core::protocol::Message::text)
        .collect();
    assert_eq!(
        texts.first().map(String::as_str),
        Some("Check main.py against expected.txt.")
    );
    assert_eq!(texts.last().map(String::as_str), Some("And expected.txt?"));
    assert!(
        texts.contains(&"It prints 42.".to_owned()),
        "the earlier answer is in the history"
    );
    answered_once(&trace);
    // A follow-up needs an answered run.
    let limited = scene.dir.path().join("limited.jsonl");
    let out = run_script(
        &ws,
        &first,
        &["--max-calls", "1", "--trace", s(&limited), "--quiet"],
    );
    assert_eq!(out.status.code(), Some(1));
    let out = run_script(
        &ws,
        &second,
        &[
            "--max-calls",
            "2",
            "--resume",
            s(&limited),
            "--question",
            "And?",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("needs an answered run; this one ended call_limit"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_trace_still_being_written_is_not_resumed_nor_reused() {
    let scene = Scene::new("resume-busy", 60);
    let first = scene.script(
        "first.json",
        vec![tool_use("toolu_01", "run_main", json!({}))],
    );
    let rest = scene.script("rest.json", vec![answer("done")]);
    let (ws, trace) = (scene.ws(), scene.trace());
    let mut running = start_until_main_runs(
        &scene,
        &[
            "run",
            "--workspace",
            s(&ws),
            "--script",
            s(&first),
            "--decision",
            "allow",
            "--run-timeout",
            "120",
            "--trace",
            s(&trace),
            "--quiet",
        ],
    );
    let before = std::fs::read_to_string(&trace).expect("trace");
    let resumed = run_script(&ws, &rest, &["--max-calls", "4", "--resume", s(&trace)]);
    let second = run_script(&ws, &rest, &["--trace", s(&trace), "--quiet"]);
    running.kill().expect("SIGKILL");
    running.wait().expect("reap");
    for out in [&resumed, &second] {
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("is being written by another run"),
            "{}",
            text(&out.stderr)
        );
    }
    assert_eq!(
        std::fs::read_to_string(&trace).expect("trace"),
        before,
        "untouched"
    );
    // Once the writer is gone (its lock with it), the run resumes.
    let out = run_script(
        &ws,
        &rest,
        &["--max-calls", "4", "--resume", s(&trace), "--quiet"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn a_call_killed_in_a_follow_up_is_interrupted_even_if_an_earlier_call_had_its_id() {
    let scene = Scene::new("resume-reused-id", 60);
    let first = scene.script(
        "q1.json",
        vec![
            tool_use("toolu_01", "read_file", json!({"path": "expected.txt"})),
            answer("It says 42."),
        ],
    );
    let (ws, trace) = (scene.ws(), scene.trace());
    let out = run_script(&ws, &first, &["--trace", s(&trace), "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The follow-up's call reuses the id; the run is killed while it runs.
    let second = scene.script("q2.json", vec![tool_use("toolu_01", "run_main", json!({}))]);
    let mut running = start_until_main_runs(
        &scene,
        &[
            "run",
            "--workspace",
            s(&ws),
            "--script",
            s(&second),
            "--decision",
            "allow",
            "--run-timeout",
            "120",
            "--resume",
            s(&trace),
            "--question",
            "Run it.",
            "--quiet",
        ],
    );
    running.kill().expect("SIGKILL");
    running.wait().expect("reap");
    let rest = scene.script("rest.json", vec![answer("It was interrupted.")]);
    let out = run_script(&ws, &rest, &["--resume", s(&trace), "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let all = std::fs::read_to_string(&trace).expect("trace");
    let last = RebuiltRequest::from_trace(&all)
        .expect("rebuild")
        .pop()
        .expect("a request");
    let results = common::tool_results(&last.messages);
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(
        results[0],
        ("toolu_01".to_owned(), "42\n".to_owned(), false)
    );
    assert_eq!(
        results[1],
        (
            "toolu_01".to_owned(),
            subloop::record::resume::ResumeFile::INTERRUPTED.to_owned(),
            true
        )
    );
    assert_eq!(scene.runs(), 1);
}

#[cfg(feature = "live")]
#[test]
fn a_scripted_run_cut_short_goes_on_live_with_its_rebuilt_history() {
    use mock_api::{MockServer, Reply};

    let server = MockServer::start(|_| {
        Reply::json(
            200,
            json!({"id": "msg_resume_1", "type": "message", "role": "assistant",
                   "model": "claude-test", "content": [{"type": "text", "text": "main.py prints 42."}],
                   "stop_reason": "end_turn", "stop_sequence": null,
                   "usage": {"input_tokens": 50, "output_tokens": 5}}),
        )
    });
    let scene = Scene::new("resume-live", 0);
    let first = scene.script(
        "first.json",
        vec![tool_use(
            "toolu_01",
            "read_file",
            json!({"path": "main.py"}),
        )],
    );
    let (ws, trace) = (scene.ws(), scene.trace());
    let out = run_script(
        &ws,
        &first,
        &["--max-calls", "1", "--trace", s(&trace), "--quiet"],
    );
    assert_eq!(out.status.code(), Some(1), "call_limit");
    let out = Command::new(common::bin())
        .args([
            "run",
            "--workspace",
            s(&ws),
            "--live",
            "--max-calls",
            "4",
            "--resume",
            s(&trace),
            "--quiet",
        ])
        .env("ANTHROPIC_API_KEY", "sk-test-resume-0123456789")
        .env("ANTHROPIC_BASE_URL", &server.url)
        .env_remove("ANTHROPIC_MODEL")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "main.py prints 42.\n");
    // The one live request carried the rebuilt history: question, call, result.
    let sent = server.recorded();
    assert_eq!(sent.len(), 1);
    let body = sent[0].json();
    let messages = body["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 3, "{body}");
    assert_eq!(messages[1]["content"][0]["id"], "toolu_01");
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "toolu_01");
    // The trace of both parts replays offline.
    let out = subloop(&[
        "replay",
        s(&trace),
        "--workspace",
        s(&ws),
        "--max-calls",
        "4",
        "--quiet",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).starts_with("reproduced: all 2 recorded request(s)"),
        "{}",
        text(&out.stdout)
    );
}

/// Two resumes of one trace: the trace's lock is taken before it is read,
/// so while one resume is getting ready (here: an MCP server that takes a
/// second to start), a second one is refused (exit 2) before it runs
/// anything or touches the file. A resume that read before it locked would
/// let the second run to its end meanwhile, then cut the file back to what
/// it had read and run the same call again.
#[cfg(feature = "mcp")]
#[test]
fn two_resumes_of_one_trace_cannot_both_run() {
    let scene = Scene::new("resume-race", 0);
    let first = scene.two_reads();
    let rest = scene.run_then_answer("It prints 42.");
    let ws = scene.ws();
    let trace = scene.trace();
    let out = run_script(
        &ws,
        &first,
        &["--max-calls", "2", "--trace", s(&trace), "--quiet"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let recorded = std::fs::read(&trace).expect("trace");
    let started = scene.dir.path().join("server-started");
    let config = scene.dir.write(
        "mcp.json",
        json!({"mcpServers": {"slow": {
            "command": "sh",
            "args": ["-c", format!(
                "touch '{}'; sleep 1; exec python3 '{}/tests/mcp_server.py'",
                started.display(),
                env!("CARGO_MANIFEST_DIR")
            )]
        }}})
        .to_string(),
    );
    let resume = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--workspace",
            s(&ws),
            "--script",
            s(&rest),
            "--decision",
            "allow",
            "--max-calls",
            "4",
            "--resume",
            s(&trace),
            "--quiet",
        ];
        args.extend_from_slice(extra);
        Command::new(common::bin())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    for round in 0..3 {
        std::fs::write(&trace, &recorded).expect("restore the trace");
        let _ = std::fs::remove_file(ws.join("runs.txt"));
        let _ = std::fs::remove_file(&started);
        let slow = resume(&["--mcp-config", s(&config), "--mcp-timeout", "20"]);
        let until = Instant::now() + Duration::from_secs(60);
        while !started.exists() {
            assert!(Instant::now() < until, "the MCP server never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let quick = resume(&[]).wait_with_output().expect("the second resume");
        let slow = slow.wait_with_output().expect("the first resume");
        assert_eq!(
            (slow.status.code(), quick.status.code()),
            (Some(0), Some(2)),
            "round {round}: the first resume runs, the second is refused: {} / {}",
            text(&slow.stderr),
            text(&quick.stderr)
        );
        assert!(
            text(&quick.stderr).contains("is being written by another run"),
            "round {round}: {}",
            text(&quick.stderr)
        );
        assert_eq!(scene.runs(), 1, "round {round}: run_main ran once");
        let now = std::fs::read(&trace).expect("trace");
        assert!(
            now.starts_with(&recorded),
            "round {round}: the recorded part is kept"
        );
        let run = RecordedRun::parse(&text(&now)).expect("the trace reads back");
        assert_eq!(run.calls("parent"), 4, "round {round}");
        answered_once(&trace);
    }
}

/// The demo model answers a resumed run from what its history holds: cut
/// after run_main's round by its budget, the resumed run compares the
/// program's output with the expected.txt it read before the cut.
#[test]
fn the_demo_model_answers_a_resumed_run_from_its_history() {
    let scene = Scene::new("resume-demo", 0);
    let ws = scene.ws();
    let trace = scene.trace();
    let out = subloop(&[
        "demo",
        "--workspace",
        s(&ws),
        "--decision",
        "allow",
        "--max-calls",
        "3",
        "--trace",
        s(&trace),
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let out = subloop(&[
        "run",
        "--workspace",
        s(&ws),
        "--resume",
        s(&trace),
        "--decision",
        "allow",
        "--max-calls",
        "8",
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let answer = text(&out.stdout);
    assert!(
        answer.starts_with("The program printed 42, which matches expected.txt (42)."),
        "{answer}"
    );
}

/// A trace records its workspace; resuming it in another one is refused
/// (exit 2, nothing run, the trace untouched) unless `--other-workspace`
/// says it is meant.
#[test]
fn resuming_in_another_workspace_is_refused_unless_meant() {
    let scene = Scene::new("resume-elsewhere", 0);
    let first = scene.script(
        "first.json",
        vec![tool_use(
            "toolu_01",
            "read_file",
            json!({"path": "main.py"}),
        )],
    );
    let rest = scene.script("rest.json", vec![answer("It prints 42.")]);
    let ws = scene.ws();
    let trace = scene.trace();
    let out = run_script(
        &ws,
        &first,
        &["--max-calls", "1", "--trace", s(&trace), "--quiet"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let recorded = std::fs::read(&trace).expect("trace");
    let elsewhere = scene.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("mkdir");
    std::fs::copy(ws.join("main.py"), elsewhere.join("main.py")).expect("copy");
    let resume = |extra: &[&str]| {
        let mut args = vec![
            "--resume",
            s(&trace),
            "--max-calls",
            "4",
            "--decision",
            "deny",
            "--quiet",
        ];
        args.extend_from_slice(extra);
        run_script(&elsewhere, &rest, &args)
    };
    let out = resume(&[]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the run was recorded in the workspace"),
        "{err}"
    );
    assert!(err.contains("--other-workspace"), "{err}");
    assert_eq!(std::fs::read(&trace).expect("trace"), recorded);
    let out = resume(&["--other-workspace"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "It prints 42.\n");
    // The trace now records where it went on.
    let run = RecordedRun::parse(&text(&std::fs::read(&trace).expect("trace"))).expect("parse");
    let canonical = std::fs::canonicalize(&elsewhere).expect("canonical");
    assert_eq!(run.workspace(), canonical.to_str());
}
