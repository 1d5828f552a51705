//! Human-readable progress lines on stderr, one per step, tagged by agent.

use std::io::Write;

use crate::agent_id::AgentId;
use crate::driver::Event;
use crate::executor::ToolRecord;
use crate::monitor::Monitor;

/// Prints progress to stderr.
#[derive(Debug, Default, Clone, Copy)]
pub struct StderrProgress;

/// Text from a model or a tool, made safe for a terminal: control
/// characters (escape sequences, line breaks), the Unicode line and
/// paragraph separators, bidi controls and zero-width characters are shown
/// escaped.
pub fn printable(text: &str) -> String {
    escape_controls(text, false)
}

/// Like the progress lines' escaping, but line breaks are kept: for model
/// text streamed to the terminal as it arrives.
pub fn printable_lines(text: &str) -> String {
    escape_controls(text, true)
}

/// Bidi controls (U+202A–U+202E, U+2066–U+2069) and zero-width characters
/// (U+200B–U+200F, U+2060, U+FEFF): invisible, yet they change how text
/// around them reads, so a terminal is shown them escaped.
pub fn is_hidden_format(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200b}'..='\u{200f}' | '\u{2060}' | '\u{feff}')
}

/// The Unicode line and paragraph separators (U+2028, U+2029): not control
/// characters, yet text viewers and some terminals break lines at them, so
/// text holding one could pass for a line of its own. Shown escaped like
/// `\n`, even where line breaks are kept (only `\n` is). NEL (U+0085) is a
/// control character and escaped as one.
pub fn is_unicode_line_break(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}')
}

fn escape_controls(text: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && !(keep_newlines && c == '\n') {
            out.extend(c.escape_default());
        } else if is_hidden_format(c) || is_unicode_line_break(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// A one-line preview of a tool's output; a `run_main` report shows its
/// exit code and the start of its stdout.
fn preview(text: &str) -> String {
    let report: Option<serde_json::Value> = serde_json::from_str(text).ok();
    let summary = match report
        .as_ref()
        .and_then(|r| Some((r.get("exit_code")?, r.get("stdout")?.as_str()?)))
    {
        Some((code, stdout)) => format!("exit code {code}, stdout: {stdout:?}"),
        None => text.to_owned(),
    };
    let line = summary.lines().next().unwrap_or_default();
    let mut short = printable(&line.chars().take(120).collect::<String>());
    if line.chars().count() > 120 || summary.lines().nth(1).is_some() {
        short.push('…');
    }
    short
}

impl Monitor for StderrProgress {
    fn event(&mut self, agent: &AgentId, event: &Event<'_>) {
        let line = match event {
            Event::Request { call, request, .. } => {
                format!(
                    "[{agent}] model call {call} (tools: {})",
                    request.tool_names().join(", ")
                )
            }
            Event::EmptyReplyContinued { call, prompt } => {
                format!("[{agent}] model call {call} gave an empty reply; answering: {prompt}")
            }
            Event::ModelFailed { call, failure } => {
                format!(
                    "[{agent}] model call {call} failed: {}",
                    printable(&failure.to_string())
                )
            }
            Event::ToolRequested { call } => {
                format!(
                    "[{agent}] tool {} ({})",
                    printable(call.name()),
                    printable(call.id().as_str())
                )
            }
            Event::ToolFinished { call, output } => {
                let mark = if output.is_error { "error" } else { "ok" };
                format!(
                    "[{agent}]   {} -> {mark}: {}",
                    printable(call.name()),
                    preview(&output.content)
                )
            }
            Event::Finished { outcome } => {
                format!(
                    "[{agent}] finished: {} after {} model call(s)",
                    outcome.status, outcome.calls
                )
            }
            Event::Response { .. } => return,
        };
        let _ = writeln!(std::io::stderr(), "{line}");
    }

    fn tool(&mut self, _agent: &AgentId, _record: &ToolRecord) {}

    fn warning(&mut self, agent: &AgentId, warning: &str) {
        let _ = writeln!(
            std::io::stderr(),
            "[{agent}] warning: {}",
            printable(warning)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_text_cannot_forge_lines_or_send_escape_sequences() {
        let hostile = "ok\u{1b}[31m\r[parent] forged\nnext";
        assert_eq!(printable(hostile), "ok\\u{1b}[31m\\r[parent] forged\\nnext");
        assert_eq!(
            printable_lines(hostile),
            "ok\\u{1b}[31m\\r[parent] forged\nnext"
        );
    }

    #[test]
    fn bidi_controls_and_zero_width_characters_are_shown_escaped() {
        let hostile = "a\u{202e}b\u{2066}c\u{200b}d\u{2060}e\u{feff}f\u{200f}g";
        assert_eq!(
            printable(hostile),
            "a\\u{202e}b\\u{2066}c\\u{200b}d\\u{2060}e\\u{feff}f\\u{200f}g"
        );
        assert_eq!(printable("plain é ü 日本"), "plain é ü 日本");
    }

    #[test]
    fn unicode_line_breaks_are_shown_escaped_even_where_newlines_are_kept() {
        let hostile = "a\u{2028}[parent] forged\u{2029}b\u{85}c\nd";
        assert_eq!(
            printable(hostile),
            "a\\u{2028}[parent] forged\\u{2029}b\\u{85}c\\nd"
        );
        assert_eq!(
            printable_lines(hostile),
            "a\\u{2028}[parent] forged\\u{2029}b\\u{85}c\nd"
        );
    }
}
