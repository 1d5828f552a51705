//! Human-readable progress lines on stderr, one per step, tagged by agent.

use std::io::Write;

use subloop::core::agent_id::AgentId;
use subloop::core::call::ToolRecord;
use subloop::core::hook::{HookDecision, HookRecord};
use subloop::core::text::printable;
use subloop::run::monitor::Event;
use subloop::run::monitor::Monitor;

/// Prints progress to stderr.
#[derive(Debug, Default, Clone, Copy)]
pub struct StderrProgress;

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
            Event::InvalidAnswer { call, error } => {
                format!(
                    "[{agent}] model call {call}: the answer does not match the output schema ({}); sent back",
                    printable(error)
                )
            }
            Event::Compacted {
                call,
                trigger,
                compactor,
                tokens,
                replaced,
                history,
                ..
            } => {
                format!(
                    "[{agent}] history compacted before model call {call} ({trigger}, {}): {replaced} messages (about {tokens} tokens) -> {} messages",
                    printable(compactor),
                    history.len()
                )
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
            // A reply is shown by the stream, if at all; an event added
            // later prints nothing until this host learns it.
            Event::Response { .. } | _ => return,
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

    /// A hook that decided something (or failed) gets a line; one that
    /// only looked does not.
    fn hook(&mut self, agent: &AgentId, record: &HookRecord) {
        if record.decision == HookDecision::None {
            return;
        }
        let reason = record
            .reason
            .as_deref()
            .map(|reason| format!(": {}", preview(reason)))
            .unwrap_or_default();
        let _ = writeln!(
            std::io::stderr(),
            "[{agent}]   hook {} `{}` -> {}{reason}",
            record.event,
            printable(&record.command),
            record.decision.as_str()
        );
    }
}
