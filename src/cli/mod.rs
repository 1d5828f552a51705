//! The command line: `subloop demo`, `subloop run`, `subloop replay`,
//! `subloop chat`, `subloop view`, `subloop check`, `subloop doctor` and
//! `subloop help`.
//!
//! Every flag is one entry of a table (`flags.rs`) that says which
//! subcommands take it, what its help line is, and what it sets; the parser
//! accepts exactly those flags and the help texts ([`help`]) are rendered
//! from the same table. Every usage error is one [`CliError`] line that ends
//! with the same hint, `(see `subloop run --help`)`. `main.rs` only calls
//! [`parse`], wires [`crate::host`] and prints.

pub mod check;
mod doctor;
pub mod durable;
mod flags;
mod help;
pub mod output;
pub mod repair;
pub mod signals;
#[cfg(feature = "otel")]
pub mod telemetry;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::host::{self, Settings};

pub use help::{help, version};

/// A subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `subloop demo`: the course's scenario.
    Demo,
    /// `subloop run`: a script or the live API against a workspace.
    Run,
    /// `subloop replay TRACE`: a recorded run re-run offline and compared.
    Replay,
    /// `subloop chat`: questions one per line, each a follow-up of the last.
    Chat,
    /// `subloop view TRACE`: a recorded run as a timeline, with its invariants checked.
    View,
}

impl Command {
    /// Every subcommand, in help order.
    pub const ALL: [Command; 5] = [
        Command::Demo,
        Command::Run,
        Command::Replay,
        Command::Chat,
        Command::View,
    ];

    /// The subcommand's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Demo => "demo",
            Self::Run => "run",
            Self::Replay => "replay",
            Self::Chat => "chat",
            Self::View => "view",
        }
    }

    /// The subcommand called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|command| command.name() == name)
    }
}

/// Which API `--live` talks to (`--provider`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// The Anthropic Messages API (the default).
    #[default]
    Anthropic,
    /// An OpenAI-compatible Chat Completions server.
    OpenAi,
}

impl Provider {
    /// The name `--provider` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
        }
    }

    /// The provider called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Anthropic, Self::OpenAi]
            .into_iter()
            .find(|provider| provider.name() == name)
    }
}

/// The live flags, turned into a client once parsing is done.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LiveFlags {
    /// `--provider`.
    pub provider: Provider,
    /// `--model`.
    pub model: Option<String>,
    /// `--max-tokens`.
    pub max_tokens: Option<u32>,
    /// `--retries`.
    pub retries: Option<u32>,
    /// `--stream`.
    pub stream: bool,
    /// `--timeout-connect`, in seconds.
    pub connect: Option<f64>,
    /// `--timeout-read`, in seconds.
    pub read: Option<f64>,
    /// `--timeout-total`, in seconds.
    pub total: Option<f64>,
}

/// A parsed `subloop demo`, `subloop run` or `subloop replay`.
#[derive(Debug)]
pub struct Cli {
    /// The subcommand.
    pub command: Command,
    /// The run's settings (for `demo`, with its workspace and question).
    pub settings: Settings,
    /// `run --script`.
    pub script: Option<PathBuf>,
    /// `--json`.
    pub json: bool,
    /// `--live` and its flags.
    pub live: Option<LiveFlags>,
    /// `replay TRACE`: the trace to replay.
    pub replay: Option<PathBuf>,
    /// `replay --keep-going`.
    pub keep_going: bool,
    /// `view --check`.
    pub check: bool,
    /// `view -o FILE`: the HTML page instead of the timeline.
    pub view_output: Option<PathBuf>,
    /// `view`'s budgets to check.
    pub view_policy: subloop::record::invariants::Policy,
    /// `--otlp URL`: where the run's spans are sent.
    pub otlp: Option<String>,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Invocation {
    /// Run a subcommand.
    Run(Box<Cli>),
    /// Print this text on stdout and exit 0 (a help text or the version).
    Print(String),
    /// `subloop check FILE…`.
    Check(check::CheckArgs),
    /// `subloop repair FILE -o OUT`.
    Repair(repair::RepairArgs),
}

/// A usage error: one line that ends with a pointer to the right help.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message} (see `{}`)", help_command(*.command))]
pub struct CliError {
    /// The subcommand the error is about, if known.
    pub command: Option<Command>,
    /// What is wrong.
    pub message: String,
}

impl CliError {
    /// An error about `command` (or the command line as a whole).
    pub fn new(command: Option<Command>, message: impl std::fmt::Display) -> Self {
        Self {
            command,
            message: message.to_string(),
        }
    }
}

/// `subloop run --help`, or `subloop --help` when no subcommand is known.
fn help_command(command: Option<Command>) -> String {
    match command {
        Some(command) => format!("subloop {} --help", command.name()),
        None => "subloop --help".to_owned(),
    }
}

/// Parses the arguments after the program name.
///
/// ```
/// use crate::cli::{Invocation, parse};
///
/// let Ok(Invocation::Run(cli)) = parse(["demo", "--max-calls", "3", "--json"]) else {
///     panic!("a valid demo invocation");
/// };
/// assert_eq!(cli.settings.max_calls, 3);
/// let err = parse(["demo", "--max-calls", "3", "--max-calls", "4"]).unwrap_err();
/// assert_eq!(err.to_string(), "--max-calls given twice (see `subloop demo --help`)");
/// ```
pub fn parse<I>(args: I) -> Result<Invocation, CliError>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    use lexopt::Arg;

    let mut parser = lexopt::Parser::from_args(args);
    let top = |message: String| CliError::new(None, message);
    let command = match parser.next().map_err(|err| top(lexopt_message(err)))? {
        None => {
            return Err(top(
                "no command: use `subloop demo`, `subloop run`, `subloop replay`, `subloop chat` or `subloop view`"
                    .into(),
            ));
        }
        Some(Arg::Short('h') | Arg::Long("help")) => return Ok(Invocation::Print(help(None))),
        Some(Arg::Short('V') | Arg::Long("version")) => return Ok(Invocation::Print(version())),
        Some(Arg::Value(word)) if word == "help" => return help_topic(&mut parser),
        Some(Arg::Value(word)) if word == "check" => return check::parse(&mut parser),
        Some(Arg::Value(word)) if word == "repair" => return repair::parse(&mut parser),
        Some(Arg::Value(word)) if word == "doctor" => {
            return match parser.next().map_err(|err| top(lexopt_message(err)))? {
                None => Ok(Invocation::Print(doctor::report(
                    &subloop::tools::sandbox::Support::probe(),
                ))),
                Some(_) => Err(top("doctor takes no arguments".into())),
            };
        }
        Some(Arg::Value(word)) => {
            let word = word.to_string_lossy();
            Command::from_name(&word).ok_or_else(|| top(unknown_command(&word)))?
        }
        Some(Arg::Long(name)) if !flags::commands_taking(name).is_empty() => {
            return Err(top(format!(
                "--{name} goes after the command: `subloop demo --{name}` or `subloop run --{name}`"
            )));
        }
        Some(Arg::Long(name)) => return Err(top(format!("unknown flag `--{name}`"))),
        Some(Arg::Short(c)) => return Err(top(format!("unknown flag `-{c}`"))),
    };
    let fail = |message: String| CliError::new(Some(command), message);
    let mut draft = flags::Draft {
        settings: Settings::new(PathBuf::new()),
        workspace: None,
        script: None,
        question: None,
        json: false,
        live: false,
        live_flags: LiveFlags::default(),
        keep_going: false,
        check: false,
        view_parent: None,
        view_child: None,
        view_output: None,
        mcp_files: Vec::new(),
        mcp_servers: Vec::new(),
        mcp_read_only: Vec::new(),
        otlp: None,
        output_schema: None,
    };
    let mut replay: Option<PathBuf> = None;
    let mut seen: Vec<&'static str> = Vec::new();
    let mut live_only: Option<&'static str> = None;
    while let Some(arg) = parser.next().map_err(|err| fail(lexopt_message(err)))? {
        let flag =
            match arg {
                Arg::Long(name) => flags::find_long(command, name)
                    .ok_or_else(|| fail(not_a_flag(command, name)))?,
                Arg::Short(c) => flags::find_short(command, c)
                    .ok_or_else(|| fail(format!("unknown flag `-{c}`")))?,
                Arg::Value(word)
                    if matches!(command, Command::Replay | Command::View) && replay.is_none() =>
                {
                    replay = Some(PathBuf::from(word));
                    continue;
                }
                Arg::Value(word) => {
                    return Err(fail(format!(
                        "unexpected argument `{}`",
                        word.to_string_lossy()
                    )));
                }
            };
        if seen.contains(&flag.long) && !flags::REPEATABLE.contains(&flag.long) {
            return Err(fail(format!("--{} given twice", flag.long)));
        }
        seen.push(flag.long);
        if flag.group == flags::Group::Live && flag.long != "live" {
            live_only.get_or_insert(flag.long);
        }
        match flag.action {
            flags::Action::Help => return Ok(Invocation::Print(help(Some(command)))),
            flags::Action::Version => return Ok(Invocation::Print(version())),
            flags::Action::Switch(set) => set(&mut draft),
            flags::Action::Value(name, set) => {
                let raw = parser.value().map_err(|_| {
                    fail(format!(
                        "--{} needs a value: --{} {name}",
                        flag.long, flag.long
                    ))
                })?;
                let value = flags::Value {
                    flag: format!("--{}", flag.long),
                    raw,
                };
                set(&mut draft, &value).map_err(fail)?;
            }
        }
    }
    finish(command, draft, live_only, replay).map(|cli| Invocation::Run(Box::new(cli)))
}

/// The checks that span several flags, and the demo's workspace.
fn finish(
    command: Command,
    draft: flags::Draft,
    live_only: Option<&str>,
    replay: Option<PathBuf>,
) -> Result<Cli, CliError> {
    let fail = |message: String| CliError::new(Some(command), message);
    let flags::Draft {
        mut settings,
        workspace,
        script,
        question,
        json,
        live,
        live_flags,
        keep_going,
        check,
        view_parent,
        view_child,
        view_output,
        mcp_files,
        mcp_servers,
        mcp_read_only,
        otlp,
        output_schema,
    } = draft;
    settings.mcp = mcp_servers_of(&mcp_files, &mcp_servers, &mcp_read_only).map_err(fail)?;
    if let Some(path) = &output_schema {
        let schema = flags::read_schema(path)
            .map_err(|err| fail(format!("--output-schema {}: {err}", path.display())))?;
        settings.output_schema = Some(schema);
    }
    if live && script.is_some() {
        return Err(fail("--live and --script cannot be used together".into()));
    }
    if let (false, Some(name)) = (live, live_only) {
        return Err(fail(format!("--{name} goes with --live")));
    }
    if let Some(dir) = &workspace {
        check_workspace(dir).map_err(fail)?;
    }
    match command {
        Command::Demo => {
            let demo = host::demo_settings(workspace).map_err(fail_with(command))?;
            settings.workspace = demo.workspace;
            settings.question = demo.question;
            settings.temporary_workspace = demo.temporary_workspace;
        }
        Command::Run => {
            settings.workspace =
                workspace.ok_or_else(|| fail("run needs --workspace DIR".into()))?;
            if let Some(trace) = &settings.resume {
                settings.follow_up = question.clone();
                if settings.trace.is_some() {
                    return Err(fail(format!(
                        "--trace cannot be used with --resume: the resumed run appends to {}",
                        trace.display()
                    )));
                }
            } else if script.is_none() && !live {
                return Err(fail("run needs --script FILE (or --live)".into()));
            }
            if let Some(question) = question {
                settings.question = question;
            }
        }
        Command::Chat => {
            // Like the demo: the workspace given, or the demo's.
            let demo = host::demo_settings(workspace).map_err(fail_with(command))?;
            settings.workspace = demo.workspace;
            settings.temporary_workspace = demo.temporary_workspace;
        }
        Command::View => {
            if replay.is_none() {
                return Err(fail("view needs a TRACE file: `subloop view TRACE`".into()));
            }
        }
        Command::Replay => {
            if replay.is_none() {
                return Err(fail(
                    "replay needs a TRACE file: `subloop replay TRACE --workspace DIR`".into(),
                ));
            }
            settings.workspace =
                workspace.ok_or_else(|| fail("replay needs --workspace DIR".into()))?;
        }
    }
    Ok(Cli {
        command,
        settings,
        script,
        json,
        live: live.then_some(live_flags),
        replay,
        keep_going,
        check,
        view_output,
        otlp,
        view_policy: subloop::record::invariants::Policy {
            parent_calls: view_parent,
            child_calls: view_child,
            ..subloop::record::invariants::Policy::default()
        },
    })
}

/// The MCP servers of `--mcp-config` files and `--mcp` flags, with the
/// `--mcp-read-only` marks applied.
fn mcp_servers_of(
    files: &[PathBuf],
    flags: &[String],
    read_only: &[String],
) -> Result<Vec<subloop::tools::mcp::config::ServerConfig>, String> {
    use subloop::tools::mcp::config;
    let mut servers = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .map_err(|err| format!("--mcp-config {}: {err}", file.display()))?;
        let more = config::ServerConfig::parse_file(&text, &file.display().to_string())
            .map_err(|err| err.to_string())?;
        config::ServerConfig::merge(&mut servers, more).map_err(|err| err.to_string())?;
    }
    for flag in flags {
        let server =
            config::ServerConfig::parse_flag(flag).map_err(|err| format!("--mcp: {err}"))?;
        config::ServerConfig::merge(&mut servers, vec![server]).map_err(|err| err.to_string())?;
    }
    for marks in read_only {
        config::ServerConfig::apply_read_only(&mut servers, marks)
            .map_err(|err| format!("--mcp-read-only: {err}"))?;
    }
    Ok(servers)
}

/// Maps any displayable error to a [`CliError`] about `command`.
fn fail_with<E: std::fmt::Display>(command: Command) -> impl Fn(E) -> CliError {
    move |err| CliError::new(Some(command), err)
}

/// `--workspace` must name a directory.
fn check_workspace(dir: &Path) -> Result<(), String> {
    let problem = match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => "not a directory".to_owned(),
        Err(err) => err.to_string(),
    };
    Err(format!(
        "--workspace takes a directory, got `{}`: {problem}",
        dir.display()
    ))
}

/// `subloop help [COMMAND]`.
fn help_topic(parser: &mut lexopt::Parser) -> Result<Invocation, CliError> {
    use lexopt::Arg;

    let top = |message: String| CliError::new(None, message);
    let topic = match parser.next().map_err(|err| top(lexopt_message(err)))? {
        // `help` is a command too: its help is the overview.
        None | Some(Arg::Short('h') | Arg::Long("help")) => {
            return Ok(Invocation::Print(help(None)));
        }
        Some(Arg::Value(word)) if word == "help" => return Ok(Invocation::Print(help(None))),
        Some(Arg::Value(word)) if word == "check" => {
            return Ok(Invocation::Print(check::HELP.to_owned()));
        }
        Some(Arg::Value(word)) if word == "repair" => {
            return Ok(Invocation::Print(repair::HELP.to_owned()));
        }
        Some(Arg::Value(word)) if word == "doctor" => {
            return Ok(Invocation::Print(
                "subloop doctor: says what this machine can enforce of run_main's sandbox: the \
                 kernel, its Landlock ABI, seccomp, and for each --sandbox level whether it is \
                 enforced or what is missing. It takes no flags."
                    .to_owned(),
            ));
        }
        Some(Arg::Value(word)) => {
            let word = word.to_string_lossy();
            Command::from_name(&word).ok_or_else(|| top(unknown_command(&word)))?
        }
        Some(_) => {
            return Err(top(
                "help takes a command name: `subloop help demo`, `subloop help run` or `subloop help replay`".into(),
            ));
        }
    };
    match parser.next().map_err(|err| top(lexopt_message(err)))? {
        None => Ok(Invocation::Print(help(Some(topic)))),
        Some(_) => Err(top("help takes at most one command name".into())),
    }
}

fn unknown_command(word: &str) -> String {
    format!(
        "unknown command `{word}`: use `subloop demo`, `subloop run`, `subloop replay` or `subloop help`"
    )
}

/// `--script` on `demo`: say where the flag belongs.
fn not_a_flag(command: Command, name: &str) -> String {
    let others: Vec<String> = flags::commands_taking(name)
        .into_iter()
        .filter(|other| *other != command)
        .map(|other| format!("`subloop {}`", other.name()))
        .collect();
    if others.is_empty() {
        format!("unknown flag `--{name}`")
    } else {
        format!(
            "`subloop {}` takes no --{name} (it is a flag of {})",
            command.name(),
            others.join(" and ")
        )
    }
}

/// lexopt's errors in this module's words.
fn lexopt_message(err: lexopt::Error) -> String {
    match err {
        lexopt::Error::UnexpectedValue { option, value } => {
            format!("{option} takes no value, got `{}`", value.to_string_lossy())
        }
        lexopt::Error::MissingValue {
            option: Some(option),
        } => {
            format!("{option} needs a value")
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
