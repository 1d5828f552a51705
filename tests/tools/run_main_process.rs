//! `run_main` with real processes: the permission gate, timeouts that kill the
//! whole process group, output caps, closed stdin and start failures.

use crate::common;
use crate::common::RunDriven;

use common::tool_results;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{RecordingModel, TempDir};
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::ModelResponse;
use subloop::StatusKind;
use subloop::core::call::CallDecision;
use subloop::core::conversation::ToolOutput;
use subloop::policy::permission::{AllowAll, Approver, DenyAll};
use subloop::tools::{RunMain, RunSettings};

/// A parent that calls `run_main` once and then answers.
fn run_main_once(approver: Arc<dyn Approver>, tool: RunMain) -> subloop::RunReport {
    let mut model = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls([(
            "call-1",
            "run_main",
            json!({}),
        )])),
        Ok(ModelResponse::answer("done")),
    ]);
    AgentBuilder::new(approver)
        .tool(tool)
        .unwrap()
        .build()
        .run_driven("Run the program", Budget::new(4).unwrap(), &mut model)
        .unwrap()
}

fn settings(command: &[&str], timeout: Duration) -> RunSettings {
    RunSettings::new(command.iter().map(|word| (*word).to_owned()).collect()).with_timeout(timeout)
}

fn python(timeout: Duration) -> RunSettings {
    settings(&["python3", "main.py"], timeout)
}

/// The JSON report of a result (after the `run_main: timed out ...` line, if any).
fn report(output: &ToolOutput) -> Value {
    let json = match output.content.split_once('\n') {
        Some((first, rest)) if first.starts_with("run_main:") => rest,
        _ => output.content.as_str(),
    };
    serde_json::from_str(json).unwrap_or_else(|err| panic!("{err}: {:?}", output.content))
}

#[test]
fn a_denied_run_main_does_not_start_the_program() {
    let ws = TempDir::new("rm-deny");
    ws.write("main.py", "open('marker', 'w').write('ran')\nprint(42)\n");
    let tool = RunMain::new(ws.path(), python(Duration::from_secs(10))).unwrap();
    let report = run_main_once(Arc::new(DenyAll), tool);

    assert_eq!(report.outcome.status, StatusKind::Answered);
    let results = tool_results(&report.outcome.messages);
    assert_eq!(
        results,
        vec![(
            "call-1".to_owned(),
            "not executed: permission denied".to_owned(),
            true
        )]
    );
    assert_eq!(report.tools.len(), 1);
    assert_eq!(report.tools[0].decision, CallDecision::Denied);
    assert!(report.tools[0].is_error);
    // Give a (wrongly) started program time to write its marker.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!ws.path().join("marker").exists(), "the program ran");
}

#[test]
fn an_allowed_run_main_runs_the_program() {
    let ws = TempDir::new("rm-allow");
    ws.write("main.py", "open('marker', 'w').write('ran')\nprint(42)\n");
    let tool = RunMain::new(ws.path(), python(Duration::from_secs(10))).unwrap();
    let report = run_main_once(Arc::new(AllowAll), tool);

    let results = tool_results(&report.outcome.messages);
    assert_eq!(results.len(), 1);
    let (id, text, is_error) = &results[0];
    assert_eq!(id, "call-1");
    assert!(!is_error, "{text}");
    let body: Value = serde_json::from_str(text).unwrap();
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["stdout"], "42\n");
    assert_eq!(body["stderr"], "");
    assert_eq!(body["stdout_bytes_dropped"], 0);
    assert_eq!(report.tools[0].decision, CallDecision::Allowed);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("marker")).unwrap(),
        "ran"
    );
}

#[test]
fn an_endless_loop_is_killed_after_the_timeout() {
    let ws = TempDir::new("rm-loop");
    ws.write(
        "main.py",
        "print('start', flush=True)\nwhile True:\n    pass\n",
    );
    let tool = RunMain::new(ws.path(), python(Duration::from_secs(1))).unwrap();
    let started = Instant::now();
    let output = tool.execute();
    let elapsed = started.elapsed();

    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(2000), "{elapsed:?}");
    assert!(output.is_error);
    assert!(
        output.content.starts_with("run_main: timed out after 1 s"),
        "{}",
        output.content
    );
    let body = report(&output);
    assert_eq!(body["signal"], libc::SIGKILL);
    assert_eq!(body["exit_code"], Value::Null);
    assert!(body["error"].as_str().unwrap().contains("timed out"));
}

#[test]
fn a_sleeping_grandchild_is_killed_with_the_group() {
    let ws = TempDir::new("rm-grandchild");
    ws.write(
        "main.py",
        "import os, subprocess, sys, time\n\
         p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', os.getcwd()])\n\
         with open('grandchild.pid', 'w') as f:\n    f.write(str(p.pid))\n\
         while True:\n    time.sleep(0.05)\n",
    );
    let tool = RunMain::new(ws.path(), python(Duration::from_secs(2))).unwrap();
    let started = Instant::now();
    let output = tool.execute();
    let elapsed = started.elapsed();

    assert!(elapsed < Duration::from_millis(3000), "{elapsed:?}");
    assert!(output.is_error);
    assert!(output.content.contains("timed out"), "{}", output.content);
    std::fs::read_to_string(ws.path().join("grandchild.pid"))
        .expect("main.py wrote the grandchild's pid within the timeout");
    let marker = ws.path().display().to_string();
    assert!(
        common::marked_gone_soon(&marker),
        "the grandchild outlived the call"
    );
}

#[test]
fn a_grandchild_outliving_a_quick_main_does_not_block_the_call() {
    let ws = TempDir::new("rm-orphan");
    // The grandchild inherits stdout and stderr, keeping the pipes open.
    ws.write(
        "main.py",
        "import os, subprocess, sys\n\
         p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', os.getcwd()])\n\
         with open('grandchild.pid', 'w') as f:\n    f.write(str(p.pid))\n\
         print('bye')\n",
    );
    let tool = RunMain::new(ws.path(), python(Duration::from_secs(20))).unwrap();
    let started = Instant::now();
    let output = tool.execute();
    let elapsed = started.elapsed();

    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert!(!output.is_error, "{}", output.content);
    let body = report(&output);
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["stdout"], "bye\n");
    std::fs::read_to_string(ws.path().join("grandchild.pid")).unwrap();
    let marker = ws.path().display().to_string();
    assert!(
        common::marked_gone_soon(&marker),
        "the grandchild outlived the call"
    );
}

#[test]
fn a_100_mb_output_is_capped_and_counted() {
    let ws = TempDir::new("rm-flood");
    let cap = 64 * 1024;
    let tool = RunMain::new(
        ws.path(),
        RunSettings::new(vec![
            "sh".into(),
            "-c".into(),
            "head -c 100000000 /dev/zero; head -c 3000 /dev/zero >&2".into(),
        ])
        .with_timeout(Duration::from_secs(60))
        .with_output_cap(cap),
    )
    .unwrap();
    let output = tool.execute();
    assert!(!output.is_error, "{}", &output.content[..200]);
    let body = report(&output);
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["stdout"].as_str().unwrap().len(), cap);
    assert_eq!(body["stdout_bytes_dropped"], 100_000_000 - cap as u64);
    assert_eq!(body["stderr"].as_str().unwrap().len(), 3000);
    assert_eq!(body["stderr_bytes_dropped"], 0);
}

#[test]
fn a_python_flood_on_both_streams_is_capped() {
    let ws = TempDir::new("rm-pyflood");
    ws.write(
        "main.py",
        "import sys\n\
         chunk = b'x' * (1 << 20)\n\
         for _ in range(100):\n    sys.stdout.buffer.write(chunk)\n\
         sys.stdout.flush()\n\
         sys.stderr.buffer.write(b'e' * 5000)\n",
    );
    let cap = 1000;
    let tool = RunMain::new(
        ws.path(),
        python(Duration::from_secs(60)).with_output_cap(cap),
    )
    .unwrap();
    let output = tool.execute();
    let body = report(&output);
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "x".repeat(cap));
    assert_eq!(
        body["stdout_bytes_dropped"],
        100 * (1u64 << 20) - cap as u64
    );
    assert_eq!(body["stderr"], "e".repeat(cap));
    assert_eq!(body["stderr_bytes_dropped"], 5000 - cap as u64);
}

#[test]
fn stdin_is_closed() {
    let ws = TempDir::new("rm-stdin");
    ws.write(
        "main.py",
        "import sys\ndata = sys.stdin.read()\nprint(repr(data))\n",
    );
    let tool = RunMain::new(ws.path(), python(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    let output = tool.execute();
    assert!(!output.is_error, "{}", output.content);
    assert_eq!(report(&output)["stdout"], "''\n");
    assert!(started.elapsed() < Duration::from_secs(9));

    let tool = RunMain::new(
        ws.path(),
        settings(&["sh", "-c", "cat; echo eof"], Duration::from_secs(10)),
    )
    .unwrap();
    let output = tool.execute();
    assert!(!output.is_error, "{}", output.content);
    assert_eq!(report(&output)["stdout"], "eof\n");
}

#[test]
fn a_missing_interpreter_is_an_error_saying_not_found() {
    let ws = TempDir::new("rm-missing");
    ws.write("main.py", "print(1)\n");
    let tool = RunMain::new(
        ws.path(),
        settings(
            &["no-such-interpreter-xyz", "main.py"],
            Duration::from_secs(5),
        ),
    )
    .unwrap();
    let output = tool.execute();
    assert!(output.is_error);
    assert!(
        output.content.contains("no-such-interpreter-xyz"),
        "{}",
        output.content
    );
    assert!(output.content.contains("not found"), "{}", output.content);
}

#[test]
fn a_nonzero_exit_is_an_error_with_the_code() {
    let ws = TempDir::new("rm-exit");
    ws.write(
        "main.py",
        "import sys\nprint('partial')\nprint('oops', file=sys.stderr)\nsys.exit(3)\n",
    );
    let tool = RunMain::new(ws.path(), python(Duration::from_secs(10))).unwrap();
    let output = tool.execute();
    assert!(output.is_error);
    let body = report(&output);
    assert_eq!(body["exit_code"], 3);
    assert_eq!(body["signal"], Value::Null);
    assert_eq!(body["stdout"], "partial\n");
    assert_eq!(body["stderr"], "oops\n");
    assert!(body.get("error").is_none(), "{body}");
}

#[test]
fn the_program_runs_in_the_workspace() {
    let ws = TempDir::new("rm-cwd");
    let tool = RunMain::new(ws.path(), settings(&["pwd"], Duration::from_secs(10))).unwrap();
    let output = tool.execute();
    let body = report(&output);
    let expected = std::fs::canonicalize(ws.path()).unwrap();
    assert_eq!(
        body["stdout"].as_str().unwrap().trim_end(),
        expected.to_str().unwrap()
    );
}

#[test]
fn split_command_handles_quotes() {
    assert_eq!(
        RunSettings::split_command("python3 main.py").unwrap(),
        ["python3", "main.py"]
    );
    assert_eq!(
        RunSettings::split_command("  python3   -u\t'my main.py'  ").unwrap(),
        ["python3", "-u", "my main.py"]
    );
    assert_eq!(
        RunSettings::split_command(r#"sh -c "echo \"hi\" \\ there""#).unwrap(),
        ["sh", "-c", r#"echo "hi" \ there"#]
    );
    assert_eq!(
        RunSettings::split_command(r#"a\ b 'c'd"e f"g"#).unwrap(),
        ["a b", "cde fg"]
    );
    assert_eq!(RunSettings::split_command("run ''").unwrap(), ["run", ""]);
    // A shell would expand these; split_command keeps them literally.
    assert_eq!(
        RunSettings::split_command("echo $HOME; rm *").unwrap(),
        ["echo", "$HOME;", "rm", "*"]
    );
}

#[test]
fn split_command_rejects_unbalanced_quotes_and_empty_lines() {
    for line in [
        "python3 'main.py",
        "python3 \"main.py",
        "python3 \"main.py\\\"",
        "python3 main.py\\",
        "",
        "   \t ",
    ] {
        assert!(
            RunSettings::split_command(line).is_err(),
            "{line:?} was accepted"
        );
    }
    assert!(
        RunMain::new(
            std::path::Path::new("."),
            settings(&[], Duration::from_secs(1))
        )
        .is_err()
    );
}

#[test]
fn an_escaped_grandchild_holding_the_pipes_does_not_block_the_call() {
    let ws = TempDir::new("rm-escaped");
    // A new session: the group kill cannot reach it, and it keeps stdout open.
    ws.write(
        "main.py",
        "import subprocess\n\
         print('bye', flush=True)\n\
         p = subprocess.Popen(['sleep', '30'], start_new_session=True)\n\
         with open('escaped.pid', 'w') as f:\n    f.write(str(p.pid))\n",
    );
    let tool = RunMain::new(ws.path(), python(Duration::from_secs(20))).unwrap();
    let started = Instant::now();
    let output = tool.execute();
    let elapsed = started.elapsed();
    let pid: i32 = std::fs::read_to_string(ws.path().join("escaped.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // This test started it (indirectly); end it by its id.
    // SAFETY: kill(2) on one pid; no memory is touched.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }

    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert!(!output.is_error, "{}", output.content);
    let body = report(&output);
    assert_eq!(body["exit_code"], 0);
    // What main printed before exiting is kept.
    assert_eq!(body["stdout"], "bye\n");
}

crate::async_twins!(
    a_denied_run_main_does_not_start_the_program,
    an_allowed_run_main_runs_the_program,
    an_endless_loop_is_killed_after_the_timeout,
    a_sleeping_grandchild_is_killed_with_the_group,
    a_grandchild_outliving_a_quick_main_does_not_block_the_call,
    a_100_mb_output_is_capped_and_counted,
    a_python_flood_on_both_streams_is_capped,
    stdin_is_closed,
    a_missing_interpreter_is_an_error_saying_not_found,
    a_nonzero_exit_is_an_error_with_the_code,
    the_program_runs_in_the_workspace,
    split_command_handles_quotes,
    split_command_rejects_unbalanced_quotes_and_empty_lines,
    an_escaped_grandchild_holding_the_pipes_does_not_block_the_call,
);
