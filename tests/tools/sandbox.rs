//! `run_main`'s sandbox, with real programs run through the agent with
//! approval: every attack is shown to get through with `Sandbox::Off` (so
//! that the sandbox is what stops it) and to be refused by the default
//! level, `workspace-write`; the demo's program, files in the workspace and
//! the private `TMPDIR` still work, and the `TMPDIR` is gone afterwards.
//!
//! On a kernel that cannot enforce the sandbox the tests say `skipped`
//! (and fail under `SUBLOOP_NO_SKIP`).

use crate::common;
use crate::common::RunDriven;

use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{RecordingModel, TempDir, tool_results};
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::ModelResponse;
use subloop::policy::permission::AllowAll;
use subloop::tools::sandbox::Support;
use subloop::tools::sandbox::{Sandbox, SandboxPolicy};
use subloop::tools::{RunMain, RunSettings};

/// Whether this kernel enforces the default level; says `skipped` when not.
fn enforced() -> bool {
    match Support::probe().missing(Sandbox::WorkspaceWrite) {
        None => true,
        Some(missing) => {
            common::skipped(format!("the sandbox cannot be enforced here: {missing}"));
            false
        }
    }
}

/// A directory holding the workspace `ws`, a directory `outside` it and a
/// fake home `home` with a secret in it.
struct Place {
    _root: TempDir,
    ws: PathBuf,
    outside: PathBuf,
    home: PathBuf,
}

fn place(tag: &str) -> Place {
    let root = TempDir::new(tag);
    root.write("ws/expected.txt", "42\n");
    root.write("outside/.keep", "");
    root.write("home/.ssh/id_ed25519", "SECRET-KEY-MATERIAL\n");
    let canonical = std::fs::canonicalize(root.path()).unwrap();
    Place {
        ws: canonical.join("ws"),
        outside: canonical.join("outside"),
        home: canonical.join("home"),
        _root: root,
    }
}

/// A parent that calls `run_main` once with approval, then answers; the
/// result's text and whether it is an error.
fn run(ws: &Path, policy: SandboxPolicy, main: &str, timeout: Duration) -> (String, bool) {
    std::fs::write(ws.join("main.py"), main).unwrap();
    let tool = RunMain::new(
        ws,
        RunSettings::new(vec!["python3".into(), "main.py".into()]).with_timeout(timeout),
    )
    .unwrap()
    .with_sandbox(policy);
    let mut model = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls([(
            "call-1",
            "run_main",
            json!({}),
        )])),
        Ok(ModelResponse::answer("done")),
    ]);
    let report = AgentBuilder::new(Arc::new(AllowAll))
        .tool(tool)
        .unwrap()
        .build()
        .run_driven("Run the program", Budget::new(4).unwrap(), &mut model)
        .unwrap();
    let mut results = tool_results(&report.outcome.messages);
    assert_eq!(results.len(), 1);
    let (_, text, is_error) = results.remove(0);
    (text, is_error)
}

/// The program's stdout (the result's JSON report, after the
/// `run_main: timed out ...` line if there is one).
fn stdout(text: &str) -> String {
    let json = match text.split_once('\n') {
        Some((first, rest)) if first.starts_with("run_main:") => rest,
        _ => text,
    };
    let report: Value = serde_json::from_str(json).unwrap_or_else(|err| panic!("{err}: {text}"));
    report["stdout"].as_str().unwrap_or_default().to_owned()
}

/// A script whose parent calls `run_main` once and then answers, written
/// to `script.json` in `dir`; its path.
fn run_main_script(dir: &Path) -> PathBuf {
    let script = json!({"parent": [
        {"content": [{"type": "tool_use", "id": "r1", "name": "run_main", "input": {}}], "stop_reason": "tool_use"},
        {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
    ]});
    let path = dir.join("script.json");
    std::fs::write(&path, script.to_string()).unwrap();
    path
}

/// `subloop run --quiet --decision allow --run-timeout 120` on `ws` with
/// `script`, its standard streams closed.
fn subloop_run(ws: &Path, script: &Path) -> Command {
    let mut command = Command::new(common::bin());
    command
        .args([
            "run",
            "--quiet",
            "--decision",
            "allow",
            "--run-timeout",
            "120",
            "--workspace",
        ])
        .arg(ws)
        .arg("--script")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Python that defines `attempt(name, f)`: prints `OK name: <value>` when
/// `f()` gets through, `BLOCKED name: <error>` when it raises `OSError`.
const ATTEMPT: &str = "\
import os, socket, subprocess, sys
def attempt(name, f):
    try:
        print(f'OK {name}: {f()!r}', flush=True)
    except OSError as err:
        print(f'BLOCKED {name}: {err}', flush=True)
";

/// Runs `attempts` (Python after [`ATTEMPT`]) unconfined and then in the
/// default sandbox; the two stdouts. Every line of the first must be `OK`,
/// every line of the second `BLOCKED`.
fn attack(ws: &Path, attempts: &str) -> (String, String) {
    attack_at(ws, attempts, SandboxPolicy::default())
}

/// [`attack`] against the sandbox of `policy`.
fn attack_at(ws: &Path, attempts: &str, policy: SandboxPolicy) -> (String, String) {
    let main = format!("{ATTEMPT}{attempts}");
    let (off, _) = run(
        ws,
        SandboxPolicy::new(Sandbox::Off),
        &main,
        Duration::from_secs(20),
    );
    let off = stdout(&off);
    let (confined, _) = run(ws, policy, &main, Duration::from_secs(20));
    let confined = stdout(&confined);
    assert!(!off.is_empty(), "nothing was attempted");
    for line in off.lines() {
        assert!(
            line.starts_with("OK "),
            "without the sandbox: {line}\n{off}"
        );
    }
    assert_eq!(off.lines().count(), confined.lines().count(), "{confined}");
    for line in confined.lines() {
        assert!(
            line.starts_with("BLOCKED "),
            "the sandbox let this through: {line}\n{confined}"
        );
    }
    (off, confined)
}

/// Every one of the `count` lines of `out` starts with `prefix`.
fn all(out: &str, prefix: &str, count: usize) {
    assert_eq!(out.lines().count(), count, "{out}");
    for line in out.lines() {
        assert!(line.starts_with(prefix), "{line}\n{out}");
    }
}

#[test]
fn writes_outside_the_workspace_are_refused() {
    if !enforced() {
        return;
    }
    let place = place("sbx-write");
    std::os::unix::fs::symlink(&place.outside, place.ws.join("link")).unwrap();
    let outside = place.outside.display();
    let attempts = format!(
        "\
attempt('parent', lambda: open('../outside/parent.txt', 'w').write('x'))
attempt('absolute', lambda: open('{outside}/absolute.txt', 'w').write('x'))
attempt('symlink', lambda: open('link/symlink.txt', 'w').write('x'))
def after_chdir():
    os.chdir('{outside}')
    return open('chdir.txt', 'w').write('x')
attempt('chdir', after_chdir)
attempt('rename', lambda: os.rename('{outside}/.keep', '{outside}/renamed'))
"
    );
    let names = ["parent.txt", "absolute.txt", "symlink.txt", "chdir.txt"];
    let main = format!("{ATTEMPT}{attempts}");
    let (off, _) = run(
        &place.ws,
        SandboxPolicy::new(Sandbox::Off),
        &main,
        Duration::from_secs(20),
    );
    let off = stdout(&off);
    all(&off, "OK ", 5);
    for name in names {
        assert!(place.outside.join(name).exists(), "{name}: {off}");
        std::fs::remove_file(place.outside.join(name)).unwrap();
    }
    std::fs::rename(place.outside.join("renamed"), place.outside.join(".keep")).unwrap();
    let (confined, _) = run(
        &place.ws,
        SandboxPolicy::default(),
        &main,
        Duration::from_secs(20),
    );
    let confined = stdout(&confined);
    all(&confined, "BLOCKED ", 5);
    for name in names {
        assert!(!place.outside.join(name).exists(), "{name}: {confined}");
    }
    assert!(place.outside.join(".keep").exists(), "{confined}");
}

#[test]
fn a_file_under_the_home_directory_is_unreadable() {
    if !enforced() {
        return;
    }
    let place = place("sbx-home");
    let home = place.home.display();
    let attempts = format!(
        "\
attempt('read', lambda: open('{home}/.ssh/id_ed25519').read())
attempt('list', lambda: os.listdir('{home}'))
"
    );
    let (off, confined) = attack(&place.ws, &attempts);
    assert!(off.contains("SECRET-KEY-MATERIAL"), "{off}");
    assert!(!confined.contains("SECRET-KEY-MATERIAL"), "{confined}");
}

#[test]
fn a_tcp_connection_to_loopback_is_refused() {
    if !enforced() {
        return;
    }
    let place = place("sbx-tcp");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let attempts = format!(
        "attempt('connect', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=5).close())\n"
    );
    let main = format!("{ATTEMPT}{attempts}");
    let (off, _) = run(
        &place.ws,
        SandboxPolicy::new(Sandbox::Off),
        &main,
        Duration::from_secs(20),
    );
    assert!(stdout(&off).starts_with("OK "), "{off}");
    assert!(listener.accept().is_ok(), "no connection arrived: {off}");
    let (confined, _) = run(
        &place.ws,
        SandboxPolicy::default(),
        &main,
        Duration::from_secs(20),
    );
    let confined = stdout(&confined);
    all(&confined, "BLOCKED ", 1);
    assert!(confined.contains("Operation not permitted"), "{confined}");
    let pending = listener.accept();
    assert!(
        pending
            .as_ref()
            .is_err_and(|err| err.kind() == ErrorKind::WouldBlock),
        "a connection arrived from the sandbox: {pending:?}"
    );
}

#[test]
fn a_udp_datagram_is_not_sent() {
    if !enforced() {
        return;
    }
    let place = place("sbx-udp");
    let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
    receiver.set_nonblocking(true).unwrap();
    let port = receiver.local_addr().unwrap().port();
    let attempts = format!(
        "attempt('sendto', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'ping', ('127.0.0.1', {port})))\n"
    );
    let main = format!("{ATTEMPT}{attempts}");
    let (off, _) = run(
        &place.ws,
        SandboxPolicy::new(Sandbox::Off),
        &main,
        Duration::from_secs(20),
    );
    let mut buffer = [0u8; 16];
    let got = receiver.recv_from(&mut buffer).map(|(n, _)| n);
    assert_eq!(got.ok(), Some(4), "no datagram arrived: {off}");
    assert_eq!(&buffer[..4], b"ping");
    let (confined, _) = run(
        &place.ws,
        SandboxPolicy::default(),
        &main,
        Duration::from_secs(20),
    );
    let confined = stdout(&confined);
    all(&confined, "BLOCKED ", 1);
    let got = receiver.recv_from(&mut buffer);
    assert!(
        got.as_ref()
            .is_err_and(|err| err.kind() == ErrorKind::WouldBlock),
        "a datagram arrived from the sandbox: {got:?} ({confined})"
    );
}

#[test]
fn a_unix_socket_outside_the_workspace_is_refused() {
    if !enforced() {
        return;
    }
    let place = place("sbx-unix");
    let path = place.outside.join("s.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let attempts = format!(
        "\
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect('{}')
    s.close()
attempt('connect', connect)
attempt('abstract', lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect('\\0subloop-test-none'))
",
        path.display()
    );
    // The abstract name is unbound: unconfined, the connect is refused by
    // the kernel (ConnectionRefusedError is an OSError too, but not OK).
    let main = format!("{ATTEMPT}{attempts}");
    let (off, _) = run(
        &place.ws,
        SandboxPolicy::new(Sandbox::Off),
        &main,
        Duration::from_secs(20),
    );
    let off = stdout(&off);
    assert!(off.starts_with("OK connect"), "{off}");
    assert!(listener.accept().is_ok(), "no connection arrived: {off}");
    let (confined, _) = run(
        &place.ws,
        SandboxPolicy::default(),
        &main,
        Duration::from_secs(20),
    );
    let confined = stdout(&confined);
    assert!(confined.starts_with("BLOCKED connect"), "{confined}");
    assert!(
        confined.contains("BLOCKED abstract: [Errno 1]"),
        "{confined}"
    );
    let pending = listener.accept();
    assert!(
        pending
            .as_ref()
            .is_err_and(|err| err.kind() == ErrorKind::WouldBlock),
        "a connection arrived from the sandbox: {pending:?}"
    );
}

#[test]
fn no_signal_reaches_a_process_outside_the_sandbox() {
    if !enforced() {
        return;
    }
    let place = place("sbx-kill");
    // Signal 0 checks the permission without delivering anything. In its
    // PID namespace the program cannot even name a process outside.
    let attempts = format!(
        "attempt('test', lambda: os.kill({}, 0))\n",
        std::process::id()
    );
    let (_, confined) = attack(&place.ws, &attempts);
    assert!(
        confined.contains("No such process") || confined.contains("Operation not permitted"),
        "{confined}"
    );
}

#[test]
fn the_environment_of_another_process_is_unreadable() {
    if !enforced() {
        return;
    }
    let place = place("sbx-environ");
    let attempts = format!(
        "attempt('environ', lambda: len(open('/proc/{}/environ', 'rb').read()))\n",
        std::process::id()
    );
    attack(&place.ws, &attempts);
    // Process 1 of the program's namespace is a fork of subloop's (the
    // sandbox's init), which holds subloop's environment and memory; it
    // exists only in the sandbox, so there is nothing to compare with.
    let (text, _) = run(
        &place.ws,
        SandboxPolicy::default(),
        &format!(
            "{ATTEMPT}attempt('init', lambda: len(open('/proc/1/environ', 'rb').read()))\n\
             attempt('init-maps', lambda: len(open('/proc/1/maps', 'rb').read()))\n"
        ),
        Duration::from_secs(20),
    );
    let confined = stdout(&text);
    assert_eq!(confined.lines().count(), 2, "{text}");
    assert!(
        confined.lines().all(|line| line.starts_with("BLOCKED ")),
        "{confined}"
    );
}

#[test]
fn a_subprocess_is_confined_too() {
    if !enforced() {
        return;
    }
    let place = place("sbx-child");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp = receiver.local_addr().unwrap().port();
    let socket = place.outside.join("s.sock");
    let _unix = UnixListener::bind(&socket).unwrap();
    let child = format!(
        "{ATTEMPT}\
attempt('write', lambda: open('{outside}/child.txt', 'w').write('x'))
attempt('read', lambda: open('{home}/.ssh/id_ed25519').read())
attempt('tcp', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=5).close())
attempt('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'ping', ('127.0.0.1', {udp})))
attempt('unix', lambda: socket.socket(socket.AF_UNIX).connect('{socket}'))
attempt('kill', lambda: os.kill({pid}, 0))
attempt('environ', lambda: len(open('/proc/{pid}/environ', 'rb').read()))
",
        outside = place.outside.display(),
        home = place.home.display(),
        socket = socket.display(),
        pid = std::process::id(),
    );
    std::fs::write(place.ws.join("attack.py"), child).unwrap();
    // `python3` by name: found on PATH as the program itself was.
    let main = "import subprocess, sys\n\
                out = subprocess.run(['python3', 'attack.py'], capture_output=True, text=True)\n\
                sys.stdout.write(out.stdout)\n";
    let (off, _) = run(
        &place.ws,
        SandboxPolicy::new(Sandbox::Off),
        main,
        Duration::from_secs(20),
    );
    all(&stdout(&off), "OK ", 7);
    std::fs::remove_file(place.outside.join("child.txt")).unwrap();
    let (confined, _) = run(
        &place.ws,
        SandboxPolicy::default(),
        main,
        Duration::from_secs(20),
    );
    all(&stdout(&confined), "BLOCKED ", 7);
    assert!(!place.outside.join("child.txt").exists());
}

#[test]
fn the_program_still_runs_reads_and_writes_where_it_may() {
    if !enforced() {
        return;
    }
    let place = place("sbx-works");
    let main = "\
import os, stat
print(6 * 7)
print(open('expected.txt').read().strip())
open('out.txt', 'w').write('in the workspace')
tmp = os.environ['TMPDIR']
open(os.path.join(tmp, 'scratch.txt'), 'w').write('in the temporary directory')
os.mkdir(os.path.join(tmp, 'locked'))
os.chmod(os.path.join(tmp, 'locked'), 0)
print(tmp)
print(oct(stat.S_IMODE(os.stat(tmp).st_mode)))
print(os.environ['HOME'])
print(os.getcwd())
";
    let (text, is_error) = run(
        &place.ws,
        SandboxPolicy::default(),
        main,
        Duration::from_secs(20),
    );
    assert!(!is_error, "{text}");
    let out = stdout(&text);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert_eq!(lines[..2], ["42", "42"]);
    assert_eq!(
        std::fs::read_to_string(place.ws.join("out.txt")).unwrap(),
        "in the workspace"
    );
    let tmp = Path::new(lines[2]);
    assert!(tmp.starts_with(std::env::temp_dir()), "{out}");
    assert_eq!(lines[3], "0o700");
    assert_eq!(Path::new(lines[4]), place.ws, "HOME is the workspace");
    assert_eq!(Path::new(lines[5]), place.ws);
    assert!(
        !private_dir(tmp).exists(),
        "the private TMPDIR {} is still there",
        tmp.display()
    );
}

/// The `subloop-run-*` directory a program's `TMPDIR` is made in (the
/// `TMPDIR` itself when it is not `tmp` in such a directory): what must be
/// gone, whole, once the program is.
fn private_dir(tmp: &Path) -> PathBuf {
    match tmp.parent() {
        Some(parent)
            if tmp.file_name() == Some("tmp".as_ref())
                && parent
                    .file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("subloop-run-")) =>
        {
            parent.to_path_buf()
        }
        _ => tmp.to_path_buf(),
    }
}

#[test]
fn read_only_keeps_the_workspace_as_it_was() {
    if !enforced() {
        return;
    }
    let place = place("sbx-readonly");
    let main = format!(
        "{ATTEMPT}\
attempt('read', lambda: open('expected.txt').read())
attempt('write', lambda: open('out.txt', 'w').write('x'))
attempt('tmp', lambda: open(os.path.join(os.environ['TMPDIR'], 'f'), 'w').write('x'))
print(os.environ['HOME'] == os.environ['TMPDIR'])
"
    );
    let (text, _) = run(
        &place.ws,
        SandboxPolicy::new(Sandbox::ReadOnly),
        &main,
        Duration::from_secs(20),
    );
    let out = stdout(&text);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("OK read"), "{out}");
    assert!(lines[1].starts_with("BLOCKED write"), "{out}");
    assert!(lines[2].starts_with("OK tmp"), "{out}");
    assert_eq!(lines[3], "True", "HOME is the temporary directory: {out}");
    assert!(!place.ws.join("out.txt").exists());
    // The same program may write in its workspace one level up.
    let (text, _) = run(
        &place.ws,
        SandboxPolicy::new(Sandbox::WorkspaceWrite),
        &main,
        Duration::from_secs(20),
    );
    assert!(stdout(&text).contains("OK write"), "{text}");
}

#[test]
fn a_timed_out_program_leaves_no_temporary_directory() {
    if !enforced() {
        return;
    }
    let place = place("sbx-timeout");
    let main = "\
import os, subprocess, sys
tmp = os.environ['TMPDIR']
open(os.path.join(tmp, 'f'), 'w').write('x')
p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', tmp])
print(tmp, p.pid, flush=True)
while True:
    pass
";
    let started = Instant::now();
    let (text, is_error) = run(
        &place.ws,
        SandboxPolicy::default(),
        main,
        Duration::from_secs(1),
    );
    assert!(is_error && text.contains("timed out"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let out = stdout(&text);
    let (tmp, _) = out.trim().split_once(' ').expect("the TMPDIR and pid");
    assert!(
        !private_dir(Path::new(tmp)).exists(),
        "{tmp} outlived the timeout"
    );
    assert!(
        common::marked_gone_soon(tmp),
        "the sleeping grandchild outlived the timeout"
    );
}

#[test]
fn a_program_outside_the_allowed_directories_does_not_start() {
    if !enforced() {
        return;
    }
    let place = place("sbx-exec");
    let tool_dir = place.home.join("bin");
    std::fs::create_dir_all(&tool_dir).unwrap();
    let tool = tool_dir.join("tool");
    std::fs::write(&tool, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let settings = RunSettings::new(vec![tool.display().to_string()]);
    let output = RunMain::new(&place.ws, settings.clone())
        .unwrap()
        .with_sandbox(SandboxPolicy::new(Sandbox::Off))
        .execute();
    assert!(!output.is_error, "{}", output.content);
    assert_eq!(stdout(&output.content), "ran\n");
    let output = RunMain::new(&place.ws, settings)
        .unwrap()
        .with_sandbox(SandboxPolicy::default());
    let output = output.execute();
    assert!(output.is_error);
    assert!(
        (output.content.contains("Permission denied") || output.content.contains("No such file"))
            && output.content.contains("workspace-write sandbox"),
        "{}",
        output.content
    );
}

/// `subloop run` with a script that calls `run_main` once, `main.py`
/// printing the environment as JSON, the process's environment holding
/// `extra`; the program's environment.
fn cli_environment(extra: &[(&str, &str)], flags: &[&str]) -> serde_json::Map<String, Value> {
    let place = place("sbx-env");
    std::fs::write(
        place.ws.join("main.py"),
        "import json, os\nprint(json.dumps(dict(os.environ)))\n",
    )
    .unwrap();
    let script = json!({"parent": [
        {"content": [{"type": "tool_use", "id": "r1", "name": "run_main", "input": {}}], "stop_reason": "tool_use"},
        {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
    ]});
    let script_path = place.outside.join("script.json");
    std::fs::write(&script_path, script.to_string()).unwrap();
    let mut command = Command::new(common::bin());
    command
        .args([
            "run",
            "--quiet",
            "--json",
            "--decision",
            "allow",
            "--workspace",
        ])
        .arg(&place.ws)
        .arg("--script")
        .arg(&script_path)
        .args(flags)
        .envs(extra.iter().copied())
        .stdin(Stdio::null());
    let output = command.output().expect("run subloop");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "{err}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let content = report["tools"][0]["content"].as_str().unwrap_or_default();
    let printed = stdout(content);
    match serde_json::from_str(&printed) {
        Ok(Value::Object(env)) => env,
        _ => panic!("main.py printed no environment: {content}"),
    }
}

#[test]
fn no_key_token_or_proxy_reaches_the_program_unless_named() {
    if !enforced() {
        return;
    }
    let secrets = [
        ("ANTHROPIC_API_KEY", "sk-ant-test-not-a-real-key"),
        ("OPENAI_API_KEY", "sk-test-not-a-real-key"),
        ("GITHUB_TOKEN", "ghp_not_a_real_token"),
        ("HTTPS_PROXY", "http://127.0.0.1:9"),
        ("LANG", "C.UTF-8"),
    ];
    let off = cli_environment(&secrets, &["--sandbox", "off"]);
    assert_eq!(off["ANTHROPIC_API_KEY"], "sk-ant-test-not-a-real-key");
    assert_eq!(off["GITHUB_TOKEN"], "ghp_not_a_real_token");

    let confined = cli_environment(&secrets, &[]);
    let mut names: Vec<&str> = confined.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["HOME", "LANG", "PATH", "TMPDIR"], "{confined:?}");
    assert_eq!(confined["LANG"], "C.UTF-8");

    let named = cli_environment(
        &secrets,
        &[
            "--sandbox-env",
            "ANTHROPIC_API_KEY",
            "--sandbox-env",
            "NOT_SET_ANYWHERE",
        ],
    );
    assert_eq!(named["ANTHROPIC_API_KEY"], "sk-ant-test-not-a-real-key");
    assert!(!named.contains_key("OPENAI_API_KEY"), "{named:?}");
    assert!(!named.contains_key("NOT_SET_ANYWHERE"), "{named:?}");
}

#[test]
fn the_trace_records_the_level() {
    let place = place("sbx-trace");
    std::fs::write(place.ws.join("main.py"), "print(42)\n").unwrap();
    let script = json!({"parent": [
        {"content": [{"type": "tool_use", "id": "r1", "name": "run_main", "input": {}}], "stop_reason": "tool_use"},
        {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
    ]});
    let script_path = place.outside.join("script.json");
    std::fs::write(&script_path, script.to_string()).unwrap();
    for (flags, level) in [
        (&[][..], "workspace-write"),
        (&["--sandbox", "read-only"][..], "read-only"),
        (&["--sandbox", "off"][..], "off"),
    ] {
        let trace = place.outside.join(format!("{level}.jsonl"));
        let status = Command::new(common::bin())
            .args(["run", "--quiet", "--decision", "allow", "--workspace"])
            .arg(&place.ws)
            .arg("--script")
            .arg(&script_path)
            .arg("--trace")
            .arg(&trace)
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .unwrap();
        let text = std::fs::read_to_string(&trace).unwrap();
        let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["kind"], "request");
        assert_eq!(first["sandbox"], level, "{first}");
        if Support::probe().enforces(Sandbox::WorkspaceWrite) {
            assert!(status.success(), "{level}: {status}");
        }
        // The trace reader accepts it.
        let view = Command::new(common::bin())
            .args(["view", "--check"])
            .arg(&trace)
            .output()
            .unwrap();
        assert!(
            view.status.success(),
            "{}",
            String::from_utf8_lossy(&view.stderr)
        );
    }
}

/// Starts `subloop run` on a program that writes its `TMPDIR` to the
/// workspace and sleeps; the child and the private directory that
/// `TMPDIR` is in, once it exists.
fn start_sleeping(place: &Place) -> (std::process::Child, PathBuf) {
    // Something to remove: nested directories, files, a symlink to a
    // directory outside (which must be left alone).
    std::fs::write(
        place.ws.join("main.py"),
        format!(
            "import os, time\n\
             tmp = os.environ['TMPDIR']\n\
             os.makedirs(os.path.join(tmp, 'a', 'b', 'c'))\n\
             for d in ['', 'a', 'a/b', 'a/b/c']:\n\
             \x20   for i in range(40):\n\
             \x20       open(os.path.join(tmp, d, f'file-{{i:03}}.txt'), 'w').write('x' * i)\n\
             os.symlink('{}', os.path.join(tmp, 'a', 'outside'))\n\
             open('tmpdir.tmp', 'w').write(tmp)\n\
             os.rename('tmpdir.tmp', 'tmpdir')\n\
             time.sleep(60)\n",
            place.outside.display()
        ),
    )
    .unwrap();
    let mut command = subloop_run(&place.ws, &run_main_script(&place.outside));
    let child = common::default_signals(&mut command).spawn().unwrap();
    let marker = place.ws.join("tmpdir");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the program did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let tmp = private_dir(Path::new(&std::fs::read_to_string(&marker).unwrap()));
    assert!(tmp.exists(), "{}", tmp.display());
    (child, tmp)
}

#[test]
fn a_signal_that_ends_subloop_removes_the_temporary_directory() {
    if !enforced() {
        return;
    }
    let place = place("sbx-sigterm");
    let (mut child, tmp) = start_sleeping(&place);
    // SAFETY: kill(2) on the child this test started.
    unsafe {
        libc::kill(i32::try_from(child.id()).unwrap(), libc::SIGTERM);
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    assert!(!tmp.exists(), "{} outlived SIGTERM", tmp.display());
    assert!(place.outside.join(".keep").exists());
}

/// `SIGKILL` runs nothing in subloop: the watchdog sees its pipe close and
/// has the directory removed once the program's group is gone.
#[test]
fn a_sigkill_of_subloop_removes_the_temporary_directory_too() {
    if !enforced() {
        return;
    }
    let place = place("sbx-sigkill");
    let (mut child, tmp) = start_sleeping(&place);
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tmp.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !tmp.exists(),
        "{} outlived a SIGKILL of subloop",
        tmp.display()
    );
    assert!(
        place.outside.join(".keep").exists(),
        "the cleaner followed a symlink"
    );
}

/// Starts `subloop run`, in a session of its own, on a program that builds
/// a tree 1,000 directories deep in its `TMPDIR` (files at every level, a
/// directory at mode 000 halfway, symlinks to a file and a directory outside
/// at the bottom), writes the `TMPDIR` to the workspace and sleeps; the
/// child and the private directory that `TMPDIR` is in, once the tree is
/// built.
fn start_deep(place: &Place) -> (std::process::Child, PathBuf) {
    std::fs::write(
        place.ws.join("main.py"),
        format!(
            "import os, time\n\
             tmp = os.environ['TMPDIR']\n\
             fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)\n\
             for depth in range(1000):\n\
             \x20   for i in range(3):\n\
             \x20       f = os.open(f'file-{{i}}', os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)\n\
             \x20       os.write(f, b'x' * i)\n\
             \x20       os.close(f)\n\
             \x20   if depth == 500:\n\
             \x20       os.mkdir('sealed', dir_fd=fd)\n\
             \x20       os.mkdir('sealed/inner', dir_fd=fd)\n\
             \x20       os.chmod('sealed', 0, dir_fd=fd)\n\
             \x20   os.mkdir('d', dir_fd=fd)\n\
             \x20   inner = os.open('d', os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)\n\
             \x20   os.close(fd)\n\
             \x20   fd = inner\n\
             os.symlink('{outside}/.keep', 'to-file', dir_fd=fd)\n\
             os.symlink('{outside}', 'to-dir', dir_fd=fd)\n\
             open('tmpdir.tmp', 'w').write(tmp)\n\
             os.rename('tmpdir.tmp', 'tmpdir')\n\
             time.sleep(60)\n",
            outside = place.outside.display()
        ),
    )
    .unwrap();
    let mut command = subloop_run(&place.ws, &run_main_script(&place.outside));
    common::default_signals(&mut command);
    // A session of its own: every process subloop starts (the watchdog, its
    // cleaner, the program) can be found by it afterwards.
    // SAFETY: setsid(2) in the forked child before exec; async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::setsid();
            Ok(())
        });
    }
    let child = command.spawn().unwrap();
    let marker = place.ws.join("tmpdir");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the program did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let tmp = private_dir(Path::new(&std::fs::read_to_string(&marker).unwrap()));
    assert!(tmp.exists(), "{} is missing", tmp.display());
    (child, tmp)
}

/// The processes of session `session` still running (not zombies); the
/// zombies among them that are this process's children (it may be a child
/// subreaper) are reaped.
fn running_in_session(session: libc::pid_t) -> Vec<libc::pid_t> {
    let mut running = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return running;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp session ...`; comm may hold anything.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(state), Some(parent), Some(sid)) = (fields.first(), fields.get(1), fields.get(3))
        else {
            continue;
        };
        if sid.parse::<libc::pid_t>().ok() != Some(session) {
            continue;
        }
        if *state == "Z" {
            if parent.parse::<u32>().ok() == Some(std::process::id()) {
                let mut status = 0;
                // SAFETY: waitpid(2) on a zombie child of ours that this test started.
                unsafe {
                    libc::waitpid(pid, &mut status, libc::WNOHANG);
                }
            }
            continue;
        }
        running.push(pid);
    }
    running
}

/// A program can build a tree deeper than any fixed limit in its `TMPDIR`:
/// after a `SIGKILL` of subloop, the cleaner still removes all of it
/// promptly (the directory at mode 000 too, the symlinks' targets not) and
/// exits, leaving nothing of subloop's running.
#[test]
fn a_sigkill_of_subloop_removes_a_1000_deep_temporary_directory_and_the_cleaner_exits() {
    if !enforced() {
        return;
    }
    let place = place("sbx-sigkill-deep");
    let (mut child, tmp) = start_deep(&place);
    let session = libc::pid_t::try_from(child.id()).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tmp.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone = !tmp.exists();
    let mut left = running_in_session(session);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = running_in_session(session);
    }
    for pid in &left {
        // SAFETY: kill(2) on a process of the session this test started,
        // so that a cleaner that failed does not outlive the test.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    if !gone {
        // What is left of the tree goes now (`rm` follows no symlink); not
        // asserted, the assertion below is the finding.
        let _ = Command::new("rm").arg("-rf").arg(&tmp).status();
    }
    assert!(gone, "{} outlived a SIGKILL of subloop", tmp.display());
    assert!(left.is_empty(), "still running after 30 s: {left:?}");
    assert!(
        place.outside.join(".keep").exists(),
        "the cleaner followed a symlink"
    );
}

crate::async_twins!(
    writes_outside_the_workspace_are_refused,
    a_file_under_the_home_directory_is_unreadable,
    a_tcp_connection_to_loopback_is_refused,
    a_udp_datagram_is_not_sent,
    a_unix_socket_outside_the_workspace_is_refused,
    no_signal_reaches_a_process_outside_the_sandbox,
    the_environment_of_another_process_is_unreadable,
    a_subprocess_is_confined_too,
    the_program_still_runs_reads_and_writes_where_it_may,
    read_only_keeps_the_workspace_as_it_was,
    a_timed_out_program_leaves_no_temporary_directory,
);

/// A process of the test's own, outside any sandbox, for the program to
/// aim at; killed on drop.
struct Bystander(std::process::Child);

impl Bystander {
    fn start() -> Self {
        Self(
            Command::new("sleep")
                .arg("60")
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `prlimit` of another process (how a program could kill subloop:
/// `RLIMIT_FSIZE` 0 kills it at its next write) and of the process
/// subloop runs in.
#[test]
fn the_program_cannot_set_the_limits_of_another_process() {
    if !enforced() {
        return;
    }
    let place = place("sbx-prlimit");
    let bystander = Bystander::start();
    let attempts = format!(
        "import resource\n\
         attempt('bystander', lambda: resource.prlimit({}, resource.RLIMIT_CORE, (0, 0)))\n\
         attempt('test', lambda: resource.prlimit({}, resource.RLIMIT_CORE))\n",
        bystander.pid(),
        std::process::id()
    );
    let (_, confined) = attack(&place.ws, &attempts);
    assert!(confined.contains("No such process"), "{confined}");
}

/// A descriptor subloop inherited without close-on-exec (`7>>file` in a
/// shell) does not reach the program, at any level.
#[test]
fn no_inherited_descriptor_reaches_the_program() {
    if !enforced() {
        return;
    }
    let place = place("sbx-fd");
    let outside = place.outside.join("leak.txt");
    let path = std::ffi::CString::new(outside.to_str().unwrap()).unwrap();
    // SAFETY: open(2) of our own file, without O_CLOEXEC on purpose.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            0o600,
        )
    };
    assert!(fd > 2);
    let main = format!("{ATTEMPT}attempt('fd', lambda: os.write({fd}, b'leaked'))\n");
    // The attack is real: a program started without subloop gets it.
    let direct = Command::new("python3")
        .args(["-c", &main])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&direct.stdout).starts_with("OK fd"),
        "{direct:?}"
    );
    for policy in [SandboxPolicy::new(Sandbox::Off), SandboxPolicy::default()] {
        let (text, _) = run(&place.ws, policy, &main, Duration::from_secs(20));
        assert!(stdout(&text).starts_with("BLOCKED fd"), "{text}");
    }
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "leaked");
}

/// System V shared memory of another process (0600, the same user).
#[test]
fn system_v_ipc_of_another_process_is_out_of_reach() {
    if !enforced() {
        return;
    }
    let place = place("sbx-ipc");
    // SAFETY: shmget(2) makes a private segment, removed below.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600) };
    assert!(id >= 0);
    let attempts = format!(
        "import ctypes\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.shmat.restype = ctypes.c_void_p\n\
         def shm():\n    at = libc.shmat({id}, None, 0)\n    \
         if at in (None, ctypes.c_void_p(-1).value):\n        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n    \
         return ctypes.string_at(at, 4)\n\
         attempt('shm', shm)\n"
    );
    let result = std::panic::catch_unwind(|| attack(&place.ws, &attempts));
    // SAFETY: removes the segment made above.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    let (_, confined) = result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert!(confined.contains("Invalid argument"), "{confined}");
}

/// A key in the user's kernel keyring.
#[test]
fn the_kernel_keyring_is_out_of_reach() {
    if !enforced() {
        return;
    }
    let place = place("sbx-key");
    // SAFETY: add_key(2) with NUL-terminated strings and a payload we own.
    let key = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            c"subloop-test-key".as_ptr(),
            b"KEYRING-SECRET".as_ptr(),
            14usize,
            -4i32, // KEY_SPEC_USER_KEYRING
        )
    };
    if key < 0 {
        common::skipped("no kernel keyring here");
        return;
    }
    let attempts = format!(
        "import ctypes\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def read():\n    buf = ctypes.create_string_buffer(64)\n    \
         n = libc.syscall({}, 11, {key}, buf, 64)\n    \
         if n < 0:\n        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n    \
         return buf.raw[:n]\n\
         attempt('key', read)\n",
        libc::SYS_keyctl
    );
    let result = std::panic::catch_unwind(|| attack(&place.ws, &attempts));
    // SAFETY: keyctl(KEYCTL_INVALIDATE) of the key made above.
    unsafe { libc::syscall(libc::SYS_keyctl, 21i32, key) };
    let (off, _) = result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert!(off.contains("KEYRING-SECRET"), "{off}");
}

/// inotify on a folder outside (it would show the names of its entries
/// as they change).
#[test]
fn inotify_sees_nothing_outside() {
    if !enforced() {
        return;
    }
    let place = place("sbx-inotify");
    let attempts = format!(
        "import ctypes\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def watch(path):\n    fd = libc.inotify_init()\n    \
         w = libc.inotify_add_watch(fd, path.encode(), 0xfff)\n    \
         if w < 0:\n        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n    \
         return w\n\
         attempt('outside', lambda: watch({:?}))\n\
         attempt('home', lambda: watch({:?}))\n",
        place.outside.display().to_string(),
        place.home.display().to_string()
    );
    attack(&place.ws, &attempts);
}

/// `read-only` keeps metadata too: mode, times, extended attributes.
#[test]
fn read_only_changes_no_metadata_in_the_workspace() {
    if !enforced() {
        return;
    }
    let place = place("sbx-ro-meta");
    let target = place.ws.join("expected.txt");
    let before = std::fs::metadata(&target).unwrap();
    let attempts = "\
attempt('chmod', lambda: os.chmod('expected.txt', 0o777))
attempt('utime', lambda: os.utime('expected.txt', (0, 0)))
attempt('xattr', lambda: os.setxattr('expected.txt', 'user.planted', b'x'))
";
    attack_at(&place.ws, attempts, SandboxPolicy::new(Sandbox::ReadOnly));
    // The run without the sandbox changed them; put them back, then run
    // confined once more and check nothing moved.
    std::fs::set_permissions(&target, before.permissions()).unwrap();
    let _ = Command::new("setfattr")
        .args(["-x", "user.planted"])
        .arg(&target)
        .status();
    let (text, _) = run(
        &place.ws,
        SandboxPolicy::new(Sandbox::ReadOnly),
        &format!("{ATTEMPT}{attempts}"),
        Duration::from_secs(20),
    );
    assert!(!stdout(&text).contains("OK "), "{text}");
    let after = std::fs::metadata(&target).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(before.mode(), after.mode());
}

/// `TMPDIR` holds data, not programs: nothing written there runs.
#[test]
fn nothing_runs_from_tmpdir() {
    if !enforced() {
        return;
    }
    let place = place("sbx-tmp-exec");
    let attempts = "\
import stat, tempfile
def run_from_tmp():
    path = os.path.join(tempfile.gettempdir(), f'tool-{os.getpid()}')
    with open(path, 'w') as f:
        f.write('#!/bin/sh\\necho ran\\n')
    os.chmod(path, 0o755)
    try:
        return subprocess.run([path], capture_output=True).stdout
    finally:
        os.unlink(path)
attempt('exec', run_from_tmp)
";
    attack(&place.ws, attempts);
}

/// Root's private files (`/etc/shadow`, keys under `/etc/ssl/private`)
/// and set-uid changes of root's programs, when subloop runs as root.
#[test]
fn roots_private_files_and_programs_are_out_of_reach() {
    if !enforced() {
        return;
    }
    if !is_root() {
        common::skipped("subloop does not run as root here");
        return;
    }
    let place = place("sbx-root");
    let mut attempts = String::from(
        "attempt('shadow', lambda: len(open('/etc/shadow').read()))\n\
         attempt('chmod-system', lambda: os.chmod('/usr/bin/env', os.stat('/usr/bin/env').st_mode & 0o7777))\n",
    );
    if Path::new("/etc/gshadow").exists() {
        attempts.push_str("attempt('gshadow', lambda: len(open('/etc/gshadow').read()))\n");
    }
    let outside_program = place.outside.join("tool");
    std::fs::write(&outside_program, "#!/bin/sh\n").unwrap();
    attempts.push_str(&format!(
        "attempt('setuid', lambda: os.chmod({:?}, 0o4755))\n",
        outside_program.display().to_string()
    ));
    attack(&place.ws, &attempts);
    let mode = std::fs::metadata(&outside_program).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o4000,
        0o4000
    );
}

/// Code that runs outside the sandbox cannot be planted from inside:
/// git's configuration, a protected hook script (and its folder), an MCP
/// configuration the program creates.
#[test]
fn protected_files_in_the_workspace_cannot_be_planted() {
    if !enforced() {
        return;
    }
    let place = place("sbx-plant");
    std::fs::create_dir_all(place.ws.join(".git")).unwrap();
    std::fs::write(place.ws.join(".git/config"), "[core]\n").unwrap();
    std::fs::create_dir_all(place.ws.join("hooks")).unwrap();
    std::fs::write(place.ws.join("hooks/guard.sh"), "#!/bin/sh\nexit 0\n").unwrap();
    let attempts = "\
attempt('git-config', lambda: open('.git/config', 'a').write('fsmonitor = ./evil\\n'))
attempt('hook', lambda: open('hooks/guard.sh', 'w').write('evil'))
attempt('hook-rename', lambda: os.rename('hooks', 'hooks-moved'))
attempt('git-rename', lambda: os.rename('.git', 'git-moved'))
";
    let policy = SandboxPolicy::default().protect("hooks/guard.sh");
    // Unconfined, each attempt changes the workspace: undo them between runs.
    let main = format!("{ATTEMPT}{attempts}");
    let (off, _) = run(
        &place.ws,
        SandboxPolicy::new(Sandbox::Off),
        &main,
        Duration::from_secs(20),
    );
    assert!(
        stdout(&off).lines().all(|line| line.starts_with("OK ")),
        "{off}"
    );
    let _ = std::fs::rename(place.ws.join("hooks-moved"), place.ws.join("hooks"));
    let _ = std::fs::rename(place.ws.join("git-moved"), place.ws.join(".git"));
    std::fs::write(place.ws.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(place.ws.join("hooks/guard.sh"), "#!/bin/sh\nexit 0\n").unwrap();
    let (confined, _) = run(&place.ws, policy.clone(), &main, Duration::from_secs(20));
    let confined = stdout(&confined);
    assert_eq!(confined.lines().count(), 4, "{confined}");
    assert!(
        confined.lines().all(|line| line.starts_with("BLOCKED ")),
        "{confined}"
    );
    assert_eq!(
        std::fs::read_to_string(place.ws.join(".git/config")).unwrap(),
        "[core]\n"
    );
    // A protected file that does not exist yet, made by the program, is
    // removed when it ends; the rest of what it wrote stays.
    let (text, _) = run(
        &place.ws,
        policy,
        "open('.mcp.json', 'w').write('{}')\nopen('out.txt', 'w').write('kept')\n\
         open('.git/description', 'w').write('kept')\nopen('hooks/notes.txt', 'w').write('kept')\n",
        Duration::from_secs(20),
    );
    assert!(!place.ws.join(".mcp.json").exists(), "{text}");
    assert!(text.contains(".mcp.json"), "{text}");
    // A protected path that is a symbolic link (which the program could
    // replace, or which would lead the sandbox's mounts elsewhere) makes
    // the call refuse to start anything.
    std::os::unix::fs::symlink("/etc/hostname", place.ws.join(".envrc")).unwrap();
    let (refused, is_error) = run(
        &place.ws,
        SandboxPolicy::default(),
        "open('ran.txt', 'w').write('ran')\n",
        Duration::from_secs(20),
    );
    assert!(is_error && refused.contains("symbolic link"), "{refused}");
    assert!(!place.ws.join("ran.txt").exists());
    std::fs::remove_file(place.ws.join(".envrc")).unwrap();
    // Beside the protected paths, the folders on their way stay the
    // program's to write.
    for kept in ["out.txt", ".git/description", "hooks/notes.txt"] {
        assert_eq!(
            std::fs::read_to_string(place.ws.join(kept)).unwrap_or_default(),
            "kept",
            "{kept}: {text}"
        );
    }
}

/// The same sandbox for a subloop that does not run as root (a user
/// namespace first): run as `nobody`, with a bystander of the same user.
#[test]
fn an_unprivileged_subloop_confines_its_program_the_same_way() {
    use std::os::unix::process::CommandExt;
    if !enforced() {
        return;
    }
    if !is_root() {
        common::skipped("switching to an unprivileged user needs root");
        return;
    }
    const NOBODY: u32 = 65534;
    // Under /tmp, not the suite's TMPDIR (which may be root's alone).
    let root = PathBuf::from(format!("/tmp/subloop-unpriv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("ws")).unwrap();
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _remove = Remove(root.clone());
    let binary = root.join("subloop");
    std::fs::copy(common::bin(), &binary).unwrap();
    let as_nobody = |command: &mut Command| {
        // SAFETY: setgroups/setresgid/setresuid in the forked child.
        unsafe {
            command.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(NOBODY, NOBODY, NOBODY) != 0
                    || libc::setresuid(NOBODY, NOBODY, NOBODY) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    };
    let mut sleeper = Command::new("sleep");
    sleeper.arg("60").stdin(Stdio::null());
    as_nobody(&mut sleeper);
    let mut bystander = Bystander(sleeper.spawn().unwrap());
    let main = format!(
        "{ATTEMPT}\
import resource
attempt('prlimit', lambda: resource.prlimit({pid}, resource.RLIMIT_CORE, (0, 0)))
attempt('kill', lambda: os.kill({pid}, 0))
attempt('environ', lambda: open('/proc/{pid}/environ', 'rb').read())
attempt('tcp', lambda: socket.create_connection(('127.0.0.1', 9), timeout=2))
attempt('write', lambda: open('written.txt', 'w').write('x'))
",
        pid = bystander.pid()
    );
    std::fs::write(root.join("ws/main.py"), &main).unwrap();
    run_main_script(&root);
    for path in [
        root.clone(),
        root.join("ws"),
        root.join("ws/main.py"),
        root.join("script.json"),
    ] {
        std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut subloop = Command::new(&binary);
    subloop
        .args([
            "run",
            "--quiet",
            "--json",
            "--decision",
            "allow",
            "--workspace",
        ])
        .arg(root.join("ws"))
        .arg("--script")
        .arg(root.join("script.json"))
        .env("TMPDIR", &root)
        .env("HOME", &root)
        .stdin(Stdio::null());
    as_nobody(&mut subloop);
    let output = subloop.output().unwrap();
    let json: Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|err| panic!("{err}: {output:?}"));
    let results = json.to_string();
    let _ = bystander.0.kill();
    let _ = bystander.0.wait();
    for name in ["prlimit", "kill", "environ", "tcp"] {
        assert!(
            results.contains(&format!("BLOCKED {name}")),
            "{name}: {results}"
        );
    }
    assert!(results.contains("OK write"), "{results}");
    assert!(root.join("ws/written.txt").exists());
}
