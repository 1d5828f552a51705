//! What the CLI does with its output channels: closed pipes and full disks
//! end without a panic, a terminal never receives raw escape sequences or
//! hidden bidi characters from the model, and piped stdout is byte-exact.

use crate::common;

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::TempDir;
use serde_json::{Value, json};

/// A hostile final answer: an escape sequence, a carriage return, a bidi
/// override and a zero-width space.
const HOSTILE: &str = "ok\u{1b}[2J\r\u{202e}evil\u{200b}!";

fn script(dir: &TempDir, replies: Vec<Value>) -> PathBuf {
    dir.write("script.json", json!({"parent": replies}).to_string())
}

fn answer(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"})
}

fn run_main_then_answer() -> Vec<Value> {
    vec![
        json!({"content": [{"type": "tool_use", "id": "r1", "name": "run_main", "input": {}}], "stop_reason": "tool_use"}),
        answer("done"),
    ]
}

/// `subloop run --workspace WS --script SCRIPT ARGS...`, not yet spawned.
fn subloop(ws: &TempDir, script: &PathBuf, args: &[&str]) -> Command {
    let mut command = Command::new(common::bin());
    command
        .arg("run")
        .arg("--workspace")
        .arg(ws.path())
        .arg("--script")
        .arg(script)
        .args(args)
        .stdin(Stdio::null());
    command
}

/// A pipe whose read end is already closed: every write gets `EPIPE`.
fn broken_pipe() -> OwnedFd {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    writer.into()
}

fn dev_full() -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full")
}

/// Waits for the child at most `limit`; kills it and fails after that.
fn output_within(mut child: std::process::Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("subloop did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A pseudo-terminal: (master, slave).
fn pty() -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty(3) writes two descriptors; the name and settings are optional.
    let done = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(done, 0, "openpty");
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// Everything written to a pty until its slave side is closed.
fn read_master(master: OwnedFd) -> Vec<u8> {
    let mut file = std::fs::File::from(master);
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            // EIO: the slave side is closed.
            Err(_) => break,
        }
    }
    bytes
}

#[test]
fn a_closed_stdout_pipe_ends_quietly() {
    let ws = TempDir::new("out-epipe");
    let script = script(&ws, vec![answer("hello")]);
    for extra in [&["--json"][..], &[][..]] {
        let output = subloop(&ws, &script, extra)
            .stdout(broken_pipe())
            .stderr(Stdio::piped())
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{extra:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{stderr}"
        );
    }
}

#[test]
fn a_reader_that_stops_after_one_byte_is_not_an_error() {
    // `subloop run --json | head -c1` with an output larger than a pipe's buffer.
    let ws = TempDir::new("out-head");
    let script = script(&ws, vec![answer(&"x".repeat(300_000))]);
    let mut child = subloop(&ws, &script, &["--json", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("one byte");
    drop(stdout);
    let output = output_within(child, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(first, *b"{");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn a_full_disk_on_stdout_is_one_line_and_exit_1() {
    let ws = TempDir::new("out-full");
    let script = script(&ws, vec![answer("hello")]);
    for extra in [&["--json", "--quiet"][..], &["--quiet"][..]] {
        let output = subloop(&ws, &script, extra)
            .stdout(dev_full())
            .stderr(Stdio::piped())
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("subloop: cannot write the output: No space left on device"),
            "{stderr}"
        );
    }
}

#[test]
fn ask_with_a_broken_stderr_denies_instead_of_panicking() {
    let ws = TempDir::new("out-ask");
    ws.write("main.py", "open('marker', 'w').write('ran')\n");
    let script = script(&ws, run_main_then_answer());
    // stdin is not a terminal: the explanation cannot be written either.
    let output = subloop(&ws, &script, &["--decision", "ask", "--json"])
        .stderr(dev_full())
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let json: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(json["tools"][0]["decision"], "denied", "{json}");
    assert!(!ws.path().join("marker").exists(), "the program ran");
}

#[test]
fn ask_on_a_terminal_with_a_broken_stderr_denies_without_waiting_for_an_answer() {
    let ws = TempDir::new("out-ask-tty");
    ws.write("main.py", "open('marker', 'w').write('ran')\n");
    let script = script(&ws, run_main_then_answer());
    // stdin is a terminal nobody types on: reading it would block forever.
    let (master, slave) = pty();
    let child = subloop(&ws, &script, &["--decision", "ask", "--json"])
        .stdin(slave)
        .stdout(Stdio::piped())
        .stderr(broken_pipe())
        .spawn()
        .expect("spawn");
    let output = output_within(child, Duration::from_secs(20));
    drop(master);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let json: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(json["tools"][0]["decision"], "denied", "{json}");
    assert!(!ws.path().join("marker").exists(), "the program ran");
}

#[test]
fn a_terminal_stdout_gets_the_answer_escaped() {
    let ws = TempDir::new("out-tty");
    let script = script(&ws, vec![answer(&format!("{HOSTILE}\nsecond line"))]);
    let (master, slave) = pty();
    let child = subloop(&ws, &script, &["--quiet"])
        .stdout(slave)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = output_within(child, Duration::from_secs(20));
    let shown = String::from_utf8(read_master(master)).expect("utf-8");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // The terminal turns each line break into CR LF.
    assert_eq!(
        shown,
        "ok\\u{1b}[2J\\r\\u{202e}evil\\u{200b}!\r\nsecond line\r\n"
    );
}

#[test]
fn a_terminal_stdout_gets_json_with_hidden_characters_escaped() {
    let ws = TempDir::new("out-tty-json");
    let script = script(&ws, vec![answer(HOSTILE)]);
    let (master, slave) = pty();
    let child = subloop(&ws, &script, &["--quiet", "--json"])
        .stdout(slave)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = output_within(child, Duration::from_secs(20));
    let shown = String::from_utf8(read_master(master)).expect("utf-8");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(
        !shown
            .chars()
            .any(|c| matches!(c, '\u{1b}' | '\u{202e}' | '\u{200b}')),
        "{shown:?}"
    );
    let json: Value = serde_json::from_str(shown.trim_end()).expect("still JSON");
    assert_eq!(json["text"], HOSTILE);
}

#[test]
fn a_piped_stdout_gets_the_answer_byte_for_byte() {
    let ws = TempDir::new("out-pipe");
    let text = format!("{HOSTILE}\n\ttab\u{feff}");
    let script = script(&ws, vec![answer(&text)]);
    let output = subloop(&ws, &script, &["--quiet"]).output().expect("run");
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(output.stdout, format!("{text}\n").into_bytes());
}

#[test]
fn stderr_shows_bidi_and_zero_width_characters_escaped() {
    let ws = TempDir::new("out-stderr");
    let script = script(
        &ws,
        vec![
            json!({"content": [{"type": "tool_use", "id": "t\u{202e}1", "name": "read_\u{200b}file", "input": {}}], "stop_reason": "tool_use"}),
            answer("done"),
        ],
    );
    let output = subloop(&ws, &script, &[]).output().expect("run");
    let stderr = String::from_utf8(output.stderr).expect("utf-8");
    assert!(
        !stderr.contains('\u{202e}') && !stderr.contains('\u{200b}'),
        "{stderr}"
    );
    assert!(
        stderr.contains("read_\\u{200b}file (t\\u{202e}1)"),
        "{stderr}"
    );
}

#[test]
fn a_usage_error_echoing_script_text_is_one_escaped_line() {
    let ws = TempDir::new("out-usage");
    let script = ws.write(
        "script.json",
        json!({"parent": [answer("done")], "x\u{1b}[2J\n[parent] forged\u{202e}": 1}).to_string(),
    );
    let output = subloop(&ws, &script, &[]).output().expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).expect("utf-8");
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\u{202e}'),
        "{stderr:?}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.contains("x\\u{1b}[2J\\n[parent] forged\\u{202e}"),
        "{stderr:?}"
    );
}

/// Runs the answer script with `--trace TRACE`; the script lives in `outside`.
fn traced(ws: &TempDir, script: &PathBuf, trace: &std::path::Path, extra: &[&str]) -> Output {
    let child = subloop(ws, script, &["--quiet"])
        .arg("--trace")
        .arg(trace)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // A FIFO must not block the open: a generous bound, not a timing test.
    output_within(child, Duration::from_secs(20))
}

fn assert_refused(output: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{what}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
    assert!(
        stderr.starts_with("subloop: the trace file"),
        "{what}: {stderr}"
    );
    assert!(output.stdout.is_empty(), "{what}: nothing runs");
}

#[test]
fn a_trace_onto_the_script_or_into_the_workspace_is_refused_and_nothing_is_touched() {
    let ws = TempDir::new("trace-ws");
    let outside = TempDir::new("trace-out");
    let main = ws.write("main.py", "print(42)\n");
    let script = script(&outside, vec![answer("hello")]);
    let script_text = std::fs::read(&script).unwrap();

    let output = traced(&ws, &script, &script, &[]);
    assert_refused(&output, "the script");
    assert!(String::from_utf8_lossy(&output.stderr).contains("is the script"));
    assert_eq!(std::fs::read(&script).unwrap(), script_text);

    let output = traced(&ws, &script, &main, &[]);
    assert_refused(&output, "main.py");
    assert!(String::from_utf8_lossy(&output.stderr).contains("inside the workspace"));
    assert_eq!(std::fs::read(&main).unwrap(), b"print(42)\n");

    ws.write("sub/keep", "");
    let fresh = ws.path().join("sub").join("..").join("trace.jsonl");
    let output = traced(&ws, &script, &fresh, &[]);
    assert_refused(&output, "a new file in the workspace");
    assert!(!ws.path().join("trace.jsonl").exists(), "created anyway");

    // A symbolic link outside that leads into the workspace.
    let link = outside.path().join("link.jsonl");
    std::os::unix::fs::symlink(&main, &link).unwrap();
    let output = traced(&ws, &script, &link, &[]);
    assert_refused(&output, "a link to main.py");
    assert_eq!(std::fs::read(&main).unwrap(), b"print(42)\n");

    // A hard link outside of a workspace file.
    let hard = outside.path().join("hard.jsonl");
    std::fs::hard_link(&main, &hard).unwrap();
    let output = traced(&ws, &script, &hard, &[]);
    assert_refused(&output, "a hard link of main.py");
    assert_eq!(std::fs::read(&main).unwrap(), b"print(42)\n");

    // The script given under another name (a symbolic link to it).
    let alias = outside.path().join("alias.json");
    std::os::unix::fs::symlink(&script, &alias).unwrap();
    let output = traced(&ws, &script, &alias, &[]);
    assert_refused(&output, "the script under another name");
    assert_eq!(std::fs::read(&script).unwrap(), script_text);
}

#[test]
fn a_trace_onto_a_fifo_is_refused_without_blocking() {
    let ws = TempDir::new("trace-fifo");
    let outside = TempDir::new("trace-fifo-out");
    let script = script(&outside, vec![answer("hello")]);
    let fifo = outside.path().join("trace.fifo");
    let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    let output = traced(&ws, &script, &fifo, &[]);
    assert_refused(&output, "a FIFO");
    assert!(String::from_utf8_lossy(&output.stderr).contains("a FIFO"));
}

#[test]
fn a_trace_to_dev_null_or_a_fresh_file_outside_is_fine() {
    let ws = TempDir::new("trace-ok");
    let outside = TempDir::new("trace-ok-out");
    let script = script(&outside, vec![answer("hello")]);
    let output = traced(&ws, &script, std::path::Path::new("/dev/null"), &[]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // An existing trace outside is replaced, not appended to.
    let trace = outside.write("trace.jsonl", "old line\n".repeat(100));
    let output = traced(&ws, &script, &trace, &[]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(!text.contains("old line"), "{text}");
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["kind"], "outcome");
}

#[test]
fn a_failed_trace_write_is_reported_once_and_exits_1_even_when_answered() {
    let ws = TempDir::new("trace-full");
    let outside = TempDir::new("trace-full-out");
    let script = script(
        &outside,
        vec![
            json!({"content": [{"type": "tool_use", "id": "t1", "name": "todo_write", "input": {"items": []}}], "stop_reason": "tool_use"}),
            answer("hello"),
        ],
    );
    let output = traced(&ws, &script, std::path::Path::new("/dev/full"), &["--json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.matches("writing the trace failed").count(),
        1,
        "{stderr}"
    );
    let json: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(json["status"], "answered");
    let warnings = json["warnings"].as_array().expect("warnings");
    assert_eq!(warnings.len(), 1, "{json}");
    assert_eq!(warnings[0]["agent"], "parent");
    let text = warnings[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("/dev/full") && text.contains("incomplete"),
        "{text}"
    );
}
