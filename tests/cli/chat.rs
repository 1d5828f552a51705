//! `subloop chat`: one question per line, each a follow-up with the whole
//! history, one trace for the session; Ctrl-C cancels a question, not the
//! session (driven through a pseudo-terminal).

use crate::common;

use std::io::Cursor;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::host::chat::Chat;
use crate::host::{DecisionMode, Models, Settings};
use common::TempDir;
use subloop::StatusKind;
use subloop::record::recorded::RecordedRun;
use subloop::record::trace::RebuiltRequest;

fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"content": [{"type": "tool_use", "id": id, "name": name, "input": input}],
           "stop_reason": "tool_use"})
}

fn answer(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"})
}

fn scene(tag: &str, sleep: u32, replies: Vec<Value>) -> (TempDir, std::path::PathBuf) {
    let dir = TempDir::new(tag);
    dir.write(
        "ws/main.py",
        format!("import time\ntime.sleep({sleep})\nprint(6 * 7)\n"),
    );
    dir.write("ws/expected.txt", "42\n");
    let script = dir.write(
        "session.json",
        serde_json::to_vec(&json!({ "parent": replies })).expect("script"),
    );
    (dir, script)
}

#[test]
fn a_session_answers_each_line_with_the_whole_history_in_one_trace() {
    let (dir, script) = scene(
        "chat-lib",
        0,
        vec![
            tool_use("toolu_01", "read_file", json!({"path": "main.py"})),
            answer("It prints 42."),
            tool_use("toolu_02", "read_file", json!({"path": "expected.txt"})),
            answer("It says 42 too."),
            answer("Yes, they agree."),
        ],
    );
    let mut settings = Settings::new(dir.path().join("ws"));
    settings.decision = DecisionMode::Deny;
    settings.progress = false;
    settings.max_calls = 2;
    settings.script = Some(script.clone());
    let trace = dir.path().join("session.jsonl");
    let loaded = subloop::providers::scripted::Script::load(&script).expect("script");
    let mut chat = Chat::new(settings, Models::Script(loaded), trace.clone());
    let mut said = Vec::new();
    let mut say = |text: &str| said.push(text.to_owned());
    let mut input = Cursor::new(
        "What does main.py print?\n\n/continue\nAnd expected.txt?\nSo they agree?\n/exit\nnot read\n",
    );
    chat.run(&mut input, &mut say, None).expect("session");
    assert_eq!(
        said,
        [
            "It prints 42.",
            "nothing to continue: ask a question",
            "It says 42 too.",
            "Yes, they agree."
        ]
    );
    let statuses: Vec<Option<StatusKind>> = chat.turns().iter().map(|turn| turn.status).collect();
    assert_eq!(
        statuses,
        [
            Some(StatusKind::Answered),
            None,
            Some(StatusKind::Answered),
            Some(StatusKind::Answered)
        ]
    );
    // One trace: the last request holds every question and answer.
    let text = std::fs::read_to_string(&trace).expect("trace");
    let last = RebuiltRequest::from_trace(&text)
        .expect("rebuild")
        .pop()
        .expect("request");
    assert_eq!(last.call, 5);
    let texts: Vec<String> = last
        .messages
        .iter()
        .map(subloop::core::protocol::Message::text)
        .collect();
    for line in [
        "What does main.py print?",
        "It prints 42.",
        "And expected.txt?",
        "It says 42 too.",
        "So they agree?",
    ] {
        assert!(texts.contains(&line.to_owned()), "{line} in {texts:?}");
    }
    // `run --resume` takes the session's trace for one more follow-up.
    let rest = dir.write(
        "rest.json",
        json!({"parent": [answer("Still 42.")]}).to_string(),
    );
    let out = Command::new(common::bin())
        .args(["run", "--workspace"])
        .arg(dir.path().join("ws"))
        .arg("--script")
        .arg(&rest)
        .arg("--resume")
        .arg(&trace)
        .args(["--question", "Once more?", "--quiet"])
        .output()
        .expect("run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Still 42.\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        RecordedRun::parse(&std::fs::read_to_string(&trace).expect("trace"))
            .expect("parse")
            .calls("parent"),
        6
    );
    // The whole session, every follow-up included, replays as recorded.
    let replay = || {
        Command::new(common::bin())
            .arg("replay")
            .arg(&trace)
            .arg("--workspace")
            .arg(dir.path().join("ws"))
            .args(["--decision", "deny", "--max-calls", "2", "--quiet"])
            .output()
            .expect("replay")
    };
    let out = replay();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("reproduced: all 6 recorded request(s)"),
        "{stdout}"
    );
    // A changed file diverges in the follow-up that read it.
    dir.write("ws/expected.txt", "43\n");
    let out = replay();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.starts_with("diverged: parent call 4: tool_result toolu_02 content differs"),
        "{stdout}"
    );
}

/// Drives `subloop chat` through a pseudo-terminal with python3's `pty`:
/// answers, a Ctrl-C during a question, the session going on, `/exit`.
#[test]
fn ctrl_c_cancels_the_question_not_the_session() {
    let python = Command::new("python3").arg("-c").arg("import pty").output();
    if !python.is_ok_and(|out| out.status.success()) {
        common::skipped("python3 with the pty module is not installed");
        return;
    }
    let (dir, script) = scene(
        "chat-pty",
        2,
        vec![
            tool_use("toolu_01", "read_file", json!({"path": "main.py"})),
            answer("It prints 42."),
            tool_use("toolu_02", "run_main", json!({})),
            answer("It ran."),
        ],
    );
    let trace = dir.path().join("session.jsonl");
    let driver = dir.write(
        "drive.py",
        r#"
import os, pty, select, sys, time
bin, ws, script, trace = sys.argv[1:5]
pid, fd = pty.fork()
if pid == 0:
    os.execv(bin, [bin, "chat", "--workspace", ws, "--script", script, "--trace", trace,
                   "--decision", "allow", "--run-timeout", "30"])
seen = b""
def wait_for(token):
    global seen
    end = time.time() + 60
    while token not in seen:
        ready, _, _ = select.select([fd], [], [], max(0, end - time.time()))
        if not ready:
            sys.exit("timed out waiting for %r; the terminal showed %r" % (token, seen))
        try:
            seen += os.read(fd, 4096)
        except OSError:
            sys.exit("the terminal closed before %r; it showed %r" % (token, seen))
    seen = seen[seen.index(token) + len(token):]
wait_for(b"> ")
os.write(fd, b"What does main.py print?\r")
wait_for(b"It prints 42.")
wait_for(b"> ")
os.write(fd, b"Run it.\r")
wait_for(b"tool run_main")
time.sleep(0.3)
os.write(fd, b"\x03")
wait_for(b"cancel")
wait_for(b"> ")
os.write(fd, b"A new question?\r")
wait_for(b"/continue goes on with it")
wait_for(b"> ")
os.write(fd, b"/continue\r")
wait_for(b"It ran.")
wait_for(b"> ")
os.write(fd, b"/exit\r")
_, status = os.waitpid(pid, 0)
sys.exit(0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else "exit status %r" % status)
"#,
    );
    let s = |path: &Path| path.to_str().expect("utf-8").to_owned();
    let out = Command::new("python3")
        .arg(&driver)
        .args([
            common::bin().to_owned(),
            s(&dir.path().join("ws")),
            s(&script),
            s(&trace),
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&trace).expect("trace");
    let statuses: Vec<String> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["kind"] == "outcome" && line["agent"] == "parent")
        .map(|line| line["status"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(statuses, ["answered", "cancelled", "answered"]);
    // run_main ran once, to its end, before the question stopped.
    let run = RecordedRun::parse(&text).expect("the session's trace reads back");
    let ran: Vec<&Value> = run
        .tools("parent")
        .iter()
        .filter(|line| line["name"] == "run_main")
        .collect();
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0]["decision"], "allowed");
}

/// Without `--trace`, the session's trace is a temporary file: gone at the
/// end of input, and gone when SIGTERM ends the session mid-question.
#[test]
fn a_temporary_session_trace_is_removed_even_on_sigterm() {
    use std::io::Write as _;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let (dir, script) = scene(
        "chat-temp",
        30,
        vec![tool_use("toolu_01", "run_main", json!({})), answer("ran")],
    );
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let leftovers = || -> Vec<String> {
        std::fs::read_dir(&tmp)
            .expect("tmp")
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("subloop-chat-"))
            .collect()
    };
    let mut command = Command::new(common::bin());
    command
        .args(["chat", "--workspace"])
        .arg(dir.path().join("ws"))
        .arg("--script")
        .arg(&script)
        .args(["--decision", "allow", "--run-timeout", "60"])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    common::default_signals(&mut command);
    let mut child = command.spawn().expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"Run it.\n").expect("question");
    let until = Instant::now() + Duration::from_secs(60);
    // The question is under way once its trace exists and run_main started.
    while leftovers().is_empty()
        || !std::fs::read_to_string(
            leftovers()
                .first()
                .map(|name| tmp.join(name))
                .expect("trace"),
        )
        .unwrap_or_default()
        .contains("\"kind\":\"response\"")
    {
        assert!(Instant::now() < until, "the question never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2) on the child we spawned.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(143));
    assert!(leftovers().is_empty(), "left behind: {:?}", leftovers());
}

#[test]
fn a_line_that_cannot_run_is_refused_and_the_session_goes_on() {
    let (dir, script) = scene(
        "chat-refused",
        0,
        vec![
            tool_use("toolu_01", "read_file", json!({"path": "main.py"})),
            answer("unused"),
        ],
    );
    let mut settings = Settings::new(dir.path().join("ws"));
    settings.progress = false;
    settings.max_calls = 1;
    let loaded = subloop::providers::scripted::Script::load(&script).expect("script");
    let mut chat = Chat::new(settings, Models::Script(loaded), dir.path().join("s.jsonl"));
    let mut said = Vec::new();
    let mut say = |text: &str| said.push(text.to_owned());
    let mut input = Cursor::new("What does main.py print?\nAnother?\n/continue\n/exit\n");
    chat.run(&mut input, &mut say, None)
        .expect("the session ends normally");
    assert_eq!(said.len(), 3, "{said:?}");
    assert!(said[0].starts_with("call limit reached"), "{said:?}");
    assert!(
        said[1].starts_with("the last question ended call_limit"),
        "{said:?}"
    );
    assert!(
        said[2].starts_with("cannot ask this: cannot resume"),
        "{said:?}"
    );
    assert!(
        said[2].contains("give a call budget above 1 to continue it (--max-calls above 1)"),
        "{said:?}"
    );
}

/// Runs `driver` (python3 code after a `wait_for(token)` helper and `fd`,
/// the terminal of `subloop chat ARGS…`) and returns its failure, if any.
fn drive_chat_pty(dir: &TempDir, args: &[String], steps: &str) -> Result<(), String> {
    let driver = dir.write(
        "drive.py",
        format!(
            r#"
import os, pty, select, sys, time, json
args = json.loads(sys.argv[1])
pid, fd = pty.fork()
if pid == 0:
    os.execv(args[0], args)
seen = b""
everything = b""
def read_until(done, token):
    global seen, everything
    end = time.time() + 60
    while not done():
        ready, _, _ = select.select([fd], [], [], max(0, end - time.time()))
        if not ready:
            sys.exit("timed out waiting for %r; the terminal showed %r" % (token, everything))
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            sys.exit("the terminal closed before %r; it showed %r" % (token, everything))
        seen += chunk
        everything += chunk
def wait_for(token):
    # Waits for `token` after what was waited for last, and moves past it.
    global seen
    read_until(lambda: token in seen, token)
    seen = seen[seen.index(token) + len(token):]
def wait_seen(token):
    # For output of another thread that may come before or after what was
    # waited for last: looks at everything shown.
    read_until(lambda: token in everything, token)
def exit_status():
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -status
{steps}
"#
        ),
    );
    let out = Command::new("python3")
        .arg(&driver)
        .arg(serde_json::to_string(args).map_err(|err| err.to_string())?)
        .output()
        .map_err(|err| err.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The parent's outcome statuses and its `run_main` decisions, in order.
fn statuses_and_decisions(trace: &Path) -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(trace).expect("trace");
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let field = |kind: &str, key: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|line| line["kind"] == kind && line["agent"] == "parent")
            .filter(|line| kind != "tool" || line["name"] == "run_main")
            .map(|line| line[key].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    (field("outcome", "status"), field("tool", "decision"))
}

/// With the default `--decision ask`, chat's approval prompt reads the
/// answer from the same terminal as the session's lines: `y` runs the
/// program, `n` denies it, Ctrl-C at the prompt denies it and stops the
/// question (the session goes on), Ctrl-C at chat's own prompt cancels
/// nothing, and the end of input at the approval prompt denies the call
/// and ends the session normally.
#[test]
fn chat_answers_its_own_approval_prompt() {
    let python = Command::new("python3").arg("-c").arg("import pty").output();
    if !python.is_ok_and(|out| out.status.success()) {
        common::skipped("python3 with the pty module is not installed");
        return;
    }
    let (dir, script) = scene(
        "chat-ask",
        0,
        vec![
            tool_use("toolu_01", "run_main", json!({})),
            answer("It printed 42."),
            tool_use("toolu_02", "run_main", json!({})),
            answer("You said no."),
            tool_use("toolu_03", "run_main", json!({})),
            tool_use("toolu_04", "run_main", json!({})),
            answer("Nobody answered."),
        ],
    );
    let trace = dir.path().join("session.jsonl");
    let s = |path: &Path| path.to_str().expect("utf-8").to_owned();
    let args = [
        common::bin().to_owned(),
        "chat".to_owned(),
        "--workspace".to_owned(),
        s(&dir.path().join("ws")),
        "--script".to_owned(),
        s(&script),
        "--trace".to_owned(),
        s(&trace),
    ];
    let steps = r#"
wait_for(b"> ")
os.write(fd, b"Run it.\r")
wait_for(b"Allow? [y/N] ")
os.write(fd, b"y\r")
wait_for(b"It printed 42.")
wait_for(b"> ")
os.write(fd, b"\x03")
wait_for(b"nothing is running: /exit or the end of input (Ctrl-D) leaves the session")
os.write(fd, b"\x03")
wait_for(b"nothing is running")
os.write(fd, b"Again?\r")
wait_for(b"Allow? [y/N] ")
os.write(fd, b"n\r")
wait_for(b"You said no.")
wait_for(b"> ")
os.write(fd, b"Once more?\r")
wait_for(b"Allow? [y/N] ")
time.sleep(0.2)
os.write(fd, b"\x03")
wait_for(b"the run was cancelled")
wait_seen(b"cancelling: run_main will not run; the run stops at its next step")
wait_for(b"> ")
os.write(fd, b"/continue\r")
wait_for(b"Allow? [y/N] ")
os.write(fd, b"\x04")
wait_for(b"Nobody answered.")
code = exit_status()
sys.exit(0 if code == 0 else "exit status %r; the terminal showed %r" % (code, everything))
"#;
    if let Err(failure) = drive_chat_pty(&dir, &args, steps) {
        panic!("{failure}");
    }
    let (statuses, decisions) = statuses_and_decisions(&trace);
    assert_eq!(statuses, ["answered", "answered", "cancelled", "answered"]);
    assert_eq!(decisions, ["allowed", "denied", "denied", "denied"]);
}

/// A line that is not UTF-8 is answered with why, and the session goes on.
#[test]
fn a_line_that_is_not_utf8_is_refused_and_the_session_goes_on() {
    let (dir, script) = scene(
        "chat-utf8",
        0,
        vec![answer("First answer."), answer("Second answer.")],
    );
    let out = Command::new(common::bin())
        .arg("chat")
        .arg("--workspace")
        .arg(dir.path().join("ws"))
        .arg("--script")
        .arg(&script)
        .arg("--quiet")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(b"first\n\xff\xfe x\ncaf\xe9\nsecond\n")?;
            }
            child.wait_with_output()
        })
        .expect("chat");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert_eq!(lines[0], "First answer.");
    assert!(
        lines[1].starts_with("this line is not UTF-8 text"),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("this line is not UTF-8 text"),
        "{stdout}"
    );
    assert_eq!(lines[3], "Second answer.");
}
