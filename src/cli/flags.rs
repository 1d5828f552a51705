//! The table of every flag: its name, value, help line, the subcommands that
//! take it, and what it sets. The parser accepts exactly these flags and the
//! help texts list exactly these, so the two cannot disagree.

use std::ffi::OsString;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::host::{DecisionMode, Settings};
use subloop::agent::subagent::ChildBudget;
use subloop::core::error::SetupError;
use subloop::policy::command_hooks::CommandHooks;
use subloop::tools::sandbox::Sandbox;

use super::{Command, LiveFlags};

/// Every subcommand: the policy, limit and output flags.
const ALL: &[Command] = &[Command::Demo, Command::Run, Command::Replay, Command::Chat];
/// Every subcommand, `view` too: help and version.
const EVERY: &[Command] = &[
    Command::Demo,
    Command::Run,
    Command::Replay,
    Command::Chat,
    Command::View,
];
/// `subloop view` only.
const VIEW: &[Command] = &[Command::View];
/// The subcommands that print one result (`chat` prints an answer per line).
const ONE_RESULT: &[Command] = &[Command::Demo, Command::Run, Command::Replay];
/// The subcommands that ask a model (`replay` takes its replies from the trace).
const BOTH: &[Command] = &[Command::Demo, Command::Run, Command::Chat];
/// `subloop chat` only.
const CHAT: &[Command] = &[Command::Chat];
/// `subloop demo` and `subloop chat`: the workspace is optional.
const DEMO_CHAT: &[Command] = &[Command::Demo, Command::Chat];
/// `subloop run` only.
const RUN: &[Command] = &[Command::Run];
/// `subloop demo` and `subloop run`: one run that ends (its page).
const DEMO_RUN: &[Command] = &[Command::Demo, Command::Run];
/// `subloop run` and `subloop replay`: a workspace is required.
const RUN_REPLAY: &[Command] = &[Command::Run, Command::Replay];
/// `subloop replay` only.
const REPLAY: &[Command] = &[Command::Replay];

/// The longest `--deadline`, `--run-timeout` or `--timeout-*`, in seconds: one day.
pub const MAX_SECONDS: f64 = 86_400.0;

/// The unsigned integer types flags take.
pub(crate) trait Whole: FromStr + PartialOrd + Copy + std::fmt::Display {
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// The largest value.
    const MAX: Self;
}

macro_rules! whole {
    ($($t:ty),*) => {$(
        impl Whole for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const MAX: Self = <$t>::MAX;
        }
    )*};
}
whole!(u32, u64, usize);

/// Where a flag is listed in a subcommand's help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    /// OPTIONS.
    Options,
    /// RUN LIMITS.
    Limits,
    /// LIVE: these flags need `--live` (except `--live` itself).
    Live,
}

/// What a flag does when given.
#[derive(Clone, Copy)]
pub(crate) enum Action {
    /// A switch: no value.
    Switch(fn(&mut Draft)),
    /// A flag with a value: the value's name in the help, and how it is applied.
    Value(&'static str, fn(&mut Draft, &Value) -> Result<(), String>),
    /// `-h`, `--help`.
    Help,
    /// `-V`, `--version`.
    Version,
}

/// One flag.
#[derive(Clone, Copy)]
pub(crate) struct Flag {
    /// The long name, without the dashes.
    pub long: &'static str,
    /// The one-letter form, if any.
    pub short: Option<char>,
    /// The help line (defaults included).
    pub help: &'static str,
    /// The subcommands that take it.
    pub commands: &'static [Command],
    /// Its section in the help.
    pub group: Group,
    /// What it does.
    pub action: Action,
}

impl Flag {
    /// The flag as it appears in a help text: `--max-calls N`, `-h, --help`.
    pub fn usage(&self) -> String {
        let short = self.short.map(|c| format!("-{c}, ")).unwrap_or_default();
        match self.action {
            Action::Value(name, _) => format!("{short}--{} {name}", self.long),
            _ => format!("{short}--{}", self.long),
        }
    }

    /// The name of its value, for a flag that takes one.
    #[cfg(test)]
    pub fn value_name(&self) -> Option<&'static str> {
        match self.action {
            Action::Value(name, _) => Some(name),
            _ => None,
        }
    }

    /// Whether `command` takes this flag.
    pub fn on(&self, command: Command) -> bool {
        self.commands.contains(&command)
    }
}

/// The flags gathered so far, before the checks that span several flags.
#[derive(Debug)]
pub(crate) struct Draft {
    /// The settings the flags set directly.
    pub settings: Settings,
    /// `--workspace`.
    pub workspace: Option<PathBuf>,
    /// `--script`.
    pub script: Option<PathBuf>,
    /// `--question`.
    pub question: Option<String>,
    /// `--json`.
    pub json: bool,
    /// `--live`.
    pub live: bool,
    /// The live flags.
    pub live_flags: LiveFlags,
    /// `replay --keep-going`.
    pub keep_going: bool,
    /// `view --check`.
    pub check: bool,
    /// `view --max-calls`.
    pub view_parent: Option<u32>,
    /// `view --child-calls`.
    pub view_child: Option<u32>,
    /// `view -o FILE`.
    pub view_output: Option<PathBuf>,
    /// `--mcp-config FILE`, each given.
    pub mcp_files: Vec<PathBuf>,
    /// `--mcp NAME=COMMAND`, each given.
    pub mcp_servers: Vec<String>,
    /// `--mcp-read-only NAME:TOOL,…`, each given.
    pub mcp_read_only: Vec<String>,
    /// `--output-schema FILE`.
    pub output_schema: Option<PathBuf>,
    /// `--otlp URL`.
    pub otlp: Option<String>,
}

/// The flags that may be given more than once (each adds to a list).
pub(crate) const REPEATABLE: &[&str] = &["mcp-config", "mcp", "mcp-read-only", "sandbox-env"];

/// A flag's value, with the flag's name for messages.
pub(crate) struct Value {
    /// `--max-calls`.
    pub flag: String,
    /// The value as given.
    pub raw: OsString,
}

/// The largest schema file read (1 MiB).
const MAX_SCHEMA_BYTES: u64 = 1024 * 1024;

/// Reads a JSON Schema file: a JSON object, at most 1 MiB.
pub fn read_schema(path: &std::path::Path) -> Result<serde_json::Value, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|err| format!("cannot read it: {err}"))?;
    let mut text = String::new();
    file.take(MAX_SCHEMA_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|err| format!("cannot read it: {err}"))?;
    if text.len() as u64 > MAX_SCHEMA_BYTES {
        return Err("it is larger than 1 MiB".to_owned());
    }
    let schema: serde_json::Value =
        serde_json::from_str(&text).map_err(|err| format!("it is not JSON: {err}"))?;
    if !schema.is_object() {
        return Err("a JSON Schema file holds an object".to_owned());
    }
    Ok(schema)
}

impl Value {
    /// `--FLAG takes WHAT, got `VALUE``: the one shape of every value error.
    fn takes(&self, what: &str) -> String {
        format!(
            "{} takes {what}, got `{}`",
            self.flag,
            self.raw.to_string_lossy()
        )
    }

    /// The value as UTF-8 text.
    pub fn text(&self) -> Result<String, String> {
        self.raw
            .to_str()
            .map(str::to_owned)
            .ok_or_else(|| self.takes("UTF-8 text"))
    }

    /// The value as a path (any bytes).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.raw)
    }

    /// A whole number within `min..=max`, described as `what` in the error.
    fn whole<T: Whole>(&self, min: T, max: T, what: &str) -> Result<T, String> {
        self.raw
            .to_str()
            .and_then(|text| text.parse::<T>().ok())
            .filter(|n| *n >= min && *n <= max)
            .ok_or_else(|| self.takes(what))
    }

    /// A whole number of at least 1.
    pub fn positive<T: Whole>(&self) -> Result<T, String> {
        self.whole(
            T::ONE,
            T::MAX,
            &self.range("a positive whole number", T::MAX),
        )
    }

    /// A whole number of at least 0.
    pub fn count<T: Whole>(&self) -> Result<T, String> {
        self.whole(
            T::ZERO,
            T::MAX,
            &self.range("a whole number, 0 or more", T::MAX),
        )
    }

    /// `what`, and the type's largest value when the value is all digits (so too large).
    fn range<T: Whole>(&self, what: &str, max: T) -> String {
        let digits = self
            .raw
            .to_str()
            .is_some_and(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()));
        if digits
            && self
                .raw
                .to_str()
                .and_then(|t| t.parse::<T>().ok())
                .is_none()
        {
            format!("{what} up to {max}")
        } else {
            what.to_owned()
        }
    }

    /// Seconds, more than 0 and at most a day (fractions allowed).
    pub fn seconds(&self) -> Result<f64, String> {
        self.raw
            .to_str()
            .and_then(|text| text.parse::<f64>().ok())
            .filter(|secs| secs.is_finite() && *secs > 0.0 && *secs <= MAX_SECONDS)
            .ok_or_else(|| self.takes("seconds, more than 0 and at most 86400"))
    }
}

/// Every flag of `subloop demo`, `subloop run` and `subloop replay`. Adding a flag is one entry here.
pub(crate) const FLAGS: &[Flag] = &[
    Flag {
        long: "workspace",
        short: None,
        help: "the directory read_file and run_main work in (required)",
        commands: RUN_REPLAY,
        group: Group::Options,
        action: Action::Value("DIR", |d, v| {
            d.workspace = Some(v.path());
            Ok(())
        }),
    },
    Flag {
        long: "workspace",
        short: None,
        help: "the workspace (default: examples/workspace when run from the repository, else a temporary copy of the built-in files)",
        commands: DEMO_CHAT,
        group: Group::Options,
        action: Action::Value("DIR", |d, v| {
            d.workspace = Some(v.path());
            Ok(())
        }),
    },
    Flag {
        long: "script",
        short: None,
        help: "the replay script {\"parent\": [REPLY, ...], \"children\": [[REPLY, ...], ...]} (required unless --live or --resume)",
        commands: RUN,
        group: Group::Options,
        action: Action::Value("FILE", |d, v| {
            d.script = Some(v.path());
            Ok(())
        }),
    },
    Flag {
        long: "script",
        short: None,
        help: "the replay script {\"parent\": [REPLY, ...], \"children\": [[REPLY, ...], ...]} for the whole session, used in order (default: the demo's models; not with --live)",
        commands: CHAT,
        group: Group::Options,
        action: Action::Value("FILE", |d, v| {
            d.script = Some(v.path());
            Ok(())
        }),
    },
    Flag {
        long: "question",
        short: None,
        help: "the parent's question (default \"Check main.py against expected.txt.\")",
        commands: RUN,
        group: Group::Options,
        action: Action::Value("TEXT", |d, v| {
            let text = v.text()?;
            if text.trim().is_empty() {
                return Err(v.takes("a question that is not blank"));
            }
            d.question = Some(text);
            Ok(())
        }),
    },
    Flag {
        long: "decision",
        short: None,
        help: "how run_main calls are decided (default ask: a y/N prompt; a non-terminal stdin denies)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("allow|deny|ask", |d, v| {
            d.settings.decision = v
                .raw
                .to_str()
                .and_then(DecisionMode::parse)
                .ok_or_else(|| v.takes("allow, deny or ask"))?;
            Ok(())
        }),
    },
    Flag {
        long: "max-calls",
        short: None,
        help: "the parent's model-call budget, at least 1 (default 8)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("N", |d, v| {
            d.settings.max_calls = v.positive()?;
            Ok(())
        }),
    },
    Flag {
        long: "max-calls",
        short: None,
        help: "check that no question of the parent made more model calls than N (default: not checked; traces do not record budgets)",
        commands: VIEW,
        group: Group::Options,
        action: Action::Value("N", |d, v| {
            d.view_parent = Some(v.positive()?);
            Ok(())
        }),
    },
    Flag {
        long: "child-calls",
        short: None,
        help: "check that no subagent made more model calls than N (default: not checked)",
        commands: VIEW,
        group: Group::Options,
        action: Action::Value("N", |d, v| {
            d.view_child = Some(v.positive()?);
            Ok(())
        }),
    },
    Flag {
        long: "check",
        short: None,
        help: "exit 1 when an invariant is broken (for CI on recorded runs)",
        commands: VIEW,
        group: Group::Options,
        action: Action::Switch(|d| d.check = true),
    },
    Flag {
        long: "child-calls",
        short: None,
        help: "each subagent's model-call budget, 1 to 8 (default 4)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("N", |d, v| {
            d.settings.child_budget = v.whole(1, ChildBudget::MAX, "a whole number from 1 to 8")?;
            Ok(())
        }),
    },
    Flag {
        long: "read-limit",
        short: None,
        help: "read_file shows at most this many bytes, 1 to 1073741824 (1 GiB) (default 65536)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("BYTES", |d, v| {
            d.settings.read_limit = v.whole(
                1,
                subloop::tools::ReadFile::MAX_LIMIT,
                "a byte count from 1 to 1073741824 (1 GiB)",
            )?;
            Ok(())
        }),
    },
    Flag {
        long: "run-command",
        short: None,
        help: "run_main's command, split into words without a shell; quotes and backslash escapes work (default \"python3 main.py\")",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("CMD", |d, v| {
            let text = v.text()?;
            d.settings.run.command =
                subloop::tools::RunSettings::split_command(&text).map_err(|err| match err {
                    SetupError::RunCommand(why) => format!("{}: {why}", v.takes("a command line")),
                    other => format!("{}: {other}", v.takes("a command line")),
                })?;
            Ok(())
        }),
    },
    Flag {
        long: "run-timeout",
        short: None,
        help: "run_main's timeout; the whole process group is killed (default 10)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("SECS", |d, v| {
            d.settings.run.timeout = Duration::from_secs_f64(v.seconds()?);
            Ok(())
        }),
    },
    Flag {
        long: "sandbox",
        short: None,
        help: "what run_main's program may touch (Linux): the workspace and a private TMPDIR, the system read-only, no network, a short environment (workspace-write, the default); the same with the workspace read-only (read-only); or no sandbox, your rights and whole environment (off). Where the kernel cannot enforce the level, the program is not run",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("workspace-write|read-only|off", |d, v| {
            let level = v
                .raw
                .to_str()
                .and_then(Sandbox::parse)
                .ok_or_else(|| v.takes("workspace-write, read-only or off"))?;
            d.settings.sandbox = d.settings.sandbox.clone().with_level(level);
            Ok(())
        }),
    },
    Flag {
        long: "sandbox-env",
        short: None,
        help: "pass the environment variable NAME to run_main's sandboxed program too (it gets only PATH, LANG, LC_ALL, HOME and TMPDIR otherwise; repeatable)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("NAME", |d, v| {
            let name = v.text()?;
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(v.takes("a variable name (no `=`)"));
            }
            d.settings.sandbox = d.settings.sandbox.clone().pass_env(name);
            Ok(())
        }),
    },
    Flag {
        long: "trace",
        short: None,
        help: "write a JSON Lines trace of every request and reply",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("FILE", |d, v| {
            d.settings.trace = Some(v.path());
            Ok(())
        }),
    },
    Flag {
        long: "otlp",
        short: None,
        help: "send the run's spans (OpenTelemetry GenAI conventions) to this OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (also OTEL_EXPORTER_OTLP_ENDPOINT); content only with OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("URL", |d, v| {
            d.otlp = Some(v.text()?);
            Ok(())
        }),
    },
    Flag {
        long: "mcp-config",
        short: None,
        help: "add the MCP servers of an {\"mcpServers\": {NAME: {command, args, env, readOnly}}} file (repeatable); their tools are mcp__NAME__TOOL and pass the gate unless marked read-only",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("CONFIG", |d, v| {
            d.mcp_files.push(v.path());
            d.settings.config_files.push(v.path());
            Ok(())
        }),
    },
    Flag {
        long: "mcp",
        short: None,
        help: "add one MCP server: NAME=COMMAND ARGS… (split like --run-command; repeatable)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("SPEC", |d, v| {
            d.mcp_servers.push(v.text()?);
            Ok(())
        }),
    },
    Flag {
        long: "mcp-read-only",
        short: None,
        help: "mark tools of a configured MCP server read-only: NAME:TOOL,… (they run without approval and may be given to a subagent; repeatable)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("NAME:TOOLS", |d, v| {
            d.mcp_read_only.push(v.text()?);
            Ok(())
        }),
    },
    Flag {
        long: "mcp-timeout",
        short: None,
        help: "an MCP server's start timeout, also each MCP call's (default 30)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("SECS", |d, v| {
            d.settings.mcp_timeout = Duration::from_secs_f64(v.seconds()?);
            Ok(())
        }),
    },
    Flag {
        long: "child-tools",
        short: None,
        help: "the tools a subagent may use, comma-separated: read-only ones only (default read_file)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("A,B,…", |d, v| {
            let names: Vec<String> = v
                .text()?
                .split(',')
                .map(|name| name.trim().to_owned())
                .collect();
            if names.iter().any(String::is_empty) {
                return Err(v.takes("tool names separated by commas"));
            }
            d.settings.child_tools = names;
            Ok(())
        }),
    },
    Flag {
        long: "view",
        short: None,
        help: "when the run ends, write it as one self-contained HTML page (lanes, calls and results, delegations, invariants); like --trace, never the script or a workspace file",
        commands: DEMO_RUN,
        group: Group::Options,
        action: Action::Value("FILE", |d, v| {
            d.settings.view = Some(v.path());
            Ok(())
        }),
    },
    Flag {
        long: "output",
        short: Some('o'),
        help: "write the run as one self-contained HTML page to FILE instead of the timeline",
        commands: VIEW,
        group: Group::Options,
        action: Action::Value("FILE", |d, v| {
            d.view_output = Some(v.path());
            Ok(())
        }),
    },
    Flag {
        long: "resume",
        short: None,
        help: "continue the run TRACE records (it ended early or was killed) and append to that trace; with --question, ask an answered run a follow-up; --script gives the rest of the replies (without --script or --live: the demo model)",
        commands: RUN,
        group: Group::Options,
        action: Action::Value("TRACE", |d, v| {
            d.settings.resume = Some(v.path());
            Ok(())
        }),
    },
    Flag {
        long: "other-workspace",
        short: None,
        help: "with --resume: go on although the trace records another workspace than --workspace (without it, that is refused)",
        commands: RUN,
        group: Group::Options,
        action: Action::Switch(|d| d.settings.other_workspace = true),
    },
    Flag {
        long: "json",
        short: None,
        help: "print one JSON object on stdout instead of the final text",
        commands: ONE_RESULT,
        group: Group::Options,
        action: Action::Switch(|d| d.json = true),
    },
    Flag {
        long: "quiet",
        short: None,
        help: "no progress lines on stderr",
        commands: ALL,
        group: Group::Options,
        action: Action::Switch(|d| d.settings.progress = false),
    },
    Flag {
        long: "on-empty-reply",
        short: None,
        help: "an empty end_turn reply is protocol_error (stop, the default), or is answered once in a row with \"Please continue.\" (continue)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("stop|continue", |d, v| {
            d.settings.on_empty_reply = v
                .raw
                .to_str()
                .and_then(subloop::core::conversation::OnEmptyReply::parse)
                .ok_or_else(|| v.takes("stop or continue"))?;
            Ok(())
        }),
    },
    Flag {
        long: "output-schema",
        short: None,
        help: "the answer must be JSON matching this JSON Schema file; one that does not is sent back with the reason (see --output-retries), then the run ends invalid_output; the JSON report holds the value under \"output\"",
        commands: BOTH,
        group: Group::Options,
        action: Action::Value("SCHEMA", |d, v| {
            d.settings.output_schema = Some(
                read_schema(&v.path())
                    .map_err(|err| format!("--output-schema {}: {err}", v.path().display()))?,
            );
            Ok(())
        }),
    },
    Flag {
        long: "output-retries",
        short: None,
        help: "how many answers that do not match the output schema (given, or recorded in the trace a replay reads) are sent back before the run ends invalid_output (default 1)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("N", |d, v| {
            d.settings.output_retries = v.count()?;
            Ok(())
        }),
    },
    Flag {
        long: "compact",
        short: None,
        help: "how a history too long for the model is shortened: auto (the default: old tool results cleared, then the oldest rounds dropped), clear-results, window (the question and the last 4 rounds), summarize (the model summarizes all but the last 2 rounds; auto when it cannot), or off; it is compacted when the server refuses a request for its length and, with --context-window, before a request past 80% of the window; a history that cannot be shortened ends the run context_overflow (a replay compacts as the recorded run did unless given)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("POLICY", |d, v| {
            d.settings.compact = Some(
                v.raw
                    .to_str()
                    .and_then(crate::host::compact::CompactPolicy::parse)
                    .ok_or_else(|| v.takes("auto, clear-results, window, summarize or off"))?,
            );
            Ok(())
        }),
    },
    Flag {
        long: "context-window",
        short: None,
        help: "the model's context window in tokens: histories are compacted before a request estimated past 80% of it (the default: only when the server refuses a request for its length)",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("TOKENS", |d, v| {
            d.settings.context_window = Some(v.positive::<u64>()?);
            Ok(())
        }),
    },
    Flag {
        long: "settings",
        short: None,
        help: "run the command hooks of a Claude Code settings file {\"hooks\": {EVENT: [{matcher, hooks: [{type: command, command, timeout, failOpen}]}]}} (docs/hooks.md); nothing else of the file is read, and no settings file is ever read unless given",
        commands: ALL,
        group: Group::Options,
        action: Action::Value("SETTINGS", |d, v| {
            let path = v.path();
            d.settings.hooks =
                CommandHooks::load(&path).map_err(|err| format!("--settings: {err}"))?;
            d.settings.config_files.push(path);
            Ok(())
        }),
    },
    Flag {
        long: "keep-going",
        short: None,
        help: "go on past a divergence while the trace has a reply for each request, and list every divergence",
        commands: REPLAY,
        group: Group::Options,
        action: Action::Switch(|d| d.keep_going = true),
    },
    Flag {
        long: "help",
        short: Some('h'),
        help: "this help",
        commands: EVERY,
        group: Group::Options,
        action: Action::Help,
    },
    Flag {
        long: "version",
        short: Some('V'),
        help: "the version",
        commands: EVERY,
        group: Group::Options,
        action: Action::Version,
    },
    Flag {
        long: "max-tools-per-reply",
        short: None,
        help: "tool calls run per model reply, at least 1; the rest are refused (default 16)",
        commands: ALL,
        group: Group::Limits,
        action: Action::Value("N", |d, v| {
            d.settings.limits.max_tools_per_reply = v.positive()?;
            Ok(())
        }),
    },
    Flag {
        long: "max-delegations",
        short: None,
        help: "subagents started per run; later task calls get delegation_limit (default 8)",
        commands: ALL,
        group: Group::Limits,
        action: Action::Value("N", |d, v| {
            d.settings.limits.max_delegations = v.count()?;
            Ok(())
        }),
    },
    Flag {
        long: "deadline",
        short: None,
        help: "wall-clock limit of the run: status deadline (default none)",
        commands: ALL,
        group: Group::Limits,
        action: Action::Value("SECS", |d, v| {
            d.settings.limits.deadline = Some(Duration::from_secs_f64(v.seconds()?));
            Ok(())
        }),
    },
    Flag {
        long: "max-tokens-total",
        short: None,
        help: "input + output tokens of the run: status token_limit (default none)",
        commands: ALL,
        group: Group::Limits,
        action: Action::Value("N", |d, v| {
            d.settings.limits.max_tokens_total = Some(v.positive()?);
            Ok(())
        }),
    },
    Flag {
        long: "live",
        short: None,
        help: "use the API instead of the built-in models or a script",
        commands: BOTH,
        group: Group::Live,
        action: Action::Switch(|d| d.live = true),
    },
    Flag {
        long: "provider",
        short: None,
        help: "the API: the Anthropic Messages API (the default), or any OpenAI-compatible Chat Completions server (OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL)",
        commands: BOTH,
        group: Group::Live,
        action: Action::Value("anthropic|openai", |d, v| {
            let name = v.text()?;
            d.live_flags.provider =
                super::Provider::from_name(&name).ok_or_else(|| v.takes("anthropic or openai"))?;
            Ok(())
        }),
    },
    Flag {
        long: "model",
        short: None,
        help: "the model (anthropic default: ANTHROPIC_MODEL, else claude-sonnet-4-5; openai: OPENAI_MODEL, one of the two is required)",
        commands: BOTH,
        group: Group::Live,
        action: Action::Value("NAME", |d, v| {
            let name = v.text()?;
            if name.trim().is_empty() {
                return Err(v.takes("a model name that is not blank"));
            }
            d.live_flags.model = Some(name);
            Ok(())
        }),
    },
    Flag {
        long: "max-tokens",
        short: None,
        help: "max_tokens of each reply, at least 1 (default 4096)",
        commands: BOTH,
        group: Group::Live,
        action: Action::Value("N", |d, v| {
            d.live_flags.max_tokens = Some(v.positive()?);
            Ok(())
        }),
    },
    Flag {
        long: "retries",
        short: None,
        help: "retries of a failed request at the transport (default 2)",
        commands: BOTH,
        group: Group::Live,
        action: Action::Value("N", |d, v| {
            d.live_flags.retries = Some(v.count()?);
            Ok(())
        }),
    },
    Flag {
        long: "stream",
        short: None,
        help: "use the SSE stream; text is shown on stderr as it arrives",
        commands: BOTH,
        group: Group::Live,
        action: Action::Switch(|d| d.live_flags.stream = true),
    },
    Flag {
        long: "timeout-connect",
        short: None,
        help: "connect timeout (default 10)",
        commands: BOTH,
        group: Group::Live,
        action: Action::Value("SECS", |d, v| {
            d.live_flags.connect = Some(v.seconds()?);
            Ok(())
        }),
    },
    Flag {
        long: "timeout-read",
        short: None,
        help: "per-read timeout (default 120)",
        commands: BOTH,
        group: Group::Live,
        action: Action::Value("SECS", |d, v| {
            d.live_flags.read = Some(v.seconds()?);
            Ok(())
        }),
    },
    Flag {
        long: "timeout-total",
        short: None,
        help: "whole-request timeout (default 600)",
        commands: BOTH,
        group: Group::Live,
        action: Action::Value("SECS", |d, v| {
            d.live_flags.total = Some(v.seconds()?);
            Ok(())
        }),
    },
];

/// The flag `command` takes under this long name.
pub(crate) fn find_long(command: Command, long: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.long == long && f.on(command))
}

/// The flag `command` takes under this one-letter name.
pub(crate) fn find_short(command: Command, short: char) -> Option<&'static Flag> {
    FLAGS
        .iter()
        .find(|f| f.short == Some(short) && f.on(command))
}

/// The subcommands that take `--long`, for "not a flag of" messages.
pub(crate) fn commands_taking(long: &str) -> Vec<Command> {
    let mut found: Vec<Command> = FLAGS
        .iter()
        .filter(|f| f.long == long)
        .flat_map(|f| f.commands.iter().copied())
        .collect();
    found.dedup();
    found
}
