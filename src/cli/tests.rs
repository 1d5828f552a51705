//! The parser and the help texts come from one table: every flag each
//! subcommand accepts is in its help, and every flag its help names is accepted.

use std::path::Path;

use super::flags::{FLAGS, Group};
use super::{Cli, CliError, Command, Invocation, help, parse};

fn workspace() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/workspace")
        .to_string_lossy()
        .into_owned()
}

/// A valid value for a flag whose value is called `name` in the help.
fn sample(name: &str) -> String {
    if let Some((first, _)) = name.split_once('|') {
        return first.to_owned();
    }
    match name {
        "N" => "3".to_owned(),
        "SECS" => "2.5".to_owned(),
        "BYTES" => "100".to_owned(),
        "DIR" => workspace(),
        "FILE" => "some-file.json".to_owned(),
        "TEXT" => "What does main.py print?".to_owned(),
        "CMD" => "python3 -u main.py".to_owned(),
        "NAME" => "claude-test".to_owned(),
        "TRACE" => "run.jsonl".to_owned(),
        // An MCP config that exists (it is read while the flags are checked).
        "CONFIG" => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/mcp.json")
            .to_string_lossy()
            .into_owned(),
        // A JSON Schema file that exists (it is read while the flags are checked).
        "SCHEMA" => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/verdict.schema.json")
            .to_string_lossy()
            .into_owned(),
        // A settings file that exists (it is read while the flags are checked).
        "SETTINGS" => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/hooks.json")
            .to_string_lossy()
            .into_owned(),
        "SPEC" => "u=python3 server.py".to_owned(),
        "NAME:TOOLS" => "u:look".to_owned(),
        "A,B,…" => "read_file".to_owned(),
        "URL" => "http://127.0.0.1:4318".to_owned(),
        "POLICY" => "window".to_owned(),
        "TOKENS" => "8000".to_owned(),
        other => panic!("add a sample value for a flag value called `{other}`"),
    }
}

/// The smallest valid invocation of `command`, with `--live` when `live`.
fn base(command: Command, live: bool) -> Vec<String> {
    let mut args = vec![command.name().to_owned()];
    if command == Command::Run {
        args.extend(["--workspace".to_owned(), workspace()]);
        if !live {
            args.extend(["--script".to_owned(), "script.json".to_owned()]);
        }
    }
    if command == Command::View {
        args.push("run.jsonl".to_owned());
    }
    if command == Command::Replay {
        args.extend([
            "run.jsonl".to_owned(),
            "--workspace".to_owned(),
            workspace(),
        ]);
    }
    if live {
        args.push("--live".to_owned());
    }
    args
}

fn run(args: &[String]) -> Result<Cli, CliError> {
    match parse(args)? {
        Invocation::Run(cli) => Ok(*cli),
        Invocation::Print(text) => panic!("{args:?} printed instead of running: {text}"),
        Invocation::Check(check) => panic!("{args:?} is a check: {check:?}"),
        Invocation::Repair(repair) => panic!("{args:?} is a repair: {repair:?}"),
    }
}

/// `--max-calls N` without a flag already in `base`.
fn with_flag(command: Command, long: &str, value: Option<&str>) -> Vec<String> {
    let needs_live = FLAGS
        .iter()
        .any(|f| f.long == long && f.on(command) && f.group == Group::Live);
    let mut args: Vec<String> = base(command, needs_live && long != "live")
        .into_iter()
        .collect();
    // A flag already in the base invocation is given in place of it.
    if let Some(at) = args.iter().position(|a| *a == format!("--{long}")) {
        args.drain(at..at + 2);
    }
    if long == "live" {
        args.retain(|a| a != "--script" && a != "script.json");
    }
    // Read-only marks name a configured server.
    if long == "mcp-read-only" {
        args.extend(["--mcp".to_owned(), sample("SPEC")]);
    }
    args.push(format!("--{long}"));
    args.extend(value.map(str::to_owned));
    args
}

#[test]
fn every_accepted_flag_is_in_the_help_of_its_command() {
    for command in Command::ALL {
        let text = help(Some(command));
        for flag in FLAGS.iter().filter(|f| f.on(command)) {
            let line = format!("    {}", flag.usage());
            assert!(
                text.lines().any(|l| l.starts_with(&line)),
                "`subloop {} --help` lacks `{}`:\n{text}",
                command.name(),
                flag.usage()
            );
            let value = flag.value_name().map(sample);
            let args = with_flag(command, flag.long, value.as_deref());
            match flag.long {
                "help" | "version" => {
                    assert!(matches!(parse(&args), Ok(Invocation::Print(_))), "{args:?}");
                }
                _ => {
                    if let Err(err) = run(&args) {
                        panic!("{args:?} is refused: {err}");
                    }
                }
            }
            if let Some(short) = flag.short {
                let mut args = base(command, false);
                args.push(format!("-{short}"));
                match &value {
                    // `-o FILE` is `--output FILE`.
                    Some(value) => {
                        args.push(value.clone());
                        if let Err(err) = run(&args) {
                            panic!("{args:?} is refused: {err}");
                        }
                    }
                    None => {
                        assert!(matches!(parse(&args), Ok(Invocation::Print(_))), "{args:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn every_flag_a_help_names_is_accepted_by_that_command() {
    for command in Command::ALL {
        let text = help(Some(command));
        let named: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter_map(|word| word.strip_prefix("--"))
            .filter(|name| !name.is_empty())
            .collect();
        // `view` reads a trace: it takes a handful of flags, not the run's.
        let least = if command == Command::View { 4 } else { 10 };
        assert!(named.len() > least, "{text}");
        for name in named {
            assert!(
                FLAGS.iter().any(|f| f.long == name && f.on(command)),
                "`subloop {} --help` names --{name}, which it does not accept",
                command.name()
            );
        }
    }
}

#[test]
fn flags_of_another_command_are_refused_and_named_in_neither_help() {
    for command in Command::ALL {
        let text = help(Some(command));
        for flag in FLAGS.iter().filter(|f| !f.on(command)) {
            if FLAGS.iter().any(|f| f.long == flag.long && f.on(command)) {
                continue;
            }
            let mut args = base(command, false);
            args.push(format!("--{}", flag.long));
            args.extend(flag.value_name().map(sample));
            let err = run(&args).expect_err("a flag of another command");
            assert!(err.message.contains("takes no"), "{err}");
            assert!(!text.contains(&format!("--{} ", flag.long)), "{text}");
        }
    }
}

#[test]
fn no_flag_is_listed_twice_for_one_command() {
    for command in Command::ALL {
        let mut names: Vec<&str> = FLAGS
            .iter()
            .filter(|f| f.on(command))
            .map(|f| f.long)
            .collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "{}", command.name());
    }
}

#[test]
fn each_command_has_its_own_help_with_examples_and_usage_lines() {
    let overview = help(None);
    let demo = help(Some(Command::Demo));
    let run_help = help(Some(Command::Run));
    assert_ne!(overview, demo);
    assert_ne!(demo, run_help);
    for line in [
        "subloop demo [OPTIONS]",
        "subloop demo --live [OPTIONS]",
        "subloop run --workspace DIR --script FILE [OPTIONS]",
        "subloop run --workspace DIR --live [OPTIONS]",
        "subloop help [COMMAND]",
        "subloop -V | --version",
    ] {
        assert!(overview.contains(line), "{line}\n{overview}");
    }
    assert!(demo.contains("    subloop demo --live [OPTIONS]"), "{demo}");
    assert!(
        run_help.contains("    subloop run --workspace DIR --script FILE [OPTIONS]"),
        "{run_help}"
    );
    for text in [&demo, &run_help] {
        assert!(text.contains("EXAMPLES:"), "{text}");
        assert!(text.contains("EXIT: 0 answered"), "{text}");
        assert!(text.lines().all(|l| l.chars().count() <= 120), "{text}");
    }
    assert!(demo.starts_with("subloop demo: "), "{demo}");
    assert!(run_help.starts_with("subloop run: "), "{run_help}");
    assert!(
        run_help.contains("1 GiB"),
        "the read-limit cap is documented"
    );
}

#[test]
fn help_and_version_are_reached_every_way() {
    let print = |args: &[&str]| match parse(args) {
        Ok(Invocation::Print(text)) => text,
        other => panic!("{args:?}: {other:?}"),
    };
    assert_eq!(print(&["--help"]), help(None));
    assert_eq!(print(&["-h"]), help(None));
    assert_eq!(print(&["help"]), help(None));
    assert_eq!(print(&["help", "demo"]), help(Some(Command::Demo)));
    assert_eq!(print(&["help", "run"]), help(Some(Command::Run)));
    assert_eq!(print(&["demo", "--help"]), help(Some(Command::Demo)));
    assert_eq!(print(&["run", "-h"]), help(Some(Command::Run)));
    let version = format!("subloop {}", env!("CARGO_PKG_VERSION"));
    assert_eq!(print(&["--version"]), version);
    assert_eq!(print(&["-V"]), version);
    assert_eq!(print(&["run", "--version"]), version);
    let err = parse(["help", "frobnicate"]).unwrap_err();
    assert!(
        err.to_string().contains("unknown command `frobnicate`"),
        "{err}"
    );
}

#[test]
fn replay_takes_one_trace_and_a_workspace() {
    let cli = run(&base(Command::Replay, false)).unwrap();
    assert_eq!(cli.replay.as_deref(), Some(Path::new("run.jsonl")));
    assert!(!cli.keep_going);
    let err = parse(["replay", "--workspace", &workspace()]).unwrap_err();
    assert!(
        err.to_string().starts_with("replay needs a TRACE file"),
        "{err}"
    );
    let err = parse(["replay", "a.jsonl", "b.jsonl", "--workspace", &workspace()]).unwrap_err();
    assert!(
        err.to_string().contains("unexpected argument `b.jsonl`"),
        "{err}"
    );
    let err = parse(["replay", "a.jsonl"]).unwrap_err();
    assert!(
        err.to_string().starts_with("replay needs --workspace DIR"),
        "{err}"
    );
    for refused in ["--script", "--question", "--live"] {
        let mut args = base(Command::Replay, false);
        args.push(refused.to_owned());
        args.push("x".to_owned());
        let err = parse(&args).unwrap_err();
        assert!(err.to_string().contains("takes no"), "{refused}: {err}");
    }
}
