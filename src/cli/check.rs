//! `subloop check FILE…`: the pairing rules over histories, subloop's own
//! traces (every invariant of `view --check`), Claude Code sessions,
//! codex rollouts and the request histories of the Messages API and Chat Completions.

use std::ffi::OsString;
use std::path::PathBuf;

use serde_json::{Value, json};
use subloop::record::history::{Format, History};
use subloop::record::recorded::RecordedRun;

use super::{CliError, Invocation};

/// The largest file `check` reads whole (a request history is at most a
/// request body; a trace at most a long run).
const MAX_BYTES: u64 = 256 << 20;

/// A file's format as `--format` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// subloop's JSON Lines trace.
    Subloop,
    /// A request history.
    Raw(Format),
}

/// A parsed `subloop check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckArgs {
    /// The files, in order.
    pub files: Vec<PathBuf>,
    /// `--format`; `None`: each file's own, by its content.
    pub format: Option<FileFormat>,
    /// `--json`.
    pub json: bool,
}

/// `subloop check --help`.
pub const HELP: &str = "\
subloop check: checks histories by the loop's pairing rules: each tool call answered by a result \
in the very next message, once, in call order, and no result for a call not asked right before. \
A subloop trace gets every rule of `view --check`.

USAGE:
    subloop check FILE... [--format FORMAT] [--json]

OPTIONS:
    --format FORMAT    auto (the default: by content), subloop (a --trace file), claude-code (a \
Claude Code session: the chain a resume follows, read line by line), codex (a codex rollout, \
read line by line), anthropic (a Messages API \
request body or its messages array), openai (a Chat Completions request body or its messages array)
    --json             one JSON object per file, one per line: file, format, held, findings \
(rule, message, line, id, detail) or error

A Claude Code session's subagents (SESSION/subagents/agent-*.jsonl beside SESSION.jsonl) are \
checked after it, each a file of its own.
    -h, --help         this help

Exit status: 0 every file held, 1 a rule is broken, 2 a file could not be read.";

/// Parses the arguments after `check`.
pub fn parse(parser: &mut lexopt::Parser) -> Result<Invocation, CliError> {
    use lexopt::Arg;

    let fail = |message: String| CliError::new(None, format!("check: {message}"));
    let mut args = CheckArgs {
        files: Vec::new(),
        format: None,
        json: false,
    };
    let mut format_given = false;
    while let Some(arg) = parser.next().map_err(|err| fail(err.to_string()))? {
        match arg {
            Arg::Short('h') | Arg::Long("help") => return Ok(Invocation::Print(HELP.to_owned())),
            Arg::Long("json") if !args.json => args.json = true,
            Arg::Long("format") if !format_given => {
                format_given = true;
                let value: OsString = parser
                    .value()
                    .map_err(|_| fail("--format needs a value: --format FORMAT".to_owned()))?;
                args.format = match value.to_str() {
                    Some("auto") => None,
                    Some("subloop") => Some(FileFormat::Subloop),
                    Some(name) => Some(FileFormat::Raw(Format::parse(name).ok_or_else(|| {
                        fail(format!(
                            "--format takes auto, subloop, claude-code, codex, anthropic or openai, got `{name}`"
                        ))
                    })?)),
                    None => {
                        return Err(fail(
                            "--format takes auto, subloop, anthropic or openai".to_owned(),
                        ));
                    }
                };
            }
            Arg::Long(name @ ("json" | "format")) => {
                return Err(fail(format!("--{name} given twice")));
            }
            Arg::Long(name) => return Err(fail(format!("unknown flag `--{name}`"))),
            Arg::Short(c) => return Err(fail(format!("unknown flag `-{c}`"))),
            Arg::Value(file) => args.files.push(PathBuf::from(file)),
        }
    }
    if args.files.is_empty() {
        return Err(fail("no FILE: `subloop check FILE...`".to_owned()));
    }
    Ok(Invocation::Check(args))
}

/// What checking one file gave.
enum Verdict {
    /// Read as `format`; the places its rules break (none: held).
    Read {
        format: &'static str,
        findings: Vec<Value>,
        lines: Vec<String>,
        /// The subagents its calls started (a Claude Code session).
        children: Vec<subloop::record::history::ChildLink>,
        /// Its own agent id (a Claude Code subagent's file).
        agent: Option<String>,
    },
    /// Unreadable.
    Unreadable(String),
}

/// Checks every file; prints a verdict per file; gives the exit status.
pub fn run(args: &CheckArgs, out: &mut dyn std::io::Write) -> u8 {
    let mut status = 0;
    // A Claude Code session's subagents are files of their own, beside it
    // (`SESSION/subagents/agent-*.jsonl`): each is checked after it.
    // Each file, and whether it is a subagent of the file before.
    let mut files: Vec<(PathBuf, bool)> = Vec::new();
    for file in &args.files {
        files.push((file.clone(), false));
        files.extend(
            subagent_files(file, args.format)
                .into_iter()
                .map(|path| (path, true)),
        );
    }
    let mut started: Vec<subloop::record::history::ChildLink> = Vec::new();
    for (file, subagent) in &files {
        let shown = subloop::core::text::printable(&file.display().to_string());
        let mut verdict = check_file(file, args.format);
        if let Verdict::Read {
            findings,
            lines,
            children,
            agent,
            ..
        } = &mut verdict
        {
            if *subagent {
                // A subagent no call of its session started.
                let id = agent.clone().or_else(|| {
                    let name = file.file_name()?.to_str()?;
                    Some(
                        name.strip_prefix("agent-")?
                            .strip_suffix(".jsonl")?
                            .to_owned(),
                    )
                });
                if !id
                    .as_ref()
                    .is_some_and(|id| started.iter().any(|link| link.agent == *id))
                {
                    let detail = format!(
                        "the subagent {} was started by no call of its session: no result there names it",
                        id.as_deref().unwrap_or("?")
                    );
                    lines.push(format!("{detail} [child_without_call]"));
                    findings.push(json!({"rule": "child_without_call", "message": 0,
                        "line": null, "id": id, "detail": detail}));
                }
            } else {
                started = std::mem::take(children);
            }
        }
        let line = match &verdict {
            Verdict::Read {
                format,
                findings,
                lines,
                ..
            } => {
                if !findings.is_empty() {
                    status = status.max(1);
                }
                if args.json {
                    json!({"file": file.display().to_string(), "format": format,
                           "held": findings.is_empty(), "findings": findings})
                    .to_string()
                } else if findings.is_empty() {
                    format!("{shown}: held ({format})")
                } else {
                    let mut text =
                        format!("{shown}: broken ({format}): {} place(s)", findings.len());
                    for line in lines {
                        text.push_str("\n    ");
                        text.push_str(&subloop::core::text::printable(line));
                    }
                    text
                }
            }
            Verdict::Unreadable(reason) => {
                status = 2;
                if args.json {
                    json!({"file": file.display().to_string(), "error": reason}).to_string()
                } else {
                    format!(
                        "{shown}: unreadable: {}",
                        subloop::core::text::printable(reason)
                    )
                }
            }
        };
        if writeln!(out, "{line}").is_err() {
            return status.max(1);
        }
    }
    status
}

/// The whole text of `path`, at most `max` bytes: a directory, a larger
/// file or one that is not UTF-8 is refused, saying why (`command` names
/// who reads it).
pub(crate) fn read_text(path: &std::path::Path, max: u64, command: &str) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|err| err.to_string())?;
    if meta.is_dir() {
        return Err("a directory".to_owned());
    }
    if meta.len() > max {
        return Err(format!(
            "{} bytes: more than {command} reads ({max})",
            meta.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|err| err.to_string())?;
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())
}

/// Reads and checks one file.
fn check_file(file: &std::path::Path, format: Option<FileFormat>) -> Verdict {
    match std::fs::metadata(file) {
        Ok(meta) if meta.is_dir() => return Verdict::Unreadable("a directory".to_owned()),
        Ok(_) => {}
        Err(err) => return Verdict::Unreadable(err.to_string()),
    }
    // A Claude Code session or a codex rollout is read line by line,
    // whatever its size.
    let lines = match format {
        Some(FileFormat::Raw(format @ (Format::ClaudeCode | Format::Codex))) => Some(format),
        Some(_) => None,
        None => head(file)
            .filter(|head| !is_trace(head))
            .and_then(|head| History::sniff(&head)),
    };
    if let Some(format) = lines {
        return match std::fs::File::open(file) {
            Ok(handle) => {
                let reader = std::io::BufReader::new(handle);
                raw_verdict(if format == Format::Codex {
                    History::read_codex(reader)
                } else {
                    History::read_claude_code(reader)
                })
            }
            Err(err) => Verdict::Unreadable(err.to_string()),
        };
    }
    let text = match read_text(file, MAX_BYTES, "check") {
        Ok(text) => text,
        Err(why) => return Verdict::Unreadable(why),
    };
    let trace = match format {
        Some(FileFormat::Subloop) => true,
        Some(FileFormat::Raw(_)) => false,
        None => is_trace(&text),
    };
    if trace {
        return match RecordedRun::parse(&text) {
            Ok(run) => {
                let verdicts = subloop::record::invariants::Policy::default().check(&run);
                let mut findings = Vec::new();
                let mut lines = Vec::new();
                for verdict in verdicts {
                    for breach in &verdict.breaches {
                        lines.push(format!("{breach} [{}]", verdict.invariant.rule()));
                        findings.push(json!({"rule": verdict.invariant, "agent": breach.agent,
                            "call": breach.call, "id": breach.id, "detail": breach.detail}));
                    }
                }
                Verdict::Read {
                    format: "subloop",
                    findings,
                    lines,
                    children: Vec::new(),
                    agent: None,
                }
            }
            Err(reason) => Verdict::Unreadable(reason),
        };
    }
    let format = match format {
        Some(FileFormat::Raw(format)) => Some(format),
        _ => None,
    };
    raw_verdict(History::read(&text, format))
}

/// The verdict on a history read (or not).
fn raw_verdict(read: Result<History, subloop::record::history::ReadError>) -> Verdict {
    match read {
        Ok(history) => {
            let found = history.check();
            Verdict::Read {
                children: history.children.clone(),
                agent: history.agent.clone(),
                format: history.format.as_str(),
                lines: found
                    .iter()
                    .map(|finding| format!("{finding} [{}]", finding.rule))
                    .collect(),
                findings: found
                    .iter()
                    .map(|finding| serde_json::to_value(finding).unwrap_or(Value::Null))
                    .collect(),
            }
        }
        Err(err) => Verdict::Unreadable(err.to_string()),
    }
}

/// The first 20 lines of `file` that are not blank (at most 16 MiB).
fn head(file: &std::path::Path) -> Option<String> {
    use std::io::{BufRead, Read};
    let handle = std::fs::File::open(file).ok()?;
    let reader = std::io::BufReader::new(handle.take(16 << 20));
    let lines: Vec<String> = reader
        .lines()
        .map_while(Result::ok)
        .filter(|line| !line.trim().is_empty())
        .take(20)
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// A subloop trace is JSON Lines whose first line has `agent` and `kind`.
pub(crate) fn is_trace(text: &str) -> bool {
    let first = text.lines().next().unwrap_or_default();
    serde_json::from_str::<Value>(first).is_ok_and(|value| {
        value.get("agent").is_some_and(Value::is_string)
            && value.get("kind").is_some_and(Value::is_string)
    })
}

/// `view FILE` of another agent's history: `None` when FILE is a subloop
/// trace (or says nothing: the trace reader names what is wrong), else
/// the history as a run, with its subagents' files.
pub(crate) fn foreign_run(
    file: &std::path::Path,
) -> Option<Result<subloop::record::foreign::Foreign, String>> {
    let head = head(file)?;
    if is_trace(&head) {
        return None;
    }
    // A session or a rollout says so in its first lines; a request history
    // is one JSON value. Anything else is read as a trace, whose reader
    // names the line that is wrong.
    if History::sniff(&head).is_none() {
        let one_value = std::fs::File::open(file).ok().is_some_and(|handle| {
            let mut values = serde_json::Deserializer::from_reader(std::io::BufReader::new(handle))
                .into_iter::<serde::de::IgnoredAny>();
            values.next().is_some_and(|value| value.is_ok()) && values.next().is_none()
        });
        if !one_value {
            return None;
        }
    }
    let read = |path: &std::path::Path| read_text(path, MAX_BYTES, "view");
    Some((|| {
        let text = read(file)?;
        let mut subagents = Vec::new();
        for path in subagent_files(file, None) {
            let name = path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            subagents.push((name, read(&path)?));
        }
        subloop::record::foreign::Foreign::read(&text, None, &subagents)
            .map_err(|err| err.to_string())
    })())
}

/// The subagent sessions of the Claude Code session `file`, in name order:
/// `SESSION/subagents/agent-*.jsonl` beside `SESSION.jsonl`.
fn subagent_files(file: &std::path::Path, format: Option<FileFormat>) -> Vec<PathBuf> {
    let claude_code = match format {
        Some(FileFormat::Raw(Format::ClaudeCode)) => true,
        Some(_) => false,
        None => head(file).is_some_and(|head| {
            !is_trace(&head) && History::sniff(&head) == Some(Format::ClaudeCode)
        }),
    };
    let dir = file.with_extension("").join("subagents");
    if !claude_code || !dir.is_dir() {
        return Vec::new();
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|path| {
                    path.is_file()
                        && path.extension().is_some_and(|ext| ext == "jsonl")
                        && path
                            .file_name()
                            .and_then(|name| name.to_str())
                            .is_some_and(|name| {
                                // `agent-acompact-*`: Claude Code's own
                                // compaction, no subagent of the session.
                                name.starts_with("agent-") && !name.starts_with("agent-acompact-")
                            })
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}
