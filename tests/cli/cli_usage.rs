//! The command line as a newcomer meets it: a help per subcommand, the
//! version, and usage errors in one style — one line on stderr, exit 2,
//! nothing run, ending with the hint to the right `--help`.

use crate::common;

use std::process::{Command, Output, Stdio};

use common::{MARKER, TempDir, marker_workspace};

fn subloop(args: &[&str]) -> Output {
    Command::new(common::bin())
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("stderr is UTF-8")
}

/// Exit 2, nothing on stdout, and exactly `subloop: {message} (see `{help}`)` on stderr.
fn assert_usage_error(args: &[&str], message: &str, help: &str) {
    let output = subloop(args);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{args:?}: {}",
        stderr(&output)
    );
    assert_eq!(stdout(&output), "", "{args:?}");
    assert_eq!(
        stderr(&output),
        format!("subloop: {message} (see `{help}`)\n"),
        "{args:?}"
    );
}

// ------------------------------------------------------------------ help

#[test]
fn each_subcommand_prints_its_own_help() {
    let top = subloop(&["--help"]);
    let demo = subloop(&["demo", "--help"]);
    let run = subloop(&["run", "--help"]);
    for output in [&top, &demo, &run] {
        assert_eq!(output.status.code(), Some(0));
        assert_eq!(stderr(output), "");
    }
    let (top, demo, run) = (stdout(&top), stdout(&demo), stdout(&run));
    assert_ne!(top, demo);
    assert_ne!(demo, run);
    assert_ne!(top, run);
    assert!(top.contains("subloop help [COMMAND]"), "{top}");
    assert!(top.contains("subloop run --workspace DIR --script FILE [OPTIONS]"));
    assert!(top.contains("subloop run --workspace DIR --live [OPTIONS]"));
    assert!(demo.starts_with("subloop demo: "), "{demo}");
    assert!(demo.contains("subloop demo --live [OPTIONS]"), "{demo}");
    assert!(demo.contains("EXAMPLES:\n    subloop demo --decision allow"));
    assert!(!demo.contains("--script"), "demo takes no --script: {demo}");
    assert!(run.starts_with("subloop run: "), "{run}");
    assert!(run.contains("--question TEXT"), "{run}");
    assert!(
        run.contains("EXAMPLES:\n    subloop run --workspace"),
        "{run}"
    );

    assert_eq!(stdout(&subloop(&["help"])), top);
    assert_eq!(stdout(&subloop(&["-h"])), top);
    assert_eq!(stdout(&subloop(&["help", "demo"])), demo);
    assert_eq!(stdout(&subloop(&["help", "run"])), run);
    assert_eq!(stdout(&subloop(&["run", "-h"])), run);
    // The overview lists `help` as a command, so it has a help of its own: the overview.
    for args in [&["help", "help"][..], &["help", "--help"], &["help", "-h"]] {
        let output = subloop(args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        assert_eq!(stdout(&output), top, "{args:?}");
    }
}

/// The help text of the option `name` (e.g. `--script FILE`) in `help`, its
/// wrapped lines joined by single spaces.
fn option_help(help: &str, name: &str) -> String {
    let mut lines = help
        .lines()
        .skip_while(|line| !line.trim_start().starts_with(name));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no {name} in {help}"));
    let rest = lines.take_while(|line| line.starts_with("                 "));
    std::iter::once(first.trim_start().trim_start_matches(name))
        .chain(rest)
        .flat_map(str::split_whitespace)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_script_flag_says_when_it_is_required_for_run_and_chat() {
    let run = stdout(&subloop(&["run", "--help"]));
    let script = option_help(&run, "--script FILE");
    assert!(
        script.ends_with("(required unless --live or --resume)"),
        "{script}"
    );
    let chat = stdout(&subloop(&["chat", "--help"]));
    let script = option_help(&chat, "--script FILE");
    assert!(!script.contains("required"), "{script}");
    assert!(script.contains("the demo's"), "{script}");
    // And it is true: chat without --script or --live answers on the demo model.
    let mut child = Command::new(common::bin())
        .args(["chat", "--decision", "deny", "--quiet"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run subloop chat");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(b"Check main.py against expected.txt.\n")
            .expect("a question");
    }
    let output = child
        .wait_with_output()
        .expect("chat ends at the end of input");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!stdout(&output).trim().is_empty(), "{}", stderr(&output));
}

#[test]
fn the_version_is_printed_by_both_spellings() {
    let version = format!("subloop {}\n", env!("CARGO_PKG_VERSION"));
    for args in [&["--version"][..], &["-V"], &["demo", "--version"]] {
        let output = subloop(args);
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        assert_eq!(stdout(&output), version, "{args:?}");
    }
}

// -------------------------------------------------------------- messages

#[test]
fn value_errors_say_what_the_flag_takes() {
    let demo = "subloop demo --help";
    assert_usage_error(
        &["demo", "--deadline", "0"],
        "--deadline takes seconds, more than 0 and at most 86400, got `0`",
        demo,
    );
    assert_usage_error(
        &["demo", "--run-timeout", "86401"],
        "--run-timeout takes seconds, more than 0 and at most 86400, got `86401`",
        demo,
    );
    assert_usage_error(
        &["demo", "--max-calls", "-1"],
        "--max-calls takes a positive whole number, got `-1`",
        demo,
    );
    assert_usage_error(
        &["demo", "--max-calls", "0"],
        "--max-calls takes a positive whole number, got `0`",
        demo,
    );
    assert_usage_error(
        &["demo", "--child-calls", "9"],
        "--child-calls takes a whole number from 1 to 8, got `9`",
        demo,
    );
    assert_usage_error(
        &["demo", "--decision", "maybe"],
        "--decision takes allow, deny or ask, got `maybe`",
        demo,
    );
    assert_usage_error(
        &["demo", "--run-command", "python3 'main.py"],
        "--run-command takes a command line, got `python3 'main.py`: unclosed single quote",
        demo,
    );
    assert_usage_error(
        &["demo", "--run-command", "  "],
        "--run-command takes a command line, got `  `: the command is empty",
        demo,
    );
    assert_usage_error(
        &["demo", "--max-delegations", "-1"],
        "--max-delegations takes a whole number, 0 or more, got `-1`",
        demo,
    );
    assert_usage_error(
        &["demo", "--decision"],
        "--decision needs a value: --decision allow|deny|ask",
        demo,
    );
    assert_usage_error(
        &["demo", "--json=yes"],
        "--json takes no value, got `yes`",
        demo,
    );
}

#[test]
fn the_read_limit_error_names_its_cap_and_no_workspace() {
    for value in ["0", "1073741825"] {
        assert_usage_error(
            &["demo", "--read-limit", value],
            &format!("--read-limit takes a byte count from 1 to 1073741824 (1 GiB), got `{value}`"),
            "subloop demo --help",
        );
    }
    let output = subloop(&["demo", "--read-limit", "1073741824", "--quiet"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn a_flag_given_twice_is_an_error() {
    assert_usage_error(
        &["demo", "--max-calls", "3", "--max-calls", "4"],
        "--max-calls given twice",
        "subloop demo --help",
    );
    assert_usage_error(
        &["demo", "--json", "--quiet", "--json"],
        "--json given twice",
        "subloop demo --help",
    );
    assert_usage_error(
        &[
            "run",
            "--workspace",
            ".",
            "--workspace",
            ".",
            "--script",
            "x",
        ],
        "--workspace given twice",
        "subloop run --help",
    );
}

#[test]
fn flags_and_commands_in_the_wrong_place() {
    assert_usage_error(
        &["demo", "--script", "x.json"],
        "`subloop demo` takes no --script (it is a flag of `subloop run` and `subloop chat`)",
        "subloop demo --help",
    );
    assert_usage_error(
        &["demo", "--frobnicate"],
        "unknown flag `--frobnicate`",
        "subloop demo --help",
    );
    assert_usage_error(
        &["demo", "extra"],
        "unexpected argument `extra`",
        "subloop demo --help",
    );
    assert_usage_error(
        &["frobnicate"],
        "unknown command `frobnicate`: use `subloop demo`, `subloop run`, `subloop replay` or `subloop help`",
        "subloop --help",
    );
    assert_usage_error(
        &[],
        "no command: use `subloop demo`, `subloop run`, `subloop replay`, `subloop chat` or `subloop view`",
        "subloop --help",
    );
    assert_usage_error(
        &["--json", "demo"],
        "--json goes after the command: `subloop demo --json` or `subloop run --json`",
        "subloop --help",
    );
    assert_usage_error(
        &["demo", "--model", "m"],
        "--model goes with --live",
        "subloop demo --help",
    );
    assert_usage_error(
        &["run", "--script", "x.json"],
        "run needs --workspace DIR",
        "subloop run --help",
    );
    assert_usage_error(
        &["run", "--workspace", "."],
        "run needs --script FILE (or --live)",
        "subloop run --help",
    );
    assert_usage_error(
        &["run", "--workspace", ".", "--question", " "],
        "--question takes a question that is not blank, got ` `",
        "subloop run --help",
    );
}

#[test]
fn every_exit_2_ends_with_the_help_hint() {
    let dir = TempDir::new("usage-hint");
    let script = dir.write("broken.json", "{\"parent\": [");
    let script = script.to_str().unwrap();
    let missing = dir.path().join("no-such-dir");
    let missing = missing.to_str().unwrap();
    let trace = dir.path().join("no-such-dir/trace.jsonl");
    let trace = trace.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["demo", "--live"], "subloop demo --help"),
        (
            &["run", "--workspace", ".", "--script", script],
            "subloop run --help",
        ),
        (
            &["run", "--workspace", missing, "--script", script],
            "subloop run --help",
        ),
        (&["demo", "--trace", trace], "subloop demo --help"),
        (&["demo", "--workspace", missing], "subloop demo --help"),
        (&["help", "frobnicate"], "subloop --help"),
    ];
    for (args, help) in cases {
        let output = subloop(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert_eq!(stdout(&output), "", "{args:?}");
        let err = stderr(&output);
        assert_eq!(
            err.lines().count(),
            1,
            "{args:?}: one line, nothing before it: {err}"
        );
        assert!(err.starts_with("subloop: "), "{args:?}: {err}");
        assert!(
            err.ends_with(&format!(" (see `{help}`)\n")),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_missing_workspace_is_refused_before_any_progress_line() {
    let dir = TempDir::new("usage-missing");
    let missing = dir.path().join("missing");
    let output = subloop(&["demo", "--workspace", missing.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    assert!(!err.contains("[demo]"), "{err}");
    assert!(
        err.starts_with(&format!(
            "subloop: --workspace takes a directory, got `{}`: ",
            missing.display()
        )),
        "{err}"
    );

    // A trace file that cannot be created is refused before anything runs, too.
    let ws = marker_workspace();
    let trace = dir.path().join("missing/trace.jsonl");
    let output = subloop(&[
        "demo",
        "--workspace",
        ws.path().to_str().unwrap(),
        "--decision",
        "allow",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    assert!(
        err.starts_with("subloop: cannot create trace file"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!ws.path().join(MARKER).exists());
}

#[test]
fn a_live_run_refused_by_its_trace_prints_no_live_line_first() {
    // The key is set, so the client is configured; the trace file is what
    // refuses the run, and nothing is sent: the URL is a closed port.
    let dir = TempDir::new("usage-live");
    let trace = dir.path().join("missing/trace.jsonl");
    let output = Command::new(common::bin())
        .args(["demo", "--live", "--trace", trace.to_str().unwrap()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("ANTHROPIC_API_KEY", "sk-test-0123456789")
        .env("ANTHROPIC_BASE_URL", "http://127.0.0.1:1")
        .stdin(Stdio::null())
        .output()
        .expect("run subloop");
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    assert!(!err.contains("[live]"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line, nothing before it: {err}");
    assert!(
        err.starts_with("subloop: cannot create trace file"),
        "{err}"
    );
}

/// The LIVE section of `run`, `demo` and `chat` says what each provider
/// reads and requires: the Anthropic key is not asked of `--provider openai`.
#[test]
fn the_live_section_says_what_each_provider_needs() {
    for command in ["run", "demo", "chat"] {
        let help = stdout(&subloop(&[command, "--help"]));
        let live: String = help
            .lines()
            .skip_while(|line| !line.starts_with("LIVE"))
            .take_while(|line| !line.starts_with("    --"))
            .collect::<Vec<_>>()
            .join(" ");
        let anthropic = live
            .find("--provider anthropic")
            .unwrap_or_else(|| panic!("{command}: {live}"));
        let openai = live
            .find("--provider openai")
            .unwrap_or_else(|| panic!("{command}: {live}"));
        let key = live.find("ANTHROPIC_API_KEY (required)").expect("the key");
        assert!(anthropic < key && key < openai, "{command}: {live}");
        assert!(
            live.get(openai..).is_some_and(|part| part
                .contains("OPENAI_MODEL (required unless --model)")
                && !part.contains("ANTHROPIC")),
            "{command}: {live}"
        );
    }
}
