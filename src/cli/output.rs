//! The final answer on stdout, written without a panic and without letting
//! model text drive the terminal.
//!
//! * Piped or redirected, stdout gets the text byte for byte.
//! * On a terminal, control characters (escape sequences, carriage
//!   returns; not line breaks) are shown escaped, as on stderr, and so are
//!   the Unicode line and paragraph separators (U+2028, U+2029), bidi
//!   controls (U+202A–U+202E, U+2066–U+2069) and zero-width characters
//!   (U+200B–U+200F, U+2060, U+FEFF), which could make the text read
//!   differently from what it is. JSON output stays valid JSON: those
//!   characters become `\uXXXX` escapes of the same value.
//! * A reader that went away (`subloop … | head -c1`, `| true`) ends the
//!   output quietly, as ripgrep does; any other write error (`> /dev/full`)
//!   is one line on stderr and exit code 1.

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;

use subloop::core::text::{printable, printable_lines};

/// Whether `c`, no ASCII character, is one the library shows escaped on a
/// terminal although it is no control character (the bidi controls, the
/// zero-width characters, the Unicode line and paragraph separators).
fn needs_escape(c: char) -> bool {
    if c.is_ascii() {
        return false;
    }
    let mut buf = [0u8; 4];
    let text: &str = c.encode_utf8(&mut buf);
    printable(text) != text
}

/// Writes `text` and a line break to stdout; `json` says the text is JSON.
///
/// A broken pipe is not an error: the reader chose to stop reading.
pub fn print_stdout(text: &str, json: bool) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let shown = if stdout.is_terminal() {
        terminal_safe(text, json)
    } else {
        std::borrow::Cow::Borrowed(text)
    };
    let mut out = stdout.lock();
    let written = out
        .write_all(shown.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Writes `value` as one line of JSON and a line break to stdout, like
/// [`print_stdout`] with `json`: on a terminal it is escaped as there; piped
/// or redirected, it is serialized straight into the pipe (no copy of the
/// whole text is built first, which for a long run's `--json` is megabytes).
///
/// A broken pipe is not an error; a value that cannot be serialized is
/// [`std::io::ErrorKind::InvalidData`].
pub fn print_json_stdout(value: &impl serde::Serialize) -> std::io::Result<()> {
    // A write error comes back as it was; anything else is `InvalidData`.
    let as_io = std::io::Error::from;
    let stdout = std::io::stdout();
    if stdout.is_terminal() {
        let text = serde_json::to_string(value).map_err(as_io)?;
        return print_stdout(&text, true);
    }
    let mut lock = stdout.lock();
    // Written past stdout's line buffer, which would search every 64 KiB
    // chunk for its last line break: through a handle of its own on the
    // same file, once what the line buffer holds has gone out first.
    let written = lock
        .flush()
        .and_then(|()| match lock.as_fd().try_clone_to_owned() {
            Ok(fd) => json_line(std::fs::File::from(fd), value),
            Err(_) => json_line(&mut lock, value),
        });
    match written {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// `value` as one line of JSON on `out`, in 64 KiB writes.
fn json_line(out: impl Write, value: &impl serde::Serialize) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 16, out);
    serde_json::to_writer(&mut out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
}

/// `text` as shown on a terminal (see the module docs).
pub fn terminal_safe(text: &str, json: bool) -> std::borrow::Cow<'_, str> {
    if json {
        // serde_json escapes C0 controls but not DEL, C1 controls, the
        // hidden-format characters or the Unicode line separators; none of
        // those is JSON whitespace, so they only stand inside strings, where
        // `\uXXXX` means the same.
        let unsafe_in_json =
            |c: char| (c.is_control() && !matches!(c, '\n' | '\r' | '\t' | ' ')) || needs_escape(c);
        if !text.chars().any(unsafe_in_json) {
            return std::borrow::Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len() + 16);
        for c in text.chars() {
            if unsafe_in_json(c) {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            } else {
                out.push(c);
            }
        }
        std::borrow::Cow::Owned(out)
    } else {
        std::borrow::Cow::Owned(printable_lines(text))
    }
}

/// Prints a run's answer (or, with `json`, its JSON object) on stdout and
/// says how the process exits: 0 when the run succeeded
/// ([`crate::host::Run::succeeded`]), else 1; an output that cannot be
/// written is one line on stderr and 1, a reader that went away is not an
/// error.
pub fn finish(run: &crate::host::Run, json: bool) -> std::process::ExitCode {
    use std::io::Write as _;
    let printed = if json && !run.mcp_servers.is_empty() {
        #[derive(serde::Serialize)]
        struct Server<'a> {
            name: &'a str,
            tools: &'a [String],
        }
        #[derive(serde::Serialize)]
        struct WithServers<'a, R: serde::Serialize> {
            #[serde(flatten)]
            report: R,
            mcp_servers: Vec<Server<'a>>,
        }
        print_json_stdout(&WithServers {
            report: run.report.json_report(),
            mcp_servers: run
                .mcp_servers
                .iter()
                .map(|(name, tools)| Server { name, tools })
                .collect(),
        })
    } else if json {
        // Serialized straight from the report's typed view (no `Value`)
        // into stdout.
        print_json_stdout(&run.report.json_report())
    } else {
        print_stdout(&run.report.outcome.text, false)
    };
    // The last answer went to stdout; why it is not the answer asked for
    // goes to stderr, quiet or not.
    if let (false, Some(error)) = (json, &run.report.outcome.output_error) {
        let _ = writeln!(
            std::io::stderr(),
            "subloop: the answer does not match the output schema: {}",
            subloop::core::text::printable(error)
        );
    }
    // A model that did not answer in time: the flags that help.
    if run.report.outcome.status == subloop::StatusKind::ModelError
        && run.report.outcome.text.contains("no response in time")
    {
        let _ = writeln!(
            std::io::stderr(),
            "subloop: for a slow server (a local model), try --stream, a smaller --max-tokens, or a longer --timeout-read"
        );
    }
    if let Err(err) = printed {
        let _ = writeln!(std::io::stderr(), "subloop: cannot write the output: {err}");
        return std::process::ExitCode::from(1);
    }
    if run.succeeded() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_terminal_sees_escapes_and_hidden_characters_escaped() {
        let hostile = "ok\u{1b}[2J\r\u{202e}evil\u{200b}\nnext";
        assert_eq!(
            terminal_safe(hostile, false),
            "ok\\u{1b}[2J\\r\\u{202e}evil\\u{200b}\nnext"
        );
    }

    #[test]
    fn json_for_the_terminal_is_the_same_value() {
        let value = serde_json::json!({"text": "a\u{202e}b\u{feff}c\u{1b}d\u{9b}e\n\u{2028}f\u{2029}g\u{85}"});
        let text = value.to_string();
        let shown = terminal_safe(&text, true);
        assert!(
            !shown.chars().any(|c| c.is_control() || needs_escape(c)),
            "{shown}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(parsed, value);
    }
}
