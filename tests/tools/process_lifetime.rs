//! The programs `run_main` starts do not outlive subloop: `SIGKILL`,
//! `SIGTERM`, `SIGHUP` and Ctrl-C of the CLI, with real processes.
//!
//! This test binary makes itself a child subreaper, so the programs orphaned
//! by a killed subloop become its children and can be reaped here: a group
//! then counts as gone when `kill(-pgid, 0)` fails with `ESRCH`.

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TempDir;
use serde_json::{Value, json};

/// Orphans of our descendants are reparented to this process.
fn become_subreaper() {
    // SAFETY: prctl(2) with an integer argument; affects only this process.
    let done = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(done, 0, "PR_SET_CHILD_SUBREAPER");
}

/// A script whose parent runs `run_main` once and then answers.
fn run_main_script(dir: &TempDir) -> PathBuf {
    let script = json!({"parent": [
        {"content": [{"type": "tool_use", "id": "r1", "name": "run_main", "input": {}}], "stop_reason": "tool_use"},
        {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
    ]});
    dir.write("script.json", script.to_string())
}

/// A `main.py` that forks a sleeping grandchild, writes `pgid pid grandchild`
/// to `pids` and then loops forever.
const BUSY_MAIN: &str = "\
import os, time
child = os.fork()
if child == 0:
    time.sleep(120)
    os._exit(0)
with open('pids.tmp', 'w') as f:
    f.write(f'{os.getpgid(0)} {os.getpid()} {child}\\n')
os.rename('pids.tmp', 'pids')
while True:
    pass
";

/// Starts `subloop run` on `ws` with the run_main script, allowed, quiet.
fn start(ws: &TempDir, outside: &TempDir, command: &str, trace: Option<&Path>) -> Child {
    let script = run_main_script(outside);
    let mut cmd = Command::new(common::bin());
    cmd.args([
        "run",
        "--quiet",
        "--decision",
        "allow",
        "--run-timeout",
        "120",
        "--run-command",
        command,
        "--workspace",
    ])
    .arg(ws.path())
    .arg("--script")
    .arg(&script);
    if let Some(trace) = trace {
        cmd.arg("--trace").arg(trace);
    }
    common::default_signals(&mut cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn subloop")
}

/// Waits for `pids` in the workspace (the program has started), then finds
/// the program's group and processes from outside: a sandboxed program
/// runs in a PID namespace of its own and cannot tell its host pid or
/// group. (pgid, pids of the program and its grandchild).
fn wait_for_pids(ws: &TempDir, subloop: &Child) -> (libc::pid_t, Vec<libc::pid_t>) {
    let path = ws.path().join("pids");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if path.exists() {
            // Every descendant (the sandbox's own processes too) is
            // returned, to be reaped once orphaned to this subreaper.
            let all = common::descendants(subloop.id() as libc::pid_t);
            let program = all
                .iter()
                .find(|(_, _, comm)| comm.starts_with("python") || comm == "sleep");
            if let Some((_, pgid, _)) = program {
                return (*pgid, all.iter().map(|(pid, _, _)| *pid).collect());
            }
        }
        assert!(Instant::now() < deadline, "the program did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls until no process of `pgid` remains (reaping `pids` and the group
/// leader as they die); the time it took, or `None` after `limit`.
fn group_gone_within(pgid: libc::pid_t, pids: &[libc::pid_t], limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    loop {
        for &pid in pids.iter().chain([&pgid]) {
            let mut status = 0;
            // SAFETY: waitpid(2) with WNOHANG on a pid that is (or becomes) our child.
            unsafe {
                libc::waitpid(pid, &mut status, libc::WNOHANG);
            }
        }
        // SAFETY: signal 0 only checks whether the group exists.
        let gone = unsafe { libc::kill(-pgid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            return Some(started.elapsed());
        }
        if started.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills whatever is left of a group (so a failing test leaves nothing behind).
fn cleanup(pgid: libc::pid_t) {
    // SAFETY: kill(2) of a group this test started.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: signals the child we spawned.
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
}

/// Collects a child's stderr on a thread.
fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let mut pipe = child.stderr.take().expect("stderr piped");
    let sink = Arc::clone(&text);
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    text
}

fn last_trace_line(trace: &Path) -> Value {
    let text = std::fs::read_to_string(trace).expect("trace");
    serde_json::from_str(text.lines().last().expect("a line")).expect("json line")
}

#[test]
fn sigkill_of_subloop_takes_the_programs_group_with_it() {
    become_subreaper();
    let ws = TempDir::new("life-kill");
    let outside = TempDir::new("life-kill-out");
    ws.write("main.py", BUSY_MAIN);
    let mut child = start(&ws, &outside, "python3 main.py", None);
    let (pgid, pids) = wait_for_pids(&ws, &child);
    signal(&child, libc::SIGKILL);
    let killed = Instant::now();
    let _ = child.wait();
    let gone = group_gone_within(pgid, &pids, Duration::from_secs(5));
    cleanup(pgid);
    let took = gone.unwrap_or_else(|| {
        panic!(
            "the program's group {pgid} outlived a SIGKILL of subloop by {:?}",
            killed.elapsed()
        )
    });
    eprintln!("group gone {took:?} after SIGKILL");
}

#[test]
fn sigterm_kills_the_group_writes_the_outcome_and_exits_143() {
    become_subreaper();
    let ws = TempDir::new("life-term");
    let outside = TempDir::new("life-term-out");
    ws.write("main.py", BUSY_MAIN);
    let trace = outside.path().join("trace.jsonl");
    let mut child = start(&ws, &outside, "python3 main.py", Some(&trace));
    let (pgid, pids) = wait_for_pids(&ws, &child);
    signal(&child, libc::SIGTERM);
    let status = child.wait().expect("wait");
    let gone = group_gone_within(pgid, &pids, Duration::from_secs(5));
    cleanup(pgid);
    assert_eq!(status.code(), Some(143), "{status:?}");
    assert!(gone.is_some(), "the program's group outlived SIGTERM");
    let last = last_trace_line(&trace);
    assert_eq!(last["agent"], "parent");
    assert_eq!(last["kind"], "outcome");
    assert_eq!(last["status"], "cancelled");
    assert!(
        last["text"]
            .as_str()
            .unwrap_or_default()
            .contains("SIGTERM"),
        "{last}"
    );
    assert_eq!(last["calls"], 1, "{last}");
}

#[test]
fn sighup_of_the_demo_removes_its_temporary_workspace_and_exits_129() {
    become_subreaper();
    let cwd = TempDir::new("life-hup-cwd");
    let tmp = TempDir::new("life-hup-tmp");
    let mut child = common::default_signals(&mut Command::new(common::bin()))
        .args([
            "demo",
            "--quiet",
            "--decision",
            "allow",
            "--run-timeout",
            "120",
            "--run-command",
            "sh -c 'echo $$ > started; exec sleep 120'",
        ])
        .current_dir(cwd.path())
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn demo");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (workspace, pgid, pids) = loop {
        let found = std::fs::read_dir(tmp.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .find(|path| path.join("started").is_file());
        if let Some(dir) = found {
            // The program's group, seen from outside its PID namespace.
            let sleeping = common::descendants(child.id() as libc::pid_t)
                .into_iter()
                .find(|(_, _, comm)| comm == "sleep");
            if let Some((_, pgid, _)) = sleeping {
                let all = common::descendants(child.id() as libc::pid_t);
                break (
                    dir,
                    pgid,
                    all.iter().map(|(pid, _, _)| *pid).collect::<Vec<_>>(),
                );
            }
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not run its program"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    signal(&child, libc::SIGHUP);
    let status = child.wait().expect("wait");
    let gone = group_gone_within(pgid, &pids, Duration::from_secs(5));
    cleanup(pgid);
    assert_eq!(status.code(), Some(129), "{status:?}");
    assert!(gone.is_some(), "the program's group outlived SIGHUP");
    assert!(
        !workspace.exists(),
        "the temporary workspace {} was left behind",
        workspace.display()
    );
}

#[test]
fn the_first_ctrl_c_says_what_it_waits_for_and_the_second_still_ends_the_trace() {
    become_subreaper();
    let ws = TempDir::new("life-int");
    let outside = TempDir::new("life-int-out");
    ws.write("main.py", BUSY_MAIN);
    let trace = outside.path().join("trace.jsonl");
    let mut child = start(&ws, &outside, "python3 main.py", Some(&trace));
    let stderr = collect_stderr(&mut child);
    let (pgid, pids) = wait_for_pids(&ws, &child);
    signal(&child, libc::SIGINT);
    let expected = "cancelling: waiting for run_main to finish (Ctrl-C again to stop it now)";
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stderr.lock().unwrap().contains(expected) {
        if Instant::now() > deadline {
            signal(&child, libc::SIGKILL);
            cleanup(pgid);
            panic!("no cancelling line on stderr: {:?}", stderr.lock().unwrap());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&child, libc::SIGINT);
    let status = child.wait().expect("wait");
    let gone = group_gone_within(pgid, &pids, Duration::from_secs(5));
    cleanup(pgid);
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(
        gone.is_some(),
        "the program's group outlived a double Ctrl-C"
    );
    let lines = stderr.lock().unwrap().matches(expected).count();
    assert_eq!(lines, 1, "{:?}", stderr.lock().unwrap());
    let last = last_trace_line(&trace);
    assert_eq!(
        (&last["agent"], &last["kind"], &last["status"]),
        (&json!("parent"), &json!("outcome"), &json!("cancelled")),
        "{last}"
    );
    assert!(
        last["text"]
            .as_str()
            .unwrap_or_default()
            .contains("a second Ctrl-C"),
        "{last}"
    );
}

#[test]
fn a_program_that_finishes_leaves_no_watchdog_and_no_group_behind() {
    become_subreaper();
    let ws = TempDir::new("life-normal");
    let outside = TempDir::new("life-normal-out");
    ws.write(
        "main.py",
        "import os, time\nopen('pids', 'w').write('started')\n\
         while not os.path.exists('go'):\n    time.sleep(0.01)\nprint(42)\n",
    );
    let child = start(&ws, &outside, "python3 main.py", None);
    let (pgid, _) = wait_for_pids(&ws, &child);
    ws.write("go", "");
    let output = child.wait_with_output().expect("wait");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // subloop reaped everything itself: nothing was left to reparent to us.
    // SAFETY: signal 0 only checks whether the group exists.
    let alive = unsafe { libc::kill(-pgid, 0) } == 0;
    cleanup(pgid);
    assert!(
        !alive,
        "the group {pgid} (or its watchdog) outlived the run"
    );
    let mut status = 0;
    // SAFETY: waitpid(2) with WNOHANG: is any orphan of the run ours to reap?
    let orphan = unsafe { libc::waitpid(pgid, &mut status, libc::WNOHANG) };
    assert!(orphan <= 0, "the watchdog {pgid} was orphaned, not reaped");
}

#[test]
fn the_library_reaps_the_watchdog_after_each_run() {
    use subloop::tools::{RunMain, RunSettings};
    let ws = TempDir::new("life-lib");
    ws.write("main.py", "import os\nprint(os.getpgid(0), os.getpid())\n");
    let tool = RunMain::new(ws.path(), RunSettings::default()).expect("tool");
    for _ in 0..3 {
        let output = tool.execute();
        assert!(!output.is_error, "{}", output.content);
        let report: Value = serde_json::from_str(&output.content).expect("json");
        let stdout = report["stdout"].as_str().unwrap_or_default().to_owned();
        let pgid: libc::pid_t = stdout
            .split_whitespace()
            .next()
            .and_then(|word| word.parse().ok())
            .expect("pgid");
        // The group is killed and its leader reaped before execute returns.
        assert!(
            !Path::new(&format!("/proc/{pgid}")).exists(),
            "the group leader {pgid} was not reaped"
        );
    }
}

/// A `main.py` that writes `pids` (its group, itself) and waits for a file
/// `go`, then prints `ran` and exits.
const WAITING_MAIN: &str = "\
import os, time
with open('pids.tmp', 'w') as f:
    f.write(f'{os.getpgid(0)} {os.getpid()}\\n')
os.rename('pids.tmp', 'pids')
while not os.path.exists('go'):
    time.sleep(0.01)
print('ran')
";

#[test]
fn a_sighup_ignored_at_start_stays_ignored_as_under_nohup() {
    use std::os::unix::process::CommandExt;
    become_subreaper();
    let ws = TempDir::new("life-nohup");
    let outside = TempDir::new("life-nohup-out");
    ws.write("main.py", WAITING_MAIN);
    let script = run_main_script(&outside);
    let mut cmd = Command::new(common::bin());
    cmd.args([
        "run",
        "--quiet",
        "--decision",
        "allow",
        "--run-timeout",
        "120",
    ])
    .arg("--workspace")
    .arg(ws.path())
    .arg("--script")
    .arg(&script)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    // SAFETY: signal(2) in the forked child before exec, as `nohup` does.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn subloop");
    let (pgid, _) = wait_for_pids(&ws, &child);
    signal(&child, libc::SIGHUP);
    // Time for a handled SIGHUP to end the run (it would, within milliseconds).
    std::thread::sleep(Duration::from_millis(300));
    ws.write("go", "");
    let mut stdout = String::new();
    if let Some(mut pipe) = child.stdout.take() {
        let _ = pipe.read_to_string(&mut stdout);
    }
    let status = child.wait().expect("wait");
    cleanup(pgid);
    assert_eq!(
        status.code(),
        Some(0),
        "the ignored SIGHUP ended the run: {status:?}"
    );
    assert_eq!(stdout, "done\n");
}
