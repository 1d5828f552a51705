//! `subloop repair FILE -o OUT`: a broken history made sendable again, in
//! its own format ([`subloop::record::history::repair`]), written to a new
//! file; every change listed; the original never touched.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;
use subloop::core::text::printable;
use subloop::record::history::{Format, repair};

use super::{CliError, Invocation};

/// The largest file `repair` reads (it holds the file and its repair in
/// memory).
const MAX_BYTES: u64 = 1 << 30;

/// A parsed `subloop repair`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairArgs {
    /// The history to repair.
    pub file: PathBuf,
    /// `-o`: where the repaired history goes (`-`: stdout).
    pub output: PathBuf,
    /// `--format`; `None`: by content.
    pub format: Option<Format>,
    /// `--json`.
    pub json: bool,
}

/// `subloop repair --help`.
pub const HELP: &str = "\
subloop repair: makes a broken history sendable again, in its own format: a call without a result \
gets one marked as an error (\"interrupted: no result was recorded\") right after it; a result a \
message late, out of call order or (Claude Code) on an entry off the resume chain is moved to \
right after its call; a result for no call, a second result and a call asked twice in one reply \
are dropped; a call with an empty id gets one. In a Claude Code session, an entry whose parent \
was lost is linked to the entry before it, a later line repeating a uuid the chain needs is \
dropped, and the chain's last entry goes to the end of the file, where a resume starts. Nothing \
else changes: every other message, line and field is written as it was. Each change is listed on \
stderr. FILE is never modified.

USAGE:
    subloop repair FILE -o OUT [--format FORMAT] [--json]

OPTIONS:
    -o, --output OUT    where the repaired history goes (a new file, written whole then renamed \
into place; `-`: stdout); not FILE
    --format FORMAT     auto (the default: by content), claude-code, codex, anthropic, openai
    --json              one JSON object on stdout (on stderr with `-o -`): file, output, format, \
held, changes (kind, message, line, id, detail), remaining
    -h, --help          this help

Exit status: 0 the repaired history holds (or nothing needed repair), 1 some of it still breaks \
a rule, 2 FILE could not be read or OUT written.";

/// Parses the arguments after `repair`.
pub fn parse(parser: &mut lexopt::Parser) -> Result<Invocation, CliError> {
    use lexopt::Arg;

    let fail = |message: String| CliError::new(None, format!("repair: {message}"));
    let mut file: Option<PathBuf> = None;
    let mut output: Option<PathBuf> = None;
    let mut format: Option<Option<Format>> = None;
    let mut json = false;
    while let Some(arg) = parser.next().map_err(|err| fail(err.to_string()))? {
        match arg {
            Arg::Short('h') | Arg::Long("help") => return Ok(Invocation::Print(HELP.to_owned())),
            Arg::Long("json") if !json => json = true,
            Arg::Short('o') | Arg::Long("output") if output.is_none() => {
                let value: OsString = parser
                    .value()
                    .map_err(|_| fail("-o needs a value: -o OUT".to_owned()))?;
                output = Some(PathBuf::from(value));
            }
            Arg::Long("format") if format.is_none() => {
                let value: OsString = parser
                    .value()
                    .map_err(|_| fail("--format needs a value: --format FORMAT".to_owned()))?;
                format = Some(match value.to_str() {
                    Some("auto") => None,
                    Some("subloop") => {
                        return Err(fail(
                            "a subloop trace is not repaired: `subloop check` names a breach, and `run --resume` refuses a broken trace".to_owned(),
                        ));
                    }
                    Some(name) => Some(Format::parse(name).ok_or_else(|| {
                        fail(format!(
                            "--format takes auto, claude-code, codex, anthropic or openai, got `{name}`"
                        ))
                    })?),
                    None => {
                        return Err(fail(
                            "--format takes auto, claude-code, codex, anthropic or openai"
                                .to_owned(),
                        ));
                    }
                });
            }
            Arg::Short('o') | Arg::Long("output") => {
                return Err(fail("-o given twice".to_owned()));
            }
            Arg::Long(name @ ("json" | "format")) => {
                return Err(fail(format!("--{name} given twice")));
            }
            Arg::Long(name) => return Err(fail(format!("unknown flag `--{name}`"))),
            Arg::Short(c) => return Err(fail(format!("unknown flag `-{c}`"))),
            Arg::Value(value) if file.is_none() => file = Some(PathBuf::from(value)),
            Arg::Value(value) => {
                return Err(fail(format!(
                    "one FILE at a time, got another: `{}`",
                    printable(&value.to_string_lossy())
                )));
            }
        }
    }
    let file = file.ok_or_else(|| fail("no FILE: `subloop repair FILE -o OUT`".to_owned()))?;
    let output = output.ok_or_else(|| {
        fail("no -o OUT: the repair is written to a new file, never over FILE".to_owned())
    })?;
    Ok(Invocation::Repair(RepairArgs {
        file,
        output,
        format: format.flatten(),
        json,
    }))
}

/// Whether `a` and `b` name the same file (by device and inode when both
/// exist, else by their canonical paths).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => match (a.canonicalize(), b.parent().map(Path::canonicalize)) {
            (Ok(a), Some(Ok(dir))) => b.file_name().is_some_and(|name| dir.join(name) == a),
            _ => false,
        },
    }
}

/// Writes `text` to `path` whole: into a new file beside it, then renamed
/// over it, so a reader never sees half of it and a failure leaves what
/// was there.
fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("OUT names no file"))?;
    let mut temporary = dir.join(format!(
        ".{}.subloop-repair-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    if temporary.exists() {
        temporary.set_extension("tmp2");
    }
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Repairs the file; lists the changes; gives the exit status.
pub fn run(args: &RepairArgs) -> u8 {
    let shown = printable(&args.file.display().to_string());
    let to_stdout = args.output.as_os_str() == "-";
    let mut stderr = std::io::stderr().lock();
    let refuse = |stderr: &mut dyn Write, reason: &str| {
        let _ = writeln!(stderr, "subloop repair: {shown}: {}", printable(reason));
        2
    };
    if !to_stdout && same_file(&args.file, &args.output) {
        return refuse(
            &mut stderr,
            "OUT is FILE: the repair goes to a new file, never over the original",
        );
    }
    let text = match super::check::read_text(&args.file, MAX_BYTES, "repair") {
        Ok(text) => text,
        Err(why) => return refuse(&mut stderr, &why),
    };
    if args.format.is_none() && super::check::is_trace(&text) {
        return refuse(
            &mut stderr,
            "a subloop trace is not repaired: `subloop check` names a breach, and `run --resume` refuses a broken trace",
        );
    }
    let repaired = match repair(&text, args.format) {
        Ok(repaired) => repaired,
        Err(err) => return refuse(&mut stderr, &err.to_string()),
    };
    let written = if to_stdout {
        let mut out = std::io::stdout().lock();
        out.write_all(repaired.text.as_bytes())
            .and_then(|()| out.flush())
    } else {
        write_whole(&args.output, &repaired.text)
    };
    if let Err(err) = written {
        return refuse(
            &mut stderr,
            &format!(
                "cannot write {}: {err}",
                printable(&args.output.display().to_string())
            ),
        );
    }
    let held = repaired.remaining.is_empty();
    let status = if held { 0 } else { 1 };
    if args.json {
        let report = json!({
            "file": args.file.display().to_string(),
            "output": args.output.display().to_string(),
            "format": repaired.format.as_str(),
            "held": held,
            "changes": repaired.changes,
            "remaining": repaired.remaining,
        })
        .to_string();
        let written = if to_stdout {
            writeln!(stderr, "{report}")
        } else {
            writeln!(std::io::stdout().lock(), "{report}")
        };
        return if written.is_err() {
            1.max(status)
        } else {
            status
        };
    }
    for change in &repaired.changes {
        let _ = writeln!(
            stderr,
            "{shown}: {} [{}]",
            printable(&change.to_string()),
            change.kind
        );
    }
    for finding in &repaired.remaining {
        let _ = writeln!(
            stderr,
            "{shown}: still broken: {} [{}]",
            printable(&finding.to_string()),
            finding.rule
        );
    }
    let output = printable(&args.output.display().to_string());
    let verdict = match (repaired.changes.len(), held) {
        (0, true) => "nothing to repair: it holds".to_owned(),
        (changes, true) => format!("{changes} change(s); it holds"),
        (changes, false) => format!(
            "{changes} change(s); {} place(s) still broken",
            repaired.remaining.len()
        ),
    };
    let _ = writeln!(
        stderr,
        "{shown}: {verdict} ({}) -> {output}",
        repaired.format.as_str()
    );
    status
}
