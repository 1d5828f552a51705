//! The CLI's `--json` object as typed views of a [`RunReport`], serialized
//! straight to the output: no `serde_json::Value` is built in between.
//!
//! Entries of `tools` are the [`ToolRecord`]s themselves, so a field added
//! to `ToolRecord` appears in the output without a change here.

use serde::Serialize;

use crate::agent::RunReport;
use crate::agent::subagent::ChildRecord;
use crate::core::agent_id::AgentId;
use crate::core::call::{ToolRecord, Warning};
use crate::core::conversation::{Outcome, StatusKind};
use crate::core::hook::HookRecord;
use crate::core::protocol::{ToolUseId, Usage};

/// The `--json` object of a run: `status`, `text`, `calls`, `tools`,
/// `children`, `warnings`, `usage`, `accounting` and `limits`. Borrowed from
/// the report; serialize it with any serde serializer.
#[derive(Debug, Serialize)]
pub(crate) struct JsonReport<'a> {
    status: StatusKind,
    text: &'a str,
    calls: u32,
    tools: &'a [ToolRecord],
    children: Vec<ChildEntry<'a>>,
    warnings: &'a [Warning],
    empty_replies_continued: u32,
    usage: RunUsage<'a>,
    accounting: RunAccounting<'a>,
    limits: LimitsEntry,
    /// The checked answer's value (`--output-schema`).
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a serde_json::Value>,
    /// Why the last answer did not match the output schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    output_error: Option<&'a str>,
    /// The command hooks that ran (`--settings`), in order, each with its agent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    hooks: Vec<HookEntry<'a>>,
}

/// A command hook's run, with the agent it ran for.
#[derive(Debug, Serialize)]
struct HookEntry<'a> {
    agent: &'a AgentId,
    #[serde(flatten)]
    record: &'a HookRecord,
}

#[derive(Debug, Serialize)]
struct ChildEntry<'a> {
    agent: &'a AgentId,
    parent_tool_use_id: &'a ToolUseId,
    task: &'a str,
    status: StatusKind,
    summary: &'a str,
    calls: u32,
    is_error: bool,
    tools: &'a [ToolRecord],
    warnings: &'a [Warning],
    usage: AgentUsage<'a>,
    empty_replies_continued: u32,
    /// The child's checked answer, when it had an output check.
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a serde_json::Value>,
}

#[derive(Debug, Serialize)]
struct AgentUsage<'a> {
    total: Usage,
    per_call: &'a [Usage],
}

#[derive(Debug, Serialize)]
struct RunUsage<'a> {
    parent: AgentUsage<'a>,
    total: Usage,
}

#[derive(Debug, Serialize)]
struct RunAccounting<'a> {
    parent: Accounting<'a>,
    children: Vec<Accounting<'a>>,
    total: Accounting<'a>,
}

/// Model calls, tool calls, delegations, tokens and time of one agent (or of
/// the run); a child's entry also names the child.
#[derive(Debug, Serialize)]
struct Accounting<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<&'a AgentId>,
    model_calls: u64,
    tool_calls: usize,
    delegations: usize,
    tokens: Tokens,
    elapsed_ms: u64,
}

#[derive(Debug, Serialize)]
struct Tokens {
    input: u64,
    output: u64,
}

impl From<Usage> for Tokens {
    fn from(usage: Usage) -> Self {
        Self {
            input: usage.input_tokens,
            output: usage.output_tokens,
        }
    }
}

#[derive(Debug, Serialize)]
struct LimitsEntry {
    max_tools_per_reply: usize,
    max_delegations: usize,
    deadline_secs: Option<f64>,
    max_tokens_total: Option<u64>,
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn accounting<'a>(
    outcome: &Outcome,
    tools: &[ToolRecord],
    delegations: usize,
    elapsed: std::time::Duration,
) -> Accounting<'a> {
    Accounting {
        agent: None,
        model_calls: u64::from(outcome.calls),
        tool_calls: tools.len(),
        delegations,
        tokens: outcome.usage.into(),
        elapsed_ms: millis(elapsed),
    }
}

fn child_entry(child: &ChildRecord) -> ChildEntry<'_> {
    ChildEntry {
        agent: &child.agent,
        parent_tool_use_id: &child.parent_tool_use_id,
        task: &child.task,
        status: child.report.status,
        summary: &child.report.summary,
        calls: child.report.calls,
        is_error: child.report.is_error,
        tools: &child.tools,
        warnings: &child.warnings,
        usage: AgentUsage {
            total: child.outcome.usage,
            per_call: &child.usage_per_call,
        },
        empty_replies_continued: child.empty_replies_continued,
        output: child.outcome.output.as_ref(),
    }
}

impl<'a> JsonReport<'a> {
    /// The view of `report`.
    pub fn new(report: &'a RunReport) -> Self {
        let children = &report.children;
        let total = report.total_usage();
        let total_accounting = Accounting {
            agent: None,
            model_calls: children
                .iter()
                .fold(u64::from(report.outcome.calls), |sum, child| {
                    sum.saturating_add(u64::from(child.outcome.calls))
                }),
            tool_calls: report.tools.len() + children.iter().map(|c| c.tools.len()).sum::<usize>(),
            delegations: children.len(),
            tokens: total.into(),
            elapsed_ms: millis(report.elapsed),
        };
        Self {
            status: report.outcome.status,
            text: &report.outcome.text,
            calls: report.outcome.calls,
            tools: &report.tools,
            children: children.iter().map(child_entry).collect(),
            warnings: &report.warnings,
            empty_replies_continued: report.empty_replies_continued,
            usage: RunUsage {
                parent: AgentUsage {
                    total: report.outcome.usage,
                    per_call: &report.usage_per_call,
                },
                total,
            },
            accounting: RunAccounting {
                parent: accounting(
                    &report.outcome,
                    &report.tools,
                    children.len(),
                    report.elapsed,
                ),
                children: children
                    .iter()
                    .map(|child| Accounting {
                        agent: Some(&child.agent),
                        ..accounting(&child.outcome, &child.tools, 0, child.elapsed)
                    })
                    .collect(),
                total: total_accounting,
            },
            limits: LimitsEntry {
                max_tools_per_reply: report.limits.max_tools_per_reply,
                max_delegations: report.limits.max_delegations,
                deadline_secs: report.limits.deadline.map(|d| d.as_secs_f64()),
                max_tokens_total: report.limits.max_tokens_total,
            },
            output: report.outcome.output.as_ref(),
            output_error: report.outcome.output_error.as_deref(),
            hooks: report
                .audit
                .iter()
                .filter_map(|entry| {
                    entry.hook.as_ref().map(|record| HookEntry {
                        agent: &entry.agent,
                        record,
                    })
                })
                .collect(),
        }
    }
}

impl RunReport {
    /// The CLI's `--json` object: `status`, `text`, `calls`, `tools`,
    /// `children` (agent, task, report, tools), `warnings`,
    /// `empty_replies_continued` (also per child), `usage`, and
    /// `accounting` (per agent and in total: model calls, tool calls,
    /// delegations, tokens, elapsed time) with the run's `limits`, and
    /// `hooks` (each command hook that ran, with its agent) when any did.
    ///
    /// A `Value` for hosts that inspect it; [`RunReport::write_json`] writes
    /// the same object without building one.
    pub fn to_json(&self) -> serde_json::Value {
        // Every key is a string, so this cannot fail; null stands in if it ever did.
        serde_json::to_value(self.json_report()).unwrap_or(serde_json::Value::Null)
    }

    /// The `--json` object as a typed view of this report, to serialize directly.
    pub fn json_report(&self) -> impl serde::Serialize + '_ {
        JsonReport::new(self)
    }

    /// Writes the `--json` object (one line, no newline) to `out`, serialized
    /// straight from the report.
    pub fn write_json(&self, out: impl std::io::Write) -> serde_json::Result<()> {
        serde_json::to_writer(out, &self.json_report())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::agent::subagent::TaskReport;
    use crate::core::call::CallDecision;
    use crate::run::limits::Limits;

    /// How `RunReport::to_json` built the object before (a `Value`, field by
    /// field): the oracle the typed view must match.
    fn built_as_a_value(report: &RunReport) -> Value {
        let accounting = |outcome: &Outcome,
                          tools: &[ToolRecord],
                          delegations: usize,
                          elapsed: Duration| {
            json!({
                "model_calls": outcome.calls,
                "tool_calls": tools.len(),
                "delegations": delegations,
                "tokens": {"input": outcome.usage.input_tokens, "output": outcome.usage.output_tokens},
                "elapsed_ms": u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            })
        };
        let children_accounting: Vec<Value> = report
            .children
            .iter()
            .map(|child| {
                let mut entry = accounting(&child.outcome, &child.tools, 0, child.elapsed);
                entry["agent"] = json!(child.agent);
                entry
            })
            .collect();
        let total = report.total_usage();
        let children: Vec<Value> = report
            .children
            .iter()
            .map(|child| {
                let mut value = json!({
                    "agent": child.agent,
                    "parent_tool_use_id": child.parent_tool_use_id,
                    "task": child.task,
                    "status": child.report.status,
                    "summary": child.report.summary,
                    "calls": child.report.calls,
                    "is_error": child.report.is_error,
                    "tools": child.tools,
                    "warnings": child.warnings,
                    "usage": {"total": child.outcome.usage, "per_call": child.usage_per_call},
                    "empty_replies_continued": child.empty_replies_continued,
                });
                if let Some(output) = &child.outcome.output {
                    value["output"] = output.clone();
                }
                value
            })
            .collect();
        let mut value = json!({
            "status": report.outcome.status,
            "text": report.outcome.text,
            "calls": report.outcome.calls,
            "tools": report.tools,
            "children": children,
            "warnings": report.warnings,
            "empty_replies_continued": report.empty_replies_continued,
            "usage": {
                "parent": {"total": report.outcome.usage, "per_call": report.usage_per_call},
                "total": total,
            },
            "accounting": {
                "parent": accounting(&report.outcome, &report.tools, report.children.len(), report.elapsed),
                "children": children_accounting,
                "total": {
                    "model_calls": report.children.iter().fold(u64::from(report.outcome.calls), |sum, c| sum.saturating_add(u64::from(c.outcome.calls))),
                    "tool_calls": report.tools.len() + report.children.iter().map(|c| c.tools.len()).sum::<usize>(),
                    "delegations": report.children.len(),
                    "tokens": {"input": total.input_tokens, "output": total.output_tokens},
                    "elapsed_ms": u64::try_from(report.elapsed.as_millis()).unwrap_or(u64::MAX),
                },
            },
            "limits": {
                "max_tools_per_reply": report.limits.max_tools_per_reply,
                "max_delegations": report.limits.max_delegations,
                "deadline_secs": report.limits.deadline.map(|d| d.as_secs_f64()),
                "max_tokens_total": report.limits.max_tokens_total,
            },
        });
        if let Some(output) = &report.outcome.output {
            value["output"] = output.clone();
        }
        if let Some(error) = &report.outcome.output_error {
            value["output_error"] = json!(error);
        }
        value
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    fn outcome(status: StatusKind, text: &str, calls: u32, usage: Usage) -> Outcome {
        Outcome {
            status,
            text: text.to_owned(),
            calls,
            messages: Vec::new(),
            usage,
            output: None,
            output_error: None,
        }
    }

    fn record(name: &str, id: &str, decision: CallDecision, is_error: bool) -> ToolRecord {
        ToolRecord {
            name: name.to_owned(),
            id: ToolUseId::new(id),
            decision,
            is_error,
            content: format!("result of {id}").into(),
        }
    }

    fn report(children: usize, limits: Limits) -> RunReport {
        let children = (1..=children)
            .map(|number| {
                let id = ToolUseId::new(format!("toolu_task_{number}"));
                let agent = AgentId::Child {
                    number,
                    parent_tool_use_id: id.clone(),
                };
                ChildRecord {
                    agent: agent.clone(),
                    parent_tool_use_id: id,
                    task: format!("task \"{number}\"\n"),
                    report: TaskReport {
                        status: StatusKind::CallLimit,
                        summary: "ran out".to_owned(),
                        calls: 2,
                        is_error: true,
                    },
                    outcome: outcome(StatusKind::CallLimit, "ran out", 2, usage(7, 3)),
                    usage_per_call: vec![usage(3, 1), usage(4, 2)],
                    tools: vec![record("read_file", "c1", CallDecision::NotRequired, false)],
                    warnings: vec![Warning {
                        agent,
                        text: "child warned".to_owned(),
                    }],
                    elapsed: Duration::from_millis(12),
                    empty_replies_continued: 1,
                }
            })
            .collect();
        RunReport {
            outcome: outcome(StatusKind::Answered, "done \u{1b}[0m ✓", 3, usage(100, 20)),
            usage_per_call: vec![usage(40, 5), usage(60, 15)],
            tools: vec![
                record("run_main", "r1", CallDecision::Denied, true),
                record("task", "toolu_task_1", CallDecision::NotRequired, true),
                record("nope", "x", CallDecision::Unregistered, true),
            ],
            children,
            warnings: vec![Warning {
                agent: AgentId::Parent,
                text: "parent warned".to_owned(),
            }],
            audit: Vec::new(),
            elapsed: Duration::from_millis(1234),
            limits,
            empty_replies_continued: 2,
        }
    }

    #[test]
    fn the_typed_view_writes_the_object_that_was_built_as_a_value() {
        let limited = Limits {
            max_tools_per_reply: 3,
            max_delegations: 1,
            deadline: Some(Duration::from_millis(2500)),
            max_tokens_total: Some(999),
        };
        for report in [
            report(0, Limits::default()),
            report(1, limited),
            report(3, Limits::default()),
        ] {
            let expected = built_as_a_value(&report);
            let mut written = Vec::new();
            report.write_json(&mut written).expect("written");
            let parsed: Value = serde_json::from_slice(&written).expect("one JSON object");
            assert_eq!(parsed, expected);
            assert_eq!(report.to_json(), expected);
            // Same keys, same values: only the order of keys may differ.
            assert_eq!(written.len(), expected.to_string().len());
        }
    }
}
