//! Command hooks from a `--settings` file, end to end with scripted models
//! and real scripts in bash and python3: a PreToolUse guard that denies
//! `run_main` through JSON and one that blocks through exit 2 (the model
//! sees the reason); a hook's `allow` that cannot run what the gate denied
//! and its `ask` that goes to the approver; a guard that blocks only
//! children; a PostToolUse logger (one line per call, parent and
//! children, with the agent); a Stop hook that blocks once; hooks that
//! hang, crash, print garbage, print 10 MB or exit 1 (fail closed before
//! a call, a warning elsewhere, `failOpen`); the order hooks run in; a
//! matcher over MCP tool names; a hook written as Claude Code's
//! documentation shows one; the lifecycle events; the environment;
//! the trace, `--json`, `view`; no implicit settings; a hook killed with
//! subloop; a decision that stands though a process the hook left holds
//! its stdout; a key repeated in a hook's JSON; no process a hook started
//! left once it ends; a hook started with no inherited descriptor, no
//! capability and `no_new_privs`; the library's `CommandHooks` under
//! both drivers; and, on a runtime with one worker, a hook or an approver
//! that waits while another run completes.

use crate::common;

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TempDir;
use serde_json::{Value, json};
use subloop::core::hook::{HookDecision, HookEvent};
use subloop::policy::command_hooks::CommandHooks;
use subloop::policy::hooks::Phase;
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedModel;
use subloop::tools::ReadFile;
use subloop::{AgentBuilder, Budget, ModelResponse, StatusKind};

fn have(program: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        common::skipped(format!(
            "{program} is not installed (the hooks are scripts)"
        ));
    }
    found
}

fn use_block(id: &str, name: &str, input: Value) -> Value {
    json!({"content": [{"type": "tool_use", "id": id, "name": name, "input": input}], "stop_reason": "tool_use"})
}

fn answer(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"})
}

/// `{"hooks": {event: [{"matcher": matcher, "hooks": [command...]}]}}`.
fn hooks(event: &str, matcher: &str, commands: &[Value]) -> Value {
    json!({"hooks": {event: [{"matcher": matcher, "hooks": commands}]}})
}

fn command(text: &str) -> Value {
    json!({"type": "command", "command": text, "timeout": 20})
}

/// A run's files: the workspace (a marker workspace: main.py leaves
/// marker.txt when it runs) and a directory outside it for the script,
/// the settings, the hooks and the trace.
struct Setup {
    ws: TempDir,
    dir: TempDir,
}

impl Setup {
    fn new(tag: &str) -> Self {
        Self {
            ws: common::marker_workspace(),
            dir: TempDir::new(tag),
        }
    }

    /// A hook script in the outside directory; its path.
    fn script(&self, name: &str, text: &str) -> String {
        self.dir.write(name, text).display().to_string()
    }

    fn trace(&self) -> std::path::PathBuf {
        self.dir.path().join("trace.jsonl")
    }

    /// `subloop run --json` on `script` with `settings` and `flags`.
    fn run(&self, script: Value, settings: Value, flags: &[&str]) -> Output {
        self.run_with(script, settings, flags, |_| {})
    }

    /// [`Setup::run`], with `prepare` applied to the command first.
    fn run_with(
        &self,
        script: Value,
        settings: Value,
        flags: &[&str],
        prepare: impl FnOnce(&mut Command),
    ) -> Output {
        let script = self.dir.write("script.json", script.to_string());
        let settings = self.dir.write("settings.json", settings.to_string());
        let trace = self.trace();
        let mut args = vec![
            "run",
            "--json",
            "--workspace",
            self.ws.path().to_str().expect("utf-8"),
            "--script",
            script.to_str().expect("utf-8"),
            "--settings",
            settings.to_str().expect("utf-8"),
            "--trace",
            trace.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(flags);
        let mut command = Command::new(common::bin());
        command
            .args(&args)
            .env("ANTHROPIC_API_KEY", "sk-ant-must-not-reach-a-hook")
            .stdin(Stdio::null());
        prepare(&mut command);
        command.output().expect("run subloop")
    }

    fn hook_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(self.trace())
            .expect("trace")
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("json"))
            .filter(|line| line["kind"] == "hook")
            .collect()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn parsed(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}\n{}", text(&out.stdout), text(&out.stderr)))
}

/// `(name, decision, content)` of the parent's tool calls.
fn tools(report: &Value) -> Vec<(String, String, String)> {
    report["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|tool| {
            (
                tool["name"].as_str().unwrap_or_default().to_owned(),
                tool["decision"].as_str().unwrap_or_default().to_owned(),
                tool["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn ran_main(setup: &Setup) -> bool {
    setup.ws.path().join(common::MARKER).exists()
}

/// The script of most tests: read main.py, run it, answer.
fn read_and_run() -> Value {
    json!({"parent": [
        use_block("t1", "read_file", json!({"path": "main.py"})),
        use_block("t2", "run_main", json!({})),
        answer("done"),
    ]})
}

#[test]
fn a_json_deny_keeps_run_main_from_running_and_the_model_gets_the_reason() {
    if !have("bash") || !have("python3") {
        return;
    }
    let setup = Setup::new("hooks-deny");
    let guard = setup.script(
        "guard.sh",
        r#"#!/bin/bash
input=$(cat)
tool=$(printf '%s' "$input" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tool_name"])')
if [ "$tool" = "run_main" ]; then
  echo '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "no programs on Fridays"}}'
fi
"#,
    );
    let settings = hooks(
        "PreToolUse",
        "run_main|read_file",
        &[command(&format!("bash {guard}"))],
    );
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!ran_main(&setup), "a denied run_main ran");
    let report = parsed(&out);
    let got = tools(&report);
    assert_eq!(got[0].1, "not_required");
    assert_eq!(got[1].1, "blocked");
    assert_eq!(
        got[1].2,
        "not executed: denied by a PreToolUse hook: no programs on Fridays"
    );
    // Two hooks ran, one per call; the trace and the JSON report name them.
    let lines = setup.hook_lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1]["event"], "PreToolUse");
    assert_eq!(lines[1]["call_id"], "t2");
    assert_eq!(lines[1]["decision"], "deny");
    assert_eq!(lines[1]["exit_code"], 0);
    assert!(lines[1]["duration_ms"].is_u64());
    assert_eq!(report["hooks"][1]["agent"], "parent", "{report}");
    assert_eq!(report["hooks"][1]["decision"], "deny", "{report}");
    // The progress line says what the hook decided.
    assert!(
        text(&out.stderr).contains("hook PreToolUse `bash"),
        "{}",
        text(&out.stderr)
    );
    // `view` shows the hook under the call it decided.
    let view = Command::new(common::bin())
        .args(["view", setup.trace().to_str().expect("utf-8")])
        .output()
        .expect("view");
    let shown = text(&view.stdout);
    let call = shown.find("tool run_main t2").expect(&shown);
    let hook = shown.find("hook PreToolUse").expect(&shown);
    assert!(shown[call..].contains("[deny] exit 0"), "{shown}");
    assert!(
        hook < call || shown[call..].contains("hook PreToolUse"),
        "{shown}"
    );
}

#[test]
fn exit_2_blocks_with_stderr_as_the_reason() {
    if !have("python3") {
        return;
    }
    let setup = Setup::new("hooks-exit2");
    let guard = setup.script(
        "guard.py",
        "import json, sys\nd = json.load(sys.stdin)\nif d['tool_name'] == 'run_main':\n    print('run_main is off limits', file=sys.stderr)\n    sys.exit(2)\n",
    );
    let settings = hooks("PreToolUse", "", &[command(&format!("python3 {guard}"))]);
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!ran_main(&setup));
    let got = tools(&parsed(&out));
    assert_eq!(
        (got[1].1.as_str(), got[1].2.as_str()),
        (
            "blocked",
            "not executed: denied by a PreToolUse hook: run_main is off limits"
        )
    );
}

#[test]
fn a_hooks_allow_never_runs_what_the_gate_denied_and_its_ask_goes_to_the_approver() {
    if !have("bash") {
        return;
    }
    // allow: the gate still decides (deny wins, and the hook is not asked).
    let setup = Setup::new("hooks-allow");
    let allow = r#"echo '{"hookSpecificOutput": {"permissionDecision": "allow"}}'"#;
    let settings = hooks("PreToolUse", "*", &[command(allow)]);
    let out = setup.run(read_and_run(), settings.clone(), &["--decision", "deny"]);
    assert!(!ran_main(&setup), "allow ran a denied call");
    let got = tools(&parsed(&out));
    assert_eq!(got[1].1, "denied");
    assert_eq!(got[1].2, "not executed: permission denied");
    let lines = setup.hook_lines();
    assert_eq!(lines.len(), 1, "only read_file reached the hook: {lines:?}");
    // ask: read_file, which needs no approval, goes to the approver.
    for (decision, expected) in [("deny", "denied"), ("allow", "allowed")] {
        let setup = Setup::new("hooks-ask");
        let ask = r#"echo '{"hookSpecificOutput": {"permissionDecision": "ask", "permissionDecisionReason": "check the path"}}'"#;
        let settings = hooks("PreToolUse", "read_file", &[command(ask)]);
        let out = setup.run(read_and_run(), settings, &["--decision", decision]);
        let got = tools(&parsed(&out));
        assert_eq!(got[0].1, expected, "{decision}: {got:?}");
        assert_eq!(setup.hook_lines()[0]["decision"], "ask");
    }
}

#[test]
fn a_guard_by_agent_type_blocks_only_children() {
    if !have("python3") {
        return;
    }
    let setup = Setup::new("hooks-children");
    let guard = setup.script(
        "children.py",
        "import json, sys\nd = json.load(sys.stdin)\nif d['agent_type'] != 'parent':\n    print('children may not read ' + d['tool_input']['path'] + ' (' + d['agent_id'] + ', task ' + d['parent_tool_use_id'] + ')', file=sys.stderr)\n    sys.exit(2)\n",
    );
    let settings = hooks(
        "PreToolUse",
        "read_file",
        &[command(&format!("python3 {guard}"))],
    );
    let script = json!({
        "parent": [
            use_block("t1", "read_file", json!({"path": "main.py"})),
            use_block("p1", "task", json!({"task": "read main.py"})),
            answer("done"),
        ],
        "children": [[use_block("c1", "read_file", json!({"path": "main.py"})), answer("could not read")]]
    });
    let out = setup.run(script, settings, &["--decision", "deny"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = parsed(&out);
    assert_eq!(tools(&report)[0].1, "not_required", "{report}");
    let child = &report["children"][0]["tools"][0];
    assert_eq!(child["decision"], "blocked", "{report}");
    assert_eq!(
        child["content"],
        "not executed: denied by a PreToolUse hook: children may not read main.py (child-1, task p1)"
    );
}

#[test]
fn a_post_tool_use_logger_writes_one_line_per_call_with_the_agent() {
    if !have("bash") {
        return;
    }
    let setup = Setup::new("hooks-log");
    let log = setup.dir.path().join("calls.jsonl");
    let logger = setup.script(
        "log.sh",
        &format!(
            "#!/bin/bash\n# One JSON line per call.\ncat >> '{}'\necho >> '{}'\n",
            log.display(),
            log.display()
        ),
    );
    let settings = hooks("PostToolUse", "*", &[command(&format!("bash {logger}"))]);
    let script = json!({
        "parent": [
            use_block("t1", "read_file", json!({"path": "main.py"})),
            use_block("p1", "task", json!({"task": "read main.py"})),
            answer("done"),
        ],
        "children": [[use_block("c1", "read_file", json!({"path": "expected.txt"})), answer("42")]]
    });
    let out = setup.run(script, settings, &["--decision", "deny"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .expect("log")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let seen: Vec<(&str, &str, &str, &str)> = lines
        .iter()
        .map(|line| {
            (
                line["agent_id"].as_str().unwrap_or_default(),
                line["agent_type"].as_str().unwrap_or_default(),
                line["tool_name"].as_str().unwrap_or_default(),
                line["tool_use_id"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("parent", "parent", "read_file", "t1"),
            ("child-1", "subagent", "read_file", "c1"),
            ("parent", "parent", "task", "p1"),
        ]
    );
    let first = &lines[0];
    assert_eq!(first["hook_event_name"], "PostToolUse");
    assert_eq!(first["tool_input"], json!({"path": "main.py"}));
    assert!(
        first["tool_response"]["content"]
            .as_str()
            .is_some_and(|content| content.contains("print(6 * 7)")),
        "{first}"
    );
    assert_eq!(first["tool_response"]["is_error"], false);
    assert_eq!(
        first["transcript_path"],
        setup.trace().display().to_string()
    );
    let cwd = std::fs::canonicalize(setup.ws.path()).expect("workspace");
    assert_eq!(first["cwd"], cwd.display().to_string());
    assert!(
        first["session_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
    assert_eq!(lines[1]["parent_tool_use_id"], "p1");
    // Every line of one run shares the session id.
    assert!(
        lines
            .iter()
            .all(|line| line["session_id"] == first["session_id"])
    );
}

#[test]
fn a_stop_hook_blocks_once_then_lets_the_answer_stand() {
    if !have("python3") {
        return;
    }
    let setup = Setup::new("hooks-stop");
    let stop = setup.script(
        "stop.py",
        "import json, sys\nd = json.load(sys.stdin)\nif not d['stop_hook_active']:\n    print(json.dumps({'decision': 'block', 'reason': 'run the tests first (you said: ' + d['last_assistant_message'] + ')'}))\n",
    );
    let settings = hooks("Stop", "", &[command(&format!("python3 {stop}"))]);
    let script = json!({"parent": [answer("looks fine"), answer("tests pass")]});
    let out = setup.run(script.clone(), settings.clone(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = parsed(&out);
    assert_eq!(report["text"], "tests pass");
    assert_eq!(report["calls"], 2);
    let lines = setup.hook_lines();
    assert_eq!(
        lines
            .iter()
            .map(|line| (line["call"].as_u64(), line["decision"].as_str()))
            .collect::<Vec<_>>(),
        [(Some(1), Some("block")), (Some(2), Some("none"))]
    );
    // The reason went to the model as a user message in the next request.
    let trace = std::fs::read_to_string(setup.trace()).expect("trace");
    assert!(
        trace.contains("run the tests first (you said: looks fine)"),
        "{trace}"
    );
    // `view` shows the block, not a follow-up question.
    let view = Command::new(common::bin())
        .args(["view", setup.trace().to_str().expect("utf-8")])
        .output()
        .expect("view");
    let shown = text(&view.stdout);
    assert!(shown.contains("hook Stop"), "{shown}");
    assert!(!shown.contains("follow-up question"), "{shown}");
    assert!(shown.contains("held every tool_use"), "{shown}");
    // The budget still bounds it: with one call the answer stands, with a warning.
    let setup = Setup::new("hooks-stop-budget");
    let out = setup.run(script, settings, &["--max-calls", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = parsed(&out);
    assert_eq!(report["text"], "looks fine");
    assert!(
        report["warnings"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("no model call is left")),
        "{report}"
    );
}

#[test]
fn a_subagent_stop_hook_sends_the_child_on() {
    if !have("bash") {
        return;
    }
    let setup = Setup::new("hooks-substop");
    let settings = hooks(
        "SubagentStop",
        "subagent",
        &[command(
            r#"grep -q '"stop_hook_active":false' && { echo 'say more' >&2; exit 2; }; exit 0"#,
        )],
    );
    let script = json!({
        "parent": [use_block("p1", "task", json!({"task": "what is 6*7"})), answer("done")],
        "children": [[answer("42"), answer("42, from main.py")]]
    });
    let out = setup.run(script, settings, &["--decision", "deny"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = parsed(&out);
    assert_eq!(
        report["children"][0]["summary"], "42, from main.py",
        "{report}"
    );
    assert_eq!(report["children"][0]["calls"], 2, "{report}");
}

#[test]
fn failing_hooks_fail_closed_before_a_call_and_warn_elsewhere() {
    if !have("bash") || !have("python3") {
        return;
    }
    let cases: [(&str, &str, &str); 5] = [
        ("hangs", "sleep 30", "timed out after"),
        (
            "crashes",
            "exec python3 -P -c 'import ctypes; ctypes.string_at(0)'",
            "killed by signal 11",
        ),
        (
            "prints garbage",
            "echo 'this is not json'",
            "its output is not a JSON object",
        ),
        (
            "prints 10 MB",
            "python3 -P -c \"import sys; sys.stdout.write('x' * 10_000_000)\"",
            "passed the cap of 1048576 bytes",
        ),
        ("exits 1", "echo broken >&2; exit 1", "exit code 1: broken"),
    ];
    for (what, hook, expected) in cases {
        let setup = Setup::new("hooks-fail");
        let mut settings = hooks("PreToolUse", "read_file", &[command(hook)]);
        settings["hooks"]["PreToolUse"][0]["hooks"][0]["timeout"] = json!(1);
        let started = Instant::now();
        let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{what}: the run waited"
        );
        assert_eq!(out.status.code(), Some(0), "{what}: {}", text(&out.stderr));
        let got = tools(&parsed(&out));
        assert_eq!(got[0].1, "hook_failed", "{what}: {got:?}");
        assert!(
            got[0]
                .2
                .starts_with("not executed: a PreToolUse hook failed: ")
                && got[0].2.contains(expected),
            "{what}: {}",
            got[0].2
        );
        // The run went on: run_main (no hook) ran.
        assert!(ran_main(&setup), "{what}");
        assert_eq!(setup.hook_lines()[0]["decision"], "failed", "{what}");
    }
    // failOpen: the call runs, with a warning.
    let setup = Setup::new("hooks-fail-open");
    let mut settings = hooks("PreToolUse", "read_file", &[command("exit 1")]);
    settings["hooks"]["PreToolUse"][0]["hooks"][0]["failOpen"] = json!(true);
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    let report = parsed(&out);
    assert_eq!(tools(&report)[0].1, "not_required");
    assert!(
        report["warnings"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("PreToolUse hook `exit 1` failed: exit code 1"))
    );
    // Elsewhere a failure is a warning: the result stands as the tool gave it.
    let setup = Setup::new("hooks-post-fail");
    let mut settings = hooks("PostToolUse", "*", &[command("sleep 30")]);
    settings["hooks"]["PostToolUse"][0]["hooks"][0]["timeout"] = json!(0.5);
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    let report = parsed(&out);
    let got = tools(&report);
    assert_eq!(got[0].1, "not_required");
    assert!(
        got[0].2.starts_with("print(6 * 7)") || got[0].2.contains("marker"),
        "{got:?}"
    );
    assert!(ran_main(&setup));
    assert_eq!(
        report["warnings"].as_array().map(Vec::len),
        Some(2),
        "{report}"
    );
    assert_eq!(setup.hook_lines()[0]["decision"], "warned");
    assert_eq!(setup.hook_lines()[0]["timed_out"], true);
}

#[test]
fn hooks_of_one_event_run_in_the_order_written_until_one_blocks() {
    if !have("bash") {
        return;
    }
    let setup = Setup::new("hooks-order");
    let log = setup.dir.path().join("order.txt");
    let log = log.display();
    let settings = json!({"hooks": {"PreToolUse": [
        {"matcher": "run_main", "hooks": [command(&format!("echo 1 >> '{log}'")), command(&format!("echo 2 >> '{log}'; echo stop >&2; exit 2"))]},
        {"matcher": "run_main", "hooks": [command(&format!("echo 3 >> '{log}'"))]},
    ]}});
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(setup.dir.path().join("order.txt")).expect("log"),
        "1\n2\n"
    );
    assert!(!ran_main(&setup));
}

#[test]
fn an_mcp_matcher_selects_the_servers_tools_by_regular_expression() {
    if !have("python3") {
        return;
    }
    let server = format!(
        "t=python3 {}/tests/mcp_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    for (matcher, blocked) in [
        ("mcp__t__.*", true),
        ("^mcp__t__look$", true),
        ("mcp__t", false),
        ("mcp__other__.*", false),
    ] {
        let setup = Setup::new("hooks-mcp");
        let server = format!("{server} {}", setup.ws.path().display());
        let settings = hooks(
            "PreToolUse",
            matcher,
            &[command("echo 'not this server' >&2; exit 2")],
        );
        let script = json!({"parent": [
            use_block("a", "mcp__t__look", json!({"text": "hi"})),
            use_block("b", "read_file", json!({"path": "main.py"})),
            answer("done"),
        ]});
        let out = setup.run(script, settings, &["--decision", "allow", "--mcp", &server]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{matcher}: {}",
            text(&out.stderr)
        );
        let got = tools(&parsed(&out));
        let expected = if blocked { "blocked" } else { "allowed" };
        assert_eq!(got[0].1, expected, "{matcher}: {got:?}");
        assert_eq!(got[1].1, "not_required", "{matcher}");
    }
}

#[test]
fn a_hook_written_as_claude_codes_documentation_shows_one() {
    if !have("bash") {
        return;
    }
    // The guard of Claude Code's hooks guide, reading `.tool_input` with
    // jq (with python3 where jq is missing), kept with the project and
    // named through CLAUDE_PROJECT_DIR.
    let setup = Setup::new("hooks-doc");
    let reader = if have_quiet("jq") {
        "jq -r '.tool_input.path'"
    } else {
        "python3 -P -c 'import json,sys; print(json.load(sys.stdin)[\"tool_input\"][\"path\"])'"
    };
    setup.ws.write(
        ".claude/hooks/protect-files.sh",
        format!(
            r#"#!/bin/bash
# protect-files.sh
FILE_PATH=$({reader})

PROTECTED_PATTERNS=(".env" "package-lock.json" ".git/")

for pattern in "${{PROTECTED_PATTERNS[@]}}"; do
  if [[ "$FILE_PATH" == *"$pattern"* ]]; then
    echo "Blocked: $FILE_PATH matches protected pattern '$pattern'" >&2
    exit 2
  fi
done

exit 0
"#
        ),
    );
    setup.ws.write(".env", "SECRET=1\n");
    let settings = json!({"hooks": {"PreToolUse": [{"matcher": "read_file", "hooks": [
        {"type": "command", "command": "bash \"$CLAUDE_PROJECT_DIR\"/.claude/hooks/protect-files.sh"}
    ]}]}});
    let script = json!({"parent": [
        use_block("t1", "read_file", json!({"path": ".env"})),
        use_block("t2", "read_file", json!({"path": "main.py"})),
        answer("done"),
    ]});
    let out = setup.run(script, settings, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let got = tools(&parsed(&out));
    assert_eq!(
        got[0].2,
        "not executed: denied by a PreToolUse hook: Blocked: .env matches protected pattern '.env'"
    );
    assert_eq!(got[1].1, "not_required");
}

fn have_quiet(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[test]
fn the_lifecycle_events_run_in_order_and_add_context() {
    if !have("python3") {
        return;
    }
    let setup = Setup::new("hooks-life");
    let log = setup.dir.path().join("events.txt");
    let hook = setup.script(
        "life.py",
        &format!(
            "import json, sys\nd = json.load(sys.stdin)\nopen('{}', 'a').write(d['hook_event_name'] + ' ' + d['agent_id'] + ' ' + str(d.get('source') or d.get('reason') or '') + '\\n')\nif d['hook_event_name'] == 'UserPromptSubmit':\n    print('Answer in French.')\nif d['hook_event_name'] == 'SubagentStart':\n    print(json.dumps({{'hookSpecificOutput': {{'hookEventName': 'SubagentStart', 'additionalContext': 'Be brief.'}}}}))\n",
            log.display()
        ),
    );
    let each = json!([{"hooks": [command(&format!("python3 {hook}"))]}]);
    let settings = json!({"hooks": {
        "SessionStart": each,
        "UserPromptSubmit": each,
        "SubagentStart": each,
        "SessionEnd": each,
    }});
    let script = json!({
        "parent": [use_block("p1", "task", json!({"task": "read main.py"})), answer("fini")],
        "children": [[answer("42")]]
    });
    let out = setup.run(
        script,
        settings,
        &["--question", "What does main.py print?"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "SessionStart parent startup\nUserPromptSubmit parent \nSubagentStart child-1 \nSessionEnd parent answered\n"
    );
    let trace = std::fs::read_to_string(setup.trace()).expect("trace");
    assert!(
        trace.contains("What does main.py print?\\n\\nAnswer in French."),
        "{trace}"
    );
    assert!(trace.contains("read main.py\\n\\nBe brief."), "{trace}");
    // A prompt hook that blocks: no model call, exit 2 with the reason.
    let setup = Setup::new("hooks-prompt-block");
    let settings = hooks(
        "UserPromptSubmit",
        "",
        &[command("echo 'no questions about main.py' >&2; exit 2")],
    );
    let out = setup.run(json!({"parent": [answer("never")]}), settings, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr)
            .contains("a UserPromptSubmit hook blocked the question: no questions about main.py"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn continue_false_stops_the_run_with_its_reason() {
    if !have("bash") {
        return;
    }
    let setup = Setup::new("hooks-continue");
    let settings = hooks(
        "PostToolUse",
        "read_file",
        &[command(
            r#"echo '{"continue": false, "stopReason": "enough reading"}'"#,
        )],
    );
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report = parsed(&out);
    assert_eq!(report["status"], "cancelled", "{report}");
    assert!(
        report["text"]
            .as_str()
            .is_some_and(|text| text.contains("a hook stopped the run: enough reading")),
        "{report}"
    );
    assert!(!ran_main(&setup));
}

#[test]
fn a_hook_gets_a_cleared_environment_and_runs_in_the_workspace() {
    if !have("bash") {
        return;
    }
    let setup = Setup::new("hooks-env");
    let dump = setup.dir.path().join("env.txt");
    let settings = hooks(
        "PreToolUse",
        "",
        &[command(&format!(
            "env > '{}'; pwd >> '{}'",
            dump.display(),
            dump.display()
        ))],
    );
    let out = setup.run(read_and_run(), settings, &["--decision", "deny"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = std::fs::read_to_string(&dump).expect("env");
    assert!(!env.contains("ANTHROPIC_API_KEY"), "{env}");
    assert!(!env.contains("sk-ant"), "{env}");
    assert!(env.lines().any(|line| line.starts_with("PATH=")), "{env}");
    let ws = std::fs::canonicalize(setup.ws.path()).expect("workspace");
    assert!(
        env.lines()
            .any(|line| line == format!("CLAUDE_PROJECT_DIR={}", ws.display())),
        "{env}"
    );
    assert_eq!(env.lines().last(), Some(ws.display().to_string().as_str()));
}

#[test]
fn settings_are_read_only_when_given_and_bad_ones_are_refused() {
    if !have("bash") {
        return;
    }
    // A workspace's own Claude Code settings are never read implicitly.
    let setup = Setup::new("hooks-implicit");
    let deny_all = hooks("PreToolUse", "", &[command("exit 2")]);
    setup
        .ws
        .write(".claude/settings.json", deny_all.to_string());
    setup.ws.write("settings.json", deny_all.to_string());
    let script = setup.dir.write("script.json", read_and_run().to_string());
    let out = Command::new(common::bin())
        .args(["run", "--json", "--decision", "allow", "--workspace"])
        .arg(setup.ws.path())
        .arg("--script")
        .arg(&script)
        .current_dir(setup.ws.path())
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(tools(&parsed(&out))[0].1, "not_required");
    // A file that is not of the format: exit 2, naming where.
    for (settings, expected) in [
        (
            json!({"hooks": {"Stop": [{"hooks": [{"type": "prompt", "prompt": "x"}]}]}}),
            "only `command` hooks",
        ),
        (
            json!({"hooks": {"PreToolUse": [{"matcher": "(", "hooks": []}]}}),
            "not a valid regular expression",
        ),
        (
            json!({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x", "timeout": -1}]}]}}),
            "hooks.Stop[0].hooks[0].timeout",
        ),
    ] {
        let setup = Setup::new("hooks-bad");
        let out = setup.run(read_and_run(), settings, &[]);
        assert_eq!(out.status.code(), Some(2), "{expected}");
        assert!(
            text(&out.stderr).contains(expected),
            "{}",
            text(&out.stderr)
        );
    }
}

/// Whether `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

#[test]
fn a_hook_still_running_is_killed_when_subloop_is() {
    if !have("bash") {
        return;
    }
    let setup = Setup::new("hooks-kill");
    let pid_file = setup.dir.path().join("pid");
    let settings = hooks(
        "PreToolUse",
        "",
        &[
            // Its pid as subloop sees it (`$$` is 1 in a PID namespace of its own).
            json!({"type": "command", "command": format!("read -r pid rest < /proc/self/stat; echo $pid > '{}'; sleep 60", pid_file.display()), "timeout": 120}),
        ],
    );
    let script = setup.dir.write("script.json", read_and_run().to_string());
    let settings = setup.dir.write("settings.json", settings.to_string());
    let mut child = Command::new(common::bin())
        .args(["run", "--decision", "allow", "--workspace"])
        .arg(setup.ws.path())
        .arg("--script")
        .arg(&script)
        .arg("--settings")
        .arg(&settings)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start subloop");
    let started = Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
        {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the hook never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!ended(pid));
    let _ = child.kill(); // SIGKILL: no handler of subloop runs.
    let _ = child.wait();
    let started = Instant::now();
    while !ended(pid) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the hook outlived subloop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether this machine lets subloop give a hook a PID namespace of its
/// own (what `unshare` can do, subloop can).
fn pid_namespaces() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut unshare = Command::new("unshare");
    if !root {
        unshare.arg("--user");
    }
    let found = unshare
        .args(["--pid", "--fork", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        common::skipped("PID namespaces are not available here (or `unshare` is not installed)");
    }
    found
}

/// The processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_deny_printed_before_a_descendant_holds_stdout_open_stands() {
    if !have("bash") {
        return;
    }
    let setup = Setup::new("hooks-held-stdout");
    // It prints its decision and exits 0, leaving a process (out of its
    // group and session) that keeps its stdout open past the grace.
    let deny = r#"{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "held"}}"#;
    let settings = hooks(
        "PreToolUse",
        "run_main",
        &[command(&format!("echo '{deny}'; setsid sleep 3 & exit 0"))],
    );
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!ran_main(&setup), "a denied run_main ran");
    let got = tools(&parsed(&out));
    assert_eq!(
        (got[1].1.as_str(), got[1].2.as_str()),
        ("blocked", "not executed: denied by a PreToolUse hook: held")
    );
    assert_eq!(setup.hook_lines()[0]["decision"], "deny");
}

#[test]
fn a_key_repeated_in_a_hooks_json_fails_closed() {
    let setup = Setup::new("hooks-duplicate-key");
    let twice =
        r#"{"hookSpecificOutput": {"permissionDecision": "deny", "permissionDecision": "allow"}}"#;
    let settings = hooks(
        "PreToolUse",
        "run_main",
        &[command(&format!("echo '{twice}'"))],
    );
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!ran_main(&setup), "run_main ran on a repeated key");
    let got = tools(&parsed(&out));
    assert_eq!(got[1].1, "hook_failed", "{got:?}");
    assert!(
        got[1].2.contains("`permissionDecision` appears twice"),
        "{}",
        got[1].2
    );
    assert_eq!(setup.hook_lines()[0]["decision"], "failed");
}

#[test]
fn nothing_a_hook_started_outlives_it_even_out_of_its_session() {
    if !pid_namespaces() {
        return;
    }
    let setup = Setup::new("hooks-descendants");
    let marker = format!("subloop-hook-leftover-{}", std::process::id());
    let settings = hooks(
        "PreToolUse",
        "run_main",
        &[command(&format!(
            "setsid sh -c 'sleep 30; : {marker}' </dev/null >/dev/null 2>&1 & sleep 0.3; exit 0"
        ))],
    );
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(ran_main(&setup));
    let started = Instant::now();
    loop {
        let left = processes_with(&marker);
        if left.is_empty() {
            break;
        }
        if started.elapsed() > Duration::from_secs(5) {
            for pid in &left {
                // SAFETY: kill(2) on the leftover this test made.
                unsafe {
                    libc::kill(*pid, libc::SIGKILL);
                }
            }
            panic!("processes the hook started outlived it: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_hook_gets_no_inherited_descriptor_no_capability_and_no_new_privileges() {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::process::CommandExt as _;
    let setup = Setup::new("hooks-hardened");
    let fds = setup.dir.path().join("fds.txt");
    let status = setup.dir.path().join("status.txt");
    let outside = setup.dir.path().join("outside.txt");
    let settings = hooks(
        "PreToolUse",
        "run_main",
        &[command(&format!(
            "ls /proc/self/fd > '{}'; grep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status > '{}'; echo leaked >&7; exit 0",
            fds.display(),
            status.display()
        ))],
    );
    // subloop runs with descriptor 7 open on a file, not close-on-exec (as
    // `subloop run ... 7>>outside.txt` would).
    let file = std::fs::File::create(&outside).expect("outside.txt");
    let fd = file.as_raw_fd();
    let out = setup.run_with(
        read_and_run(),
        settings,
        &["--decision", "allow"],
        |command| {
            // SAFETY: dup2(2) in the forked child, before the exec.
            unsafe {
                command.pre_exec(move || {
                    if libc::dup2(fd, 7) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        },
    );
    drop(file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    common::assert_started_hardened(&fds, &outside, &status);
    // The hook ran to its end and decided nothing: run_main ran.
    assert!(ran_main(&setup));
}

fn library_run(driver: common::Driver) {
    use common::RunDriven as _;
    let ws = common::marker_workspace();
    let settings = json!({"hooks": {
        "PreToolUse": [{"matcher": "read_file", "hooks": [command("grep -q expected.txt && { echo 'not that one' >&2; exit 2; }; exit 0")]}],
        "Stop": [{"hooks": [command("grep -q '\"stop_hook_active\":true' || { echo 'once more' >&2; exit 2; }")]}],
    }});
    let hooks = CommandHooks::parse(&settings.to_string(), "test")
        .expect("settings")
        .workspace(ws.path());
    assert!(hooks.has(HookEvent::PreToolUse) && !hooks.has(HookEvent::SessionEnd));
    let agent = AgentBuilder::new(Arc::new(AllowAll))
        .read_only_tool(ReadFile::new(ws.path(), ReadFile::DEFAULT_LIMIT).expect("read_file"))
        .expect("registry")
        .command_hooks(hooks)
        .build();
    let model = ScriptedModel::new(vec![
        Ok(ModelResponse::tool_calls([
            ("r1", "read_file", json!({"path": "main.py"})),
            ("r2", "read_file", json!({"path": "expected.txt"})),
        ])),
        Ok(ModelResponse::answer("first")),
        Ok(ModelResponse::answer("second")),
    ]);
    let mut model = model;
    let report = common::with_driver(driver, || {
        agent.run_driven("check", Budget::new(4).expect("budget"), &mut model)
    })
    .expect("run");
    assert_eq!(report.outcome.status, StatusKind::Answered);
    assert_eq!(report.outcome.text, "second");
    assert_eq!(report.tools[1].decision.as_str(), "blocked");
    let hooks: Vec<_> = report
        .audit
        .iter()
        .filter(|entry| entry.phase == Phase::Hook)
        .filter_map(|entry| entry.hook.as_ref())
        .map(|record| (record.event, record.decision))
        .collect();
    assert_eq!(
        hooks,
        [
            (HookEvent::PreToolUse, HookDecision::None),
            (HookEvent::PreToolUse, HookDecision::Deny),
            (HookEvent::Stop, HookDecision::Block),
            (HookEvent::Stop, HookDecision::None),
        ]
    );
}

#[test]
fn the_library_runs_command_hooks_blocking() {
    library_run(common::Driver::Blocking);
}

#[test]
fn the_library_runs_command_hooks_async() {
    library_run(common::Driver::Async);
}

/// A hook (a process subloop starts, outside the sandbox) cannot read
/// subloop's environment, where the API keys are: subloop is not dumpable
/// and the hook has no capability.
#[test]
fn a_hook_cannot_read_the_environment_of_subloop() {
    use std::os::unix::process::CommandExt as _;
    let setup = Setup::new("hooks-environ");
    let found = setup.dir.path().join("found.txt");
    let reader = setup.script(
        "environ.sh",
        &format!(
            "#!/bin/sh\nfor f in /proc/[0-9]*/environ; do \
             if tr '\\0' '\\n' < \"$f\" 2>/dev/null | grep -q ENVIRON-SECRET-7731; then echo \"$f\"; fi; \
             done > '{}'\nexit 0\n",
            found.display()
        ),
    );
    std::fs::set_permissions(
        &reader,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .unwrap();
    let settings = hooks("PreToolUse", "run_main", &[command(&reader)]);
    let out = setup.run_with(
        read_and_run(),
        settings,
        &["--decision", "allow"],
        |command| {
            command.env("ANTHROPIC_API_KEY", "ENVIRON-SECRET-7731");
            // The test's own process must not hold the secret: only subloop's.
            // SAFETY: nothing in the forked child.
            unsafe { command.pre_exec(|| Ok(())) };
        },
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let found = std::fs::read_to_string(&found).expect("the hook ran");
    assert_eq!(found, "", "the hook read the key from {found}");
}

/// The attack the sandbox and the hooks together must stop: a program
/// run by run_main rewrites a hook's script in the workspace, plants a
/// module for a `python3 -c` hook and sets git's `core.fsmonitor`; none of
/// it runs outside the sandbox.
#[test]
fn a_program_cannot_plant_code_that_hooks_run() {
    if !have("python3") {
        return;
    }
    let setup = Setup::new("hooks-plant");
    let ws = setup.ws.path();
    let escaped = setup.dir.path().join("escaped.txt");
    std::fs::create_dir_all(ws.join("hooks")).unwrap();
    let guard = ws.join("hooks/guard.sh");
    std::fs::write(&guard, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(
        &guard,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .unwrap();
    let evil = format!(
        "#!/bin/sh\necho escaped > '{}'\nexit 0\n",
        escaped.display()
    );
    std::fs::write(
        ws.join("main.py"),
        format!(
            "import os\n\
             open('{m}', 'w').write('ran')\n\
             for name, text in [('hooks/guard.sh', {evil:?}), ('json.py', 'open({e:?}, \"w\").write(\"json\")\\n')]:\n    \
             try:\n        open(name, 'w').write(text)\n        print('wrote', name)\n    \
             except OSError as err:\n        print('refused', name, err)\n",
            m = common::MARKER,
            e = escaped.display().to_string(),
        ),
    )
    .unwrap();
    let settings = hooks(
        "PostToolUse",
        "run_main",
        &[
            command("./hooks/guard.sh"),
            command("python3 -P -c 'import json'"),
        ],
    );
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(ran_main(&setup));
    assert!(!escaped.exists(), "a planted hook ran outside the sandbox");
    assert_eq!(
        std::fs::read_to_string(&guard).unwrap(),
        "#!/bin/sh\nexit 0\n"
    );
    // A `python3 -c` hook without -P would import json.py from the
    // workspace: such a run is refused before it starts.
    let settings = hooks(
        "PostToolUse",
        "run_main",
        &[command("python3 -c 'import json'")],
    );
    let out = setup.run(read_and_run(), settings, &["--decision", "allow"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("-P"), "{}", text(&out.stderr));
}

/// On a runtime with one worker thread, a run whose `PreToolUse` hook
/// waits (on a FIFO this test writes to) and a run whose approver waits
/// (on a channel this test sends on) hold no worker: another run on the
/// same runtime starts and ends meanwhile, and the waiting runs end once
/// let go.
#[test]
fn a_waiting_hook_or_approver_holds_no_async_worker() {
    use subloop::policy::permission::{ApprovalRequest, Approver, Decision, OffWorker};
    use subloop::providers::scripted::ScriptedModel as Script;
    use subloop::run::model::Blocking;
    use subloop::tools::{RunMain, RunSettings};

    /// Decides once the test says so.
    struct Waiting(std::sync::Mutex<std::sync::mpsc::Receiver<Decision>>);
    impl Approver for Waiting {
        fn decide(&self, _request: &ApprovalRequest<'_>) -> Decision {
            self.0
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or(Decision::Deny)
        }
    }

    let setup = Setup::new("hooks-one-worker");
    let fifo = setup.dir.path().join("go");
    let started = setup.dir.path().join("started");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let settings = json!({"hooks": {"PreToolUse": [{"matcher": "read_file", "hooks": [
        command(&format!("touch '{}'; cat '{}' > /dev/null; exit 0", started.display(), fifo.display()))
    ]}]}});
    let hooked = AgentBuilder::new(Arc::new(AllowAll))
        .read_only_tool(ReadFile::new(setup.ws.path(), ReadFile::DEFAULT_LIMIT).expect("read_file"))
        .expect("registry")
        .command_hooks(
            CommandHooks::parse(&settings.to_string(), "test")
                .expect("settings")
                .workspace(setup.ws.path()),
        )
        .build();
    let (decide, decision) = std::sync::mpsc::channel();
    let asking = AgentBuilder::new(Arc::new(OffWorker::new(Waiting(std::sync::Mutex::new(
        decision,
    )))))
    .tool(RunMain::new(setup.ws.path(), RunSettings::default()).expect("run_main"))
    .expect("registry")
    .build();
    let free = AgentBuilder::new(Arc::new(AllowAll)).build();
    let script = |call: Option<(&str, Value)>| {
        let mut replies = Vec::new();
        if let Some((name, input)) = call {
            replies.push(Ok(ModelResponse::tool_calls([("c1", name, input)])));
        }
        replies.push(Ok(ModelResponse::answer("done")));
        Blocking(Script::new(replies))
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let budget = || Budget::new(4).expect("budget");
        let mut hooked_model = script(Some(("read_file", json!({"path": "main.py"}))));
        let hooked =
            tokio::spawn(
                async move { hooked.run_async("read", budget(), &mut hooked_model).await },
            );
        let mut asking_model = script(Some(("run_main", json!({}))));
        let asking =
            tokio::spawn(async move { asking.run_async("run", budget(), &mut asking_model).await });
        // The hook has started and waits on the FIFO; the approver waits on
        // the channel.
        let until = Instant::now() + Duration::from_secs(30);
        while !started.exists() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(started.exists(), "the hook did not start");
        // Another run on the same (only) worker starts and ends meanwhile.
        let mut free_model = script(None);
        let report = tokio::time::timeout(
            Duration::from_secs(20),
            free.run_async("q", budget(), &mut free_model),
        )
        .await
        .expect("the free run ended while the others waited")
        .expect("run");
        assert_eq!(report.outcome.text, "done");
        assert!(!hooked.is_finished() && !asking.is_finished());
        // Let them go.
        decide.send(Decision::Allow).unwrap();
        let fifo = fifo.clone();
        tokio::task::spawn_blocking(move || std::fs::write(fifo, "go\n"))
            .await
            .unwrap()
            .unwrap();
        for (waited, decision) in [(hooked, "not_required"), (asking, "allowed")] {
            let report = tokio::time::timeout(Duration::from_secs(20), waited)
                .await
                .expect("the run ended once let go")
                .unwrap()
                .expect("run");
            assert_eq!(report.outcome.status, StatusKind::Answered);
            assert_eq!(report.tools.len(), 1);
            assert_eq!(
                report.tools[0].decision.as_str(),
                decision,
                "{:?}",
                report.tools
            );
        }
    });
}
