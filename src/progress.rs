//! Human-readable progress lines on stderr, one per step, tagged by agent.

use std::io::Write;

use crate::agent_id::AgentId;
use crate::driver::Event;
use crate::executor::ToolRecord;
use crate::monitor::Monitor;

/// Prints progress to stderr.
#[derive(Debug, Default, Clone, Copy)]
pub struct StderrProgress;

fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let mut short: String = line.chars().take(100).collect();
    if line.chars().count() > 100 || text.lines().nth(1).is_some() {
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
            Event::ModelFailed { call, failure } => {
                format!("[{agent}] model call {call} failed: {failure}")
            }
            Event::ToolRequested { call } => {
                format!("[{agent}] tool {} ({})", call.name(), call.id())
            }
            Event::ToolFinished { call, output } => {
                let mark = if output.is_error { "error" } else { "ok" };
                format!(
                    "[{agent}]   {} -> {mark}: {}",
                    call.name(),
                    first_line(&output.content)
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
        let _ = writeln!(std::io::stderr(), "[{agent}] warning: {warning}");
    }
}
