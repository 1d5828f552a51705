//! Resuming a run that ended early, from its trace.
//!
//! [`ResumePoint::rebuild`] reads the parent's part of a trace
//! ([`RecordedRun`]) back into a [`Conversation<AwaitingModel>`] by the
//! conversation's own transitions: each recorded reply goes through
//! [`Conversation::receive`] and each recorded round of results through
//! [`Conversation::submit`], so a history rebuilt from disk is checked by the
//! same rules as one built live (a reply that breaks the protocol, a result
//! for an unknown id, an unanswered id are refused, never trusted). After
//! every round the rebuilt history must equal the one the next recorded
//! request carried.
//!
//! The last recorded reply may have tool calls without results: the process
//! was killed while they ran. They are not run again (`run_main` may already
//! have had its effect): each is answered [`INTERRUPTED`] (a `task` call with
//! a report of status `cancelled`), so the model can ask again and the gate
//! asks again. Results a `tool` line recorded (a last round no request
//! carried, as after `call_limit` or `deadline`) are used as recorded. A
//! last request without a reply (killed in flight) or with a failed one
//! (`model_error`) is asked again, and counted once.
//!
//! The run's limits span both parts: the rebuilt conversation already counts
//! the earlier model calls against the budget, and [`Spent`] carries the
//! tokens and delegations used, which [`crate::Agent::resume`] counts before
//! anything runs. The plan is the one the last successful `todo_write` set.

use serde_json::{Value, json};
use thiserror::Error;

use crate::conversation::{
    AfterTools, AwaitingModel, Budget, Conversation, OnEmptyReply, Reply, ToolResult,
};
use crate::error::InputError;
use crate::model::replay::RecordedRun;
use crate::plan::{Plan, PlanItem};
use crate::protocol::{Block, Message, Role, ToolUseId};

/// The result given to a call the earlier run started but did not finish.
pub const INTERRUPTED: &str = "not executed: the run was interrupted before this call finished";

/// Why a trace cannot be resumed. Nothing has run when this is returned.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResumeError {
    /// The recorded run finished with an answer: there is nothing to continue.
    #[error(
        "the recorded run is answered: there is nothing to continue (ask a follow-up question instead)"
    )]
    Answered,
    /// The recorded run ended in a way a continuation cannot mend.
    #[error("the recorded run ended {status} at parent call {call}: it cannot be resumed")]
    Final {
        /// `protocol_error` or `model_stopped`.
        status: String,
        /// The call whose reply ended it.
        call: u32,
    },
    /// The recorded history breaks a rule of the conversation.
    #[error("parent call {call}: {message}")]
    Broken {
        /// The parent call where the history breaks.
        call: u32,
        /// What is wrong.
        message: String,
    },
    /// A follow-up question was given, but the recorded run is not answered.
    #[error(
        "a follow-up question needs an answered run; this one ended {ended}: resume it without a question"
    )]
    NotAnswered {
        /// How the recorded run ended.
        ended: String,
    },
    /// The budget given does not cover the calls already made.
    #[error(
        "the recorded run already made {made} parent calls for its current question: give a --max-calls above {made} to continue it"
    )]
    BudgetSpent {
        /// The calls already made for the current question.
        made: u32,
    },
    /// The question or budget is unusable.
    #[error(transparent)]
    Input(#[from] InputError),
}

/// What the earlier part of the run spent, counted against the run's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// Parent model calls made (and counted by the rebuilt conversation).
    pub calls: u32,
    /// Input + output tokens of every reply, parent and children.
    pub tokens: u64,
    /// Delegations made (children are numbered after them).
    pub delegations: usize,
}

/// A run rebuilt from its trace, ready to continue.
#[derive(Debug)]
pub struct ResumePoint {
    /// The parent's conversation, waiting for the next model call.
    pub conversation: Conversation<AwaitingModel>,
    /// How many of its messages the trace already holds (the next request
    /// line carries only the rest).
    pub sent: usize,
    /// What the earlier part spent.
    pub spent: Spent,
    /// The plan the last successful `todo_write` set, if any.
    pub plan: Option<Plan>,
    /// The calls answered [`INTERRUPTED`], in order.
    pub interrupted: Vec<ToolUseId>,
    /// How the earlier part ended: its `outcome` status, or `interrupted`
    /// when the trace has none (the process was killed).
    pub ended: String,
    /// The follow-up question asked now, if any.
    pub follow_up: Option<String>,
}

impl ResumePoint {
    /// Rebuilds the parent of `run` with `budget` (the whole run's budget,
    /// earlier calls included) and `on_empty` (the run's empty-reply policy).
    pub fn rebuild(
        run: &RecordedRun,
        budget: Budget,
        on_empty: OnEmptyReply,
    ) -> Result<Self, ResumeError> {
        Self::build(run, budget, on_empty, None)
    }

    /// Rebuilds the answered run `run` and asks it the follow-up `question`
    /// ([`Conversation::follow_up`]): `budget` is the new question's; the
    /// tokens and delegations spent still count against the run's limits.
    pub fn follow_up(
        run: &RecordedRun,
        question: &str,
        budget: Budget,
        on_empty: OnEmptyReply,
    ) -> Result<Self, ResumeError> {
        Self::build(run, budget, on_empty, Some(question))
    }

    fn build(
        run: &RecordedRun,
        budget: Budget,
        on_empty: OnEmptyReply,
        question: Option<&str>,
    ) -> Result<Self, ResumeError> {
        let mut follow_up = question;
        let asked = question.map(str::to_owned);
        let messages = run.messages("parent");
        let question = match messages.first() {
            Some(first) if first.role == Role::User => first.text(),
            _ => {
                return Err(broken(1, "the first message is not the user's question"));
            }
        };
        // The recorded calls are rebuilt without a budget; the current
        // question's is checked at the end.
        let unbounded = Budget::from_nonzero(std::num::NonZeroU32::MAX);
        let mut conversation = Conversation::start(&question, unbounded)?.on_empty_reply(on_empty);
        let recorded_calls = run.calls("parent");
        let mut interrupted = Vec::new();
        let mut kept = 0;
        for call in 1..=recorded_calls {
            let number = call;
            // The history this request carried must be the rebuilt one.
            let carried = run
                .request("parent", number)
                .map(|request| request.messages);
            if carried != Some(conversation.history()) {
                return Err(broken(
                    number,
                    "the recorded request does not carry the history its earlier replies and results make",
                ));
            }
            kept = number;
            let reply = match run.reply("parent", number) {
                Some(Ok(reply)) => reply.clone(),
                // Failed or never answered: only the last request may be; it is asked again.
                Some(Err(_)) | None if call == recorded_calls && follow_up.is_none() => {
                    kept = number - 1;
                    break;
                }
                Some(Err(_)) | None if call == recorded_calls => {
                    return Err(ResumeError::NotAnswered {
                        ended: "interrupted".to_owned(),
                    });
                }
                Some(Err(_)) => return Err(broken(number, "a failed request is followed by more")),
                None => {
                    return Err(broken(
                        number,
                        "a request without a reply is followed by more",
                    ));
                }
            };
            match conversation.receive(reply) {
                Reply::Tools(waiting) => {
                    let results = if call < recorded_calls {
                        recorded_results(messages, waiting.history().len()).ok_or_else(|| {
                            broken(
                                number + 1,
                                "the results of this round are not the next message",
                            )
                        })?
                    } else {
                        let lines = run.tools_after_reply("parent", number);
                        last_round(run, lines, waiting.calls(), &mut interrupted)
                    };
                    conversation = match waiting.submit(results) {
                        Ok(AfterTools::Continue(next)) => next,
                        Ok(AfterTools::CallLimit(_)) => {
                            return Err(broken(number, "more calls than a conversation can make"));
                        }
                        Err(rejected) => return Err(broken(number, &rejected.error.to_string())),
                    };
                }
                Reply::Continued(next) => conversation = next,
                Reply::Answered(done) => {
                    // The next question: recorded after this answer, or given now.
                    let (next, next_budget) = if call < recorded_calls {
                        match messages.get(done.history().len()) {
                            Some(message)
                                if message.role == Role::User
                                    && message
                                        .content
                                        .iter()
                                        .all(|block| matches!(block, Block::Text { .. })) =>
                            {
                                (message.text(), unbounded)
                            }
                            _ => {
                                return Err(broken(
                                    number + 1,
                                    "an answer is followed by something other than a question",
                                ));
                            }
                        }
                    } else {
                        (
                            follow_up.take().ok_or(ResumeError::Answered)?.to_owned(),
                            budget,
                        )
                    };
                    conversation = done
                        .follow_up(&next, next_budget)
                        .map_err(|(_, error)| ResumeError::Input(error))?;
                }
                Reply::ModelStopped(done) => {
                    return Err(ResumeError::Final {
                        status: done.status_kind().to_string(),
                        call: number,
                    });
                }
                Reply::ProtocolError(done) => {
                    return Err(if call == recorded_calls {
                        ResumeError::Final {
                            status: done.status_kind().to_string(),
                            call: number,
                        }
                    } else {
                        broken(number, done.text())
                    });
                }
            }
        }
        if follow_up.is_some() {
            return Err(ResumeError::NotAnswered {
                ended: run.outcome().map_or_else(
                    || "interrupted".to_owned(),
                    |outcome| outcome.status.clone(),
                ),
            });
        }
        let conversation = conversation
            .rebudget(budget)
            .map_err(|made| ResumeError::BudgetSpent { made })?;
        // The trace holds the messages of every request kept.
        let sent = if kept == 0 {
            0
        } else {
            run.request("parent", kept)
                .map_or(0, |request| request.messages.len())
        };
        let plan = last_plan(conversation.history());
        let spent = Spent {
            calls: conversation.calls_made(),
            tokens: run.spent_tokens(),
            delegations: run.delegations(),
        };
        let ended = run.outcome().map_or_else(
            || "interrupted".to_owned(),
            |outcome| outcome.status.clone(),
        );
        Ok(Self {
            conversation,
            sent,
            spent,
            plan,
            interrupted,
            ended,
            follow_up: asked,
        })
    }

    /// The trace's `resumed` line fields: the parent calls kept (later lines
    /// of the parent replace any after them), how the earlier part ended,
    /// what it spent, and the calls answered [`INTERRUPTED`].
    pub fn trace_fields(&self) -> Value {
        json!({
            "calls": self.spent.calls,
            "ended": self.ended,
            "tokens": self.spent.tokens,
            "delegations": self.spent.delegations,
            "interrupted": self.interrupted,
            "follow_up": self.follow_up,
        })
    }
}

fn broken(call: u32, message: &str) -> ResumeError {
    ResumeError::Broken {
        call,
        message: message.to_owned(),
    }
}

/// The tool results of the user message at `index` of the recorded history.
fn recorded_results(messages: &[Message], index: usize) -> Option<Vec<ToolResult>> {
    let message = messages.get(index)?;
    if message.role != Role::User {
        return None;
    }
    message
        .content
        .iter()
        .map(|block| match block {
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => Some(ToolResult {
                tool_use_id: tool_use_id.clone(),
                content: content.text(),
                is_error: *is_error,
            }),
            _ => None,
        })
        .collect()
}

/// Results for the last recorded round: each call's `tool` line recorded
/// after that reply (same id and tool name), or [`INTERRUPTED`] when it has
/// none.
fn last_round(
    run: &RecordedRun,
    lines: &[Value],
    calls: &[crate::conversation::ToolCall],
    interrupted: &mut Vec<ToolUseId>,
) -> Vec<ToolResult> {
    calls
        .iter()
        .map(|call| {
            let recorded = lines.iter().find(|line| {
                line.get("id").and_then(Value::as_str) == Some(call.id().as_str())
                    && line.get("name").and_then(Value::as_str) == Some(call.name())
            });
            let content = recorded.and_then(|line| line.get("content").and_then(Value::as_str));
            match (recorded, content) {
                (Some(line), Some(content)) => ToolResult {
                    tool_use_id: call.id().clone(),
                    content: content.to_owned(),
                    is_error: line
                        .get("is_error")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                },
                _ => {
                    interrupted.push(call.id().clone());
                    let content = if call.name() == "task" {
                        json!({
                            "status": "cancelled",
                            "summary": INTERRUPTED,
                            "calls": run.child_calls(call.id().as_str()),
                        })
                        .to_string()
                    } else {
                        INTERRUPTED.to_owned()
                    };
                    ToolResult {
                        tool_use_id: call.id().clone(),
                        content,
                        is_error: true,
                    }
                }
            }
        })
        .collect()
}

/// The plan set by the last `todo_write` call whose result was not an error.
fn last_plan(history: &[Message]) -> Option<Plan> {
    let mut ok_ids = Vec::new();
    for message in history {
        for block in &message.content {
            if let Block::ToolResult {
                tool_use_id,
                is_error: false,
                ..
            } = block
            {
                ok_ids.push(tool_use_id);
            }
        }
    }
    history.iter().rev().find_map(|message| {
        message.content.iter().rev().find_map(|block| match block {
            Block::ToolUse { id, name, input } if name == "todo_write" && ok_ids.contains(&id) => {
                let items: Vec<PlanItem> =
                    serde_json::from_value(input.get("items")?.clone()).ok()?;
                Plan::new(items).ok()
            }
            _ => None,
        })
    })
}
