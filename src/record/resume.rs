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
//! have had its effect): each is answered [`ResumeFile::INTERRUPTED`] (a `task` call with
//! a report of status `cancelled`), so the model can ask again and the gate
//! asks again. Results a `tool` line recorded (a last round no request
//! carried, as after `call_limit` or `deadline`) are used as recorded. A
//! last request without a reply (killed in flight) or with a failed one
//! (`model_error`) is asked again, and counted once.
//!
//! The run's limits span both parts: the rebuilt conversation already counts
//! the earlier model calls against the budget, and the point carries the
//! tokens and delegations used, which [`crate::Agent::resume`] counts before
//! anything runs. The plan is the one the last successful `todo_write` set.

use serde_json::{Value, json};
use thiserror::Error;

use crate::agent::output::SchemaOutput;
use crate::core::compaction::Recorded;
use crate::core::conversation::{
    AfterTools, AwaitingModel, Budget, Compacted, Conversation, OnEmptyReply, Overflow, Reply,
    StatusKind, ToolResult,
};
use crate::core::error::InputError;
use crate::core::plan::{Plan, PlanItem};
use crate::core::protocol::{Block, Message, Role, ToolUseId};
use crate::record::invariants::Breach;
use crate::record::recorded::{RecordedCompaction, RecordedRun, ReplayError};

/// A trace about to be resumed, read through its file: the run it records
/// (its whole lines: a last line a crash cut short is dropped) and the file,
/// for the resumed run's lines.
///
/// Open the file with [`crate::record::target::open_to_resume`], which
/// checks where it is and takes its lock before a byte is read, so two
/// resumes of one trace cannot both go on from the same point.
#[derive(Debug)]
pub struct ResumeFile {
    file: std::fs::File,
    run: RecordedRun,
    keep: u64,
}

impl ResumeFile {
    /// The result given to a call the earlier run started but did not finish.
    pub const INTERRUPTED: &'static str = INTERRUPTED;

    /// Reads the trace from `file`, opened from `path` (named in errors).
    pub fn read(mut file: std::fs::File, path: &std::path::Path) -> Result<Self, ReplayError> {
        use std::io::Read as _;
        let read_error = |source| ReplayError::Read {
            path: path.to_owned(),
            source,
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(read_error)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            read_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "stream did not contain valid UTF-8",
            ))
        })?;
        let whole = match text.rfind('\n') {
            Some(end) => text.get(..=end).unwrap_or_default(),
            None => "",
        };
        let run = RecordedRun::parse(whole).map_err(|message| ReplayError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        Ok(Self {
            file,
            run,
            keep: u64::try_from(whole.len()).unwrap_or(u64::MAX),
        })
    }

    /// The run the trace records, to rebuild with [`ResumePoint::rebuild`]
    /// or [`ResumePoint::follow_up`].
    pub fn run(&self) -> &RecordedRun {
        &self.run
    }

    /// The trace file cut to its whole lines and positioned at its end, for
    /// the resumed run's lines (give it to a [`crate::record::trace::TraceWriter`]);
    /// the lock goes with it.
    pub fn append(&self) -> std::io::Result<std::fs::File> {
        use std::io::Seek as _;
        let file = self.file.try_clone()?;
        file.set_len(self.keep)?;
        (&file).seek(std::io::SeekFrom::End(0))?;
        Ok(file)
    }
}

/// The result given to a call the earlier run started but did not finish.
pub(crate) const INTERRUPTED: &str =
    "not executed: the run was interrupted before this call finished";

/// Why a trace cannot be resumed. Nothing has run when this is returned.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
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
    /// The run was recorded in another workspace than the one given.
    #[error(
        "the run was recorded in the workspace {recorded}, not {given}: resume it in {recorded}, or allow another workspace to go on in {given}"
    )]
    OtherWorkspace {
        /// The workspace the trace records.
        recorded: String,
        /// The workspace given now.
        given: String,
    },
    /// The trace contradicts itself (see [`RecordedRun::consistency`]).
    #[error("the trace contradicts itself at {0}")]
    Inconsistent(Breach),
    /// The budget given does not cover the calls already made.
    #[error(
        "the recorded run already made {made} parent calls for its current question: give a call budget above {made} to continue it"
    )]
    BudgetSpent {
        /// The calls already made for the current question.
        made: u32,
    },
    /// The question or budget is unusable.
    #[error(transparent)]
    Input(#[from] InputError),
}

use crate::agent::{ResumePoint, Spent};

impl ResumePoint {
    /// Rebuilds the parent of `run` with `budget` (the whole run's budget,
    /// earlier calls included) and `on_empty` (the run's empty-reply policy).
    pub fn rebuild(
        run: &RecordedRun,
        budget: Budget,
        on_empty: OnEmptyReply,
    ) -> Result<Self, ResumeError> {
        consistent(run)?;
        Self::build(run, "parent", budget, on_empty, None)
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
        consistent(run)?;
        Self::build(run, "parent", budget, on_empty, Some(question))
    }

    /// Checks that the recorded history of `agent` (`parent` or `child-N`)
    /// is what the conversation's own transitions make of its recorded
    /// replies and results — the rules [`ResumePoint::rebuild`] holds a
    /// trace to — whether or not the run could go on. The error is the
    /// first place it breaks ([`ResumeError::Broken`] or a question that
    /// could not start). A run that could not go on (answered, ended by a
    /// protocol error) still passes when its history holds.
    pub fn check_history(run: &RecordedRun, agent: &str) -> Result<(), ResumeError> {
        let unbounded = Budget::from_nonzero(std::num::NonZeroU32::MAX);
        let mut first = None;
        // The trace does not say which empty-reply policy the run had: a
        // history that holds under either holds.
        for on_empty in [OnEmptyReply::Stop, OnEmptyReply::Continue] {
            match Self::build(run, agent, unbounded, on_empty, None) {
                Err(err @ (ResumeError::Broken { .. } | ResumeError::Input(_))) => {
                    first.get_or_insert(err);
                }
                Ok(_) | Err(_) => return Ok(()),
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn build(
        run: &RecordedRun,
        agent: &str,
        budget: Budget,
        on_empty: OnEmptyReply,
        question: Option<&str>,
    ) -> Result<Self, ResumeError> {
        let mut follow_up = question;
        let asked = question.map(str::to_owned);
        let question = match run.history_of(agent, 1).first() {
            Some(first) if first.role == Role::User => first.text(),
            _ => {
                return Err(broken(1, "the first message is not the user's question"));
            }
        };
        // The recorded calls are rebuilt without a budget; the current
        // question's is checked at the end.
        let unbounded = Budget::from_nonzero(std::num::NonZeroU32::MAX);
        let mut fresh = Conversation::new(&question, unbounded)?.on_empty_reply(on_empty);
        // Answers are checked as the recorded run checked them, so an answer
        // that was sent back is rebuilt as one (the number of retries the
        // run allowed is not recorded: the rebuild allows any; the resumed
        // run applies its own).
        if let Some(schema) = run.output_schema(agent) {
            fresh = fresh.expect_output(SchemaOutput::shared(schema.clone()), u32::MAX);
        }
        let mut conversation = fresh.begin();
        let recorded_calls = run.calls(agent);
        let mut interrupted = Vec::new();
        let mut kept = 0;
        // Both histories only grow: each request compares what it added.
        let mut verified = 0;
        // Compactions before the next request already taken (the one a
        // refused request forced).
        let mut taken = 0;
        let mut compacted_sent = None;
        for call in 1..=recorded_calls {
            let number = call;
            // The recorded compactions before this request, through the
            // conversation's own transition: each must replace the history
            // rebuilt so far and keep the protocol.
            for (compaction, replaced, history) in run
                .compactions_before(agent, number)
                .into_iter()
                .skip(taken)
            {
                conversation = take_compaction(conversation, compaction, replaced, history)
                    .map_err(|reason| broken(number, &reason))?;
                verified = 0;
            }
            taken = 0;
            let messages = run.history_of(agent, number);
            // The history this request carried must be the rebuilt one.
            let carried = run.request(agent, number).map(|request| request.messages);
            let history = conversation.history();
            let same = carried.is_some_and(|carried| {
                carried.len() == history.len() && carried.get(verified..) == history.get(verified..)
            });
            if !same {
                return Err(broken(
                    number,
                    "the recorded request does not carry the history its earlier replies and results make",
                ));
            }
            verified = history.len();
            kept = number;
            compacted_sent = None;
            // Refused for its length: the compaction it forced is recorded
            // before the next request (which may never have been sent: the
            // resumed run sends it).
            let forced = match run.reply(agent, number) {
                Some(Err(failure))
                    if failure.kind() == Some(&crate::core::error::FailureKind::ContextWindow) =>
                {
                    run.compactions_before(agent, number + 1)
                        .into_iter()
                        .next()
                        .map(|compaction| (failure, compaction))
                }
                _ => None,
            };
            if let Some((failure, (compaction, replaced, history))) = forced {
                if replaced != conversation.history() {
                    return Err(broken(
                        number + 1,
                        "the compaction does not replace the history the refused request carried",
                    ));
                }
                let recorded = Recorded {
                    name: &compaction.compactor,
                    history,
                };
                conversation = match conversation.overflowed(failure.clone(), Ok(&recorded)) {
                    Overflow::Compacted(next) => next,
                    Overflow::Overflowed(done) => {
                        return Err(broken(number + 1, done.text()));
                    }
                };
                taken = 1;
                verified = 0;
                if call == recorded_calls {
                    compacted_sent = Some(conversation.history().len());
                }
                continue;
            }
            let reply = match run.reply(agent, number) {
                Some(Ok(reply)) => reply.clone(),
                // Failed or never answered: only the last request may be; it is asked again.
                Some(Err(_)) | None if call == recorded_calls && follow_up.is_none() => {
                    kept = number - 1;
                    // A compaction before it stands: the trace keeps it,
                    // and its history is what is on record.
                    if !run.compactions_before(agent, number).is_empty() {
                        compacted_sent = Some(conversation.history().len());
                    }
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
                        let lines = run.tools_after_reply(agent, number);
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
                Reply::Continued(next) | Reply::InvalidAnswer { next, .. } => conversation = next,
                Reply::InvalidOutput(done) => {
                    return Err(ResumeError::Final {
                        status: done.status_kind().to_string(),
                        call: number,
                    });
                }
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
        // A compaction after the last request, before one that was never
        // sent: the resumed run sends the history it made.
        if kept == recorded_calls && follow_up.is_none() {
            let next = recorded_calls.saturating_add(1);
            let compactions = run.compactions_before(agent, next);
            for (compaction, replaced, history) in compactions.into_iter().skip(taken) {
                conversation = take_compaction(conversation, compaction, replaced, history)
                    .map_err(|reason| broken(next, &reason))?;
                compacted_sent = Some(conversation.history().len());
            }
        }
        if follow_up.is_some() {
            return Err(ResumeError::NotAnswered {
                ended: run.recorded_outcome().map_or_else(
                    || "interrupted".to_owned(),
                    |outcome| outcome.status.to_string(),
                ),
            });
        }
        let conversation = conversation
            .rebudget(budget)
            .map_err(|made| ResumeError::BudgetSpent { made })?;
        // The trace holds the messages of every request kept.
        let sent = if let Some(sent) = compacted_sent {
            sent
        } else if kept == 0 {
            0
        } else {
            run.request(agent, kept)
                .map_or(0, |request| request.messages.len())
        };
        let plan = last_plan(conversation.history());
        let spent = Spent {
            calls: conversation.calls_made(),
            tokens: run.spent_tokens(),
            delegations: run.delegations(),
        };
        let ended = run.recorded_outcome().map_or_else(
            || "interrupted".to_owned(),
            |outcome| outcome.status.to_string(),
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
    /// what it spent, and the calls answered [`ResumeFile::INTERRUPTED`].
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

/// Takes a recorded compaction again, through [`Conversation::compact`]:
/// `replaced` (what it replaced) must be the rebuilt history, with what
/// the compaction saw added after the last request, and `history` must
/// keep the protocol and the question.
fn take_compaction(
    conversation: Conversation<AwaitingModel>,
    compaction: &RecordedCompaction,
    replaced: &[Message],
    history: &[Message],
) -> Result<Conversation<AwaitingModel>, String> {
    if replaced != conversation.history() {
        return Err(format!(
            "the compaction before request {} does not replace the history the earlier replies and results make",
            compaction.call
        ));
    }
    let recorded = Recorded {
        name: &compaction.compactor,
        history,
    };
    match conversation.compact(&recorded) {
        Compacted::Shortened(next) => Ok(next),
        Compacted::Unchanged(_) => Err("the compaction changed nothing".to_owned()),
        Compacted::Refused { reason, .. } => Err(reason),
    }
}

/// The first way `run` contradicts itself, as an error: the parent's own
/// history breaking as [`ResumeError::Broken`], anything else as
/// [`ResumeError::Inconsistent`].
fn consistent(run: &RecordedRun) -> Result<(), ResumeError> {
    ResumePoint::check_history(run, "parent")?;
    match consistency(run).into_iter().next() {
        Some(first) => Err(ResumeError::Inconsistent(first)),
        None => Ok(()),
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
/// after that reply (same id and tool name), or [`ResumeFile::INTERRUPTED`] when it has
/// none.
fn last_round(
    run: &RecordedRun,
    lines: &[Value],
    calls: &[crate::core::conversation::ToolCall],
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

/// At most this many characters of a text in an [`Breach`].
const SHOWN: usize = 60;

fn shown(text: &str) -> String {
    let mut short: String = text.chars().take(SHOWN).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    format!("{short:?}")
}

impl RecordedRun {
    /// The rules by which this recorded run must agree with itself, one set for
    /// every reader that trusts a trace ([`ResumePoint::rebuild`] refuses a
    /// trace that breaks one; [`crate::record::invariants::Policy::check`] reports each as a
    /// breach of its `Consistent` invariant):
    ///
    /// - each agent's history is what the conversation's own transitions make
    ///   of its recorded replies and results ([`ResumePoint::check_history`]);
    /// - each `tool` line answers a call of the reply before it, once, in call
    ///   order, and says what the next request sent the model for that call
    ///   (content and `is_error`); a call the next request answered has its
    ///   `tool` line unless it was answered [`ResumeFile::INTERRUPTED`] on a resume;
    /// - a run that ended after a whole round (its outcome `call_limit`,
    ///   `deadline`, `token_limit`, `delegation_limit`, or a `cancelled` that no
    ///   signal forced) has a `tool` line for every call of its last round;
    /// - the parent's outcome agrees with its last reply, in its status and,
    ///   where the loop derives it from that reply, its text;
    /// - every child was started by a `task` call of the parent.
    pub fn consistency(&self) -> Vec<Breach> {
        consistency(self)
    }
}

/// The breaches of [`RecordedRun::consistency`].
fn consistency(run: &RecordedRun) -> Vec<Breach> {
    let mut found = Vec::new();
    let agents: Vec<(String, u32)> = run
        .agents()
        .map(|(agent, calls)| (agent.to_owned(), calls))
        .collect();
    for (agent, calls) in &agents {
        let mut note = |call: Option<u32>, id: Option<&str>, detail: String| {
            found.push(Breach {
                agent: agent.clone(),
                call,
                id: id.map(str::to_owned),
                detail,
            });
        };
        match ResumePoint::check_history(run, agent) {
            Ok(()) => {}
            Err(ResumeError::Broken { call, message }) => note(Some(call), None, message),
            Err(other) => note(Some(1), None, other.to_string()),
        }
        tool_lines_agree(run, agent, *calls, &mut note);
        if agent != "parent" {
            match run.started_by(agent) {
                None => note(
                    Some(1),
                    None,
                    "a child without the task call that started it (parent_tool_use_id)".to_owned(),
                ),
                Some(id) if run.delegation(agent).is_none() => note(
                    Some(1),
                    Some(id),
                    format!("started by {id}, which is no task call of the parent"),
                ),
                Some(_) => {}
            }
        }
    }
    if let Some(outcome) = run.recorded_outcome() {
        let calls = run.calls("parent");
        if let Some(detail) = outcome_disagrees(outcome, run.reply("parent", calls)) {
            found.push(Breach {
                agent: "parent".to_owned(),
                call: Some(calls),
                id: None,
                detail,
            });
        }
    }
    found
}

/// How the recorded `outcome` disagrees with `last`, the parent's last
/// recorded reply (`Err`: its request failed; `None`: it has none), by the
/// loop's own rules; `None` when it agrees. The one rule `view --check`
/// (the `consistent` invariant) and a resume both hold an outcome to:
///
/// - its status: `answered` only after an answer, and an answer is
///   followed by `answered`, `invalid_output` or a stop (`cancelled`,
///   `deadline`, `token_limit`, `delegation_limit`), since a limit or a
///   signal may end the run before its outcome is written; a
///   `model_stopped`, `protocol_error` or `model_error` outcome only after
///   a reply (or a failure) that ends the conversation so;
/// - its text, for the statuses whose text the conversation derives from
///   the last reply: [`expected_outcome`] — the answer's text (`answered`,
///   `invalid_output`), the stop reason with the reply's text
///   (`model_stopped`), the violation (`protocol_error`, with the note an
///   empty reply under `--on-empty-reply continue` adds), the failure
///   (`model_error`). The text of a stop (a limit, a signal) is the host's
///   and is not judged.
pub(crate) fn outcome_disagrees(
    outcome: &crate::record::recorded::RecordedOutcome,
    last: Option<&crate::providers::scripted::ScriptedReply>,
) -> Option<String> {
    let expected = last.and_then(expected_outcome);
    let answer = matches!(&expected, Some((StatusKind::Answered, _)));
    let what = match last {
        Some(Ok(_)) if answer => "is an answer",
        Some(Ok(_)) => "is not an answer",
        Some(Err(_)) => "failed",
        None => "is missing",
    };
    let status = outcome.status;
    // After an answer the run may still have been stopped by a limit or
    // a signal before its outcome was written; nothing else follows one.
    let after_answer = matches!(
        status,
        StatusKind::Answered
            | StatusKind::InvalidOutput
            | StatusKind::Cancelled
            | StatusKind::Deadline
            | StatusKind::TokenLimit
            | StatusKind::DelegationLimit
    );
    if (status == StatusKind::Answered && !answer) || (answer && !after_answer) {
        return Some(format!(
            "the outcome says {status}, but the last reply {what}"
        ));
    }
    let derived = matches!(
        status,
        StatusKind::Answered
            | StatusKind::InvalidOutput
            | StatusKind::ModelStopped
            | StatusKind::ProtocolError
            | StatusKind::ModelError
    );
    if !derived {
        return None;
    }
    let Some((kind, text)) = expected else {
        return Some(format!(
            "the outcome says {status}, but the last reply {what}"
        ));
    };
    // An answer that failed the output check keeps the answer's text.
    let same_kind =
        kind == status || (kind == StatusKind::Answered && status == StatusKind::InvalidOutput);
    if !same_kind {
        return Some(format!(
            "the outcome says {status}, but the last reply ends the conversation {kind}"
        ));
    }
    let agrees = outcome.text == text
        || (status == StatusKind::ProtocolError
            && EMPTY_REPLY_NOTES
                .iter()
                .any(|note| outcome.text.strip_suffix(note) == Some(text.as_str())));
    (!agrees).then(|| {
        let (recorded, given) = from_first_difference(&outcome.text, &text);
        format!(
            "the outcome's text is not the one its last reply gives ({status}): it reads {recorded} where the reply gives {given}"
        )
    })
}

/// `a` and `b` as shown in an [`Breach`], each from a little before
/// where they first differ, so the difference is in sight.
fn from_first_difference(a: &str, b: &str) -> (String, String) {
    let same = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    // A short common start is shown whole; a long one only by its end.
    let skip = if same > SHOWN / 3 { same - 10 } else { 0 };
    let tail = |text: &str| {
        let rest: String = text.chars().skip(skip).collect();
        if skip > 0 {
            shown(&format!("…{rest}"))
        } else {
            shown(&rest)
        }
    };
    (tail(a), tail(b))
}

/// What the notes an empty reply's `protocol_error` gets under
/// `--on-empty-reply continue` may add to its text.
const EMPTY_REPLY_NOTES: [&str; 2] = [
    crate::core::conversation::SECOND_EMPTY_REPLY_NOTE,
    crate::core::conversation::NO_CALL_TO_CONTINUE_NOTE,
];

/// The status and text the conversation finishes with when `reply` is the
/// last thing it gets, by its own transitions ([`Conversation::receive`],
/// [`Conversation::model_failed`]); `None` when the reply does not finish
/// it (it asks for tools).
pub(crate) fn expected_outcome(
    reply: &crate::providers::scripted::ScriptedReply,
) -> Option<(StatusKind, String)> {
    let unbounded = Budget::from_nonzero(std::num::NonZeroU32::MAX);
    let conversation = Conversation::start("?", unbounded).ok()?;
    let outcome = match reply {
        Err(failure) => conversation.model_failed(failure.clone()).into_outcome(),
        Ok(reply) => match conversation.receive(reply.clone()) {
            Reply::Answered(done) => done.into_outcome(),
            Reply::ModelStopped(done) => done.into_outcome(),
            Reply::ProtocolError(done) => done.into_outcome(),
            Reply::InvalidOutput(done) => done.into_outcome(),
            Reply::Tools(_) | Reply::Continued(_) | Reply::InvalidAnswer { .. } => return None,
        },
    };
    Some((outcome.status, outcome.text))
}

/// Files an inconsistency: at which call, about which id, what.
type Note<'a> = &'a mut dyn FnMut(Option<u32>, Option<&str>, String);

/// The `tool` lines of `agent` against the calls they answer (see [`RecordedRun::consistency`]).
fn tool_lines_agree(run: &RecordedRun, agent: &str, calls: u32, note: Note<'_>) {
    let early = run
        .tools(agent)
        .len()
        .saturating_sub(run.tools_after_reply(agent, 1).len());
    if early > 0 {
        note(
            Some(1),
            None,
            format!("{early} tool line(s) before any reply"),
        );
    }
    let whole_round = agent == "parent"
        && run.recorded_outcome().is_some_and(|outcome| {
            matches!(
                outcome.status,
                StatusKind::CallLimit
                    | StatusKind::Deadline
                    | StatusKind::TokenLimit
                    | StatusKind::DelegationLimit
            ) || (outcome.status == StatusKind::Cancelled
                && !outcome.text.starts_with("cancelled by "))
        });
    for call in 1..=calls {
        let lines = run.tools_of_reply(agent, call);
        let asked: Vec<&str> = match run.reply(agent, call) {
            Some(Ok(reply)) => reply
                .content
                .iter()
                .filter_map(|block| match block {
                    crate::core::protocol::ReplyBlock::Known(Block::ToolUse { id, .. }) => {
                        Some(id.as_str())
                    }
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let line_ids: Vec<&str> = lines
            .iter()
            .map(|line| line.get("id").and_then(Value::as_str).unwrap_or_default())
            .collect();
        for id in &line_ids {
            if !asked.contains(id) {
                note(
                    Some(call),
                    Some(id),
                    format!("a tool line for {id}, which reply {call} did not ask for"),
                );
            }
        }
        // The lines of calls the reply asked for (the others are noted
        // above) answer them once each, in call order.
        let known: Vec<&str> = line_ids
            .iter()
            .copied()
            .filter(|id| asked.contains(id))
            .collect();
        let expected: Vec<&str> = asked
            .iter()
            .copied()
            .filter(|id| known.contains(id))
            .collect();
        if known != expected {
            note(
                Some(call),
                None,
                format!("tool lines {line_ids:?} do not answer {asked:?} once each, in order"),
            );
        }
        // What the next request sent the model for these calls.
        let sent = run
            .request(agent, call)
            .map(|request| request.messages.len() + 1)
            .filter(|_| call < calls)
            .and_then(|index| run.history_of(agent, call).get(index));
        for id in &asked {
            let line = lines
                .iter()
                .find(|line| line.get("id").and_then(Value::as_str) == Some(id));
            let result = sent.and_then(|message| {
                message.content.iter().find_map(|block| match block {
                    Block::ToolResult {
                        tool_use_id,
                        content,
                        is_error,
                    } if tool_use_id.as_str() == *id => Some((content.text(), *is_error)),
                    _ => None,
                })
            });
            match (line, result) {
                (Some(line), Some((content, is_error))) => {
                    let recorded = line
                        .get("content")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let recorded_error = line.get("is_error").and_then(Value::as_bool);
                    if recorded != content || recorded_error != Some(is_error) {
                        note(
                            Some(call),
                            Some(id),
                            format!(
                                "the tool line says {} (is_error {}), the next request sent {} (is_error {is_error})",
                                shown(recorded),
                                recorded_error.unwrap_or_default(),
                                shown(&content)
                            ),
                        );
                    }
                }
                (None, Some((content, _))) if !content.contains(INTERRUPTED) => note(
                    Some(call),
                    Some(id),
                    "the next request answered this call, but it has no tool line".to_owned(),
                ),
                (None, None) if call == calls && whole_round => note(
                    Some(call),
                    Some(id),
                    "the run ended after this round, but this call has no tool line".to_owned(),
                ),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::error::{FailureKind, ModelFailure};
    use crate::core::protocol::{ModelResponse, StopReason};
    use crate::record::recorded::RecordedOutcome;

    fn outcome(status: StatusKind, text: &str) -> RecordedOutcome {
        RecordedOutcome {
            status,
            text: text.to_owned(),
        }
    }

    #[test]
    fn the_outcome_text_is_the_one_the_conversation_gives_the_last_reply() {
        let answer = Ok(ModelResponse::answer("42"));
        assert_eq!(
            outcome_disagrees(&outcome(StatusKind::Answered, "42"), Some(&answer)),
            None
        );
        assert_eq!(
            outcome_disagrees(&outcome(StatusKind::InvalidOutput, "42"), Some(&answer)),
            None
        );
        // A stop after an answer has the host's text.
        assert_eq!(
            outcome_disagrees(&outcome(StatusKind::Deadline, "deadline"), Some(&answer)),
            None
        );
        let edited = outcome_disagrees(&outcome(StatusKind::Answered, "43"), Some(&answer));
        assert!(
            edited
                .is_some_and(|detail| detail.contains("reads \"43\" where the reply gives \"42\""))
        );

        let mut cut = ModelResponse::answer("half");
        cut.stop_reason = Some(StopReason::MaxTokens);
        let cut = Ok(cut);
        let (kind, text) = expected_outcome(&cut).expect("finishes");
        assert_eq!(kind, StatusKind::ModelStopped);
        assert_eq!(outcome_disagrees(&outcome(kind, &text), Some(&cut)), None);
        assert!(outcome_disagrees(&outcome(kind, "model stopped"), Some(&cut)).is_some());

        let empty = Ok(ModelResponse {
            content: Vec::new(),
            stop_reason: Some(StopReason::EndTurn),
            usage: None,
        });
        let (kind, text) = expected_outcome(&empty).expect("finishes");
        assert_eq!(kind, StatusKind::ProtocolError);
        for note in ["", EMPTY_REPLY_NOTES[0], EMPTY_REPLY_NOTES[1]] {
            let noted = format!("{text}{note}");
            assert_eq!(
                outcome_disagrees(&outcome(kind, &noted), Some(&empty)),
                None
            );
        }
        assert!(outcome_disagrees(&outcome(kind, &format!("{text} (x)")), Some(&empty)).is_some());

        let failed = Err(ModelFailure::with_kind(FailureKind::Overloaded, "busy"));
        assert_eq!(
            outcome_disagrees(
                &outcome(StatusKind::ModelError, "model request failed: busy"),
                Some(&failed)
            ),
            None
        );
        assert!(
            outcome_disagrees(&outcome(StatusKind::ModelError, "busy"), Some(&failed)).is_some()
        );
        // A status the last reply cannot end with.
        let calls = Ok(ModelResponse::tool_calls([(
            "toolu_1",
            "read_file",
            serde_json::json!({}),
        )]));
        assert!(outcome_disagrees(&outcome(StatusKind::ModelStopped, "x"), Some(&calls)).is_some());
        assert!(outcome_disagrees(&outcome(StatusKind::ModelError, "x"), Some(&answer)).is_some());
        assert_eq!(
            outcome_disagrees(&outcome(StatusKind::CallLimit, "x"), Some(&calls)),
            None
        );
    }
}
