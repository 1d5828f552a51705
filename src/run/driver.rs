//! The driver: the only loop in the crate.
//!
//! The driver asks the model, hands the reply to the conversation, runs the
//! requested tools through an [`Executor`], and repeats until the
//! conversation finishes. It knows nothing of particular tools, files or
//! HTTP: those live behind [`AsyncModel`] and [`Executor`]. A model failure
//! finishes the conversation `model_error`; the loop never retries.
//!
//! The loop is written once, as an `async fn` that names no runtime. The
//! blocking entry point ([`run`]) drives it on this thread over a
//! [`Blocking`] model and an executor whose work is done when it is asked
//! for, so its future is complete at its first poll; an async host awaits
//! it on its own runtime through `Agent::run_async`. Dropping that future
//! before it finishes still finishes the conversation, `cancelled`: the
//! monitor is told how the request in flight or the round under way
//! ended, and sees [`Event::Finished`], so a trace always ends with its
//! outcome.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::core::agent_id::AgentId;
use crate::core::compaction::{
    CompactTrigger, Compaction, Compactor, Recorded, Summarize, TokenCount,
};
use crate::core::conversation::{
    AfterRound, AwaitingModel, AwaitingTools, CONTINUE_PROMPT, Compacted, Conversation, Interrupt,
    InterruptKind, Outcome, Overflow, Reply, ToolCall, ToolOutput,
};
use crate::core::error::{FailureKind, ModelFailure};
use crate::core::protocol::{Message, ReplyBlock, Request, ToolDefinition, Usage, join_text};
use crate::run::model::{AsyncModel, Blocking, Model, Received};
use crate::run::monitor::{Event, Monitor};
use crate::run::telemetry::{self, Telemetry};
use tracing::Instrument;

/// Runs tool calls for the driver.
pub trait Executor {
    /// The tool definitions offered to the model: the same set that [`Executor::execute`] dispatches.
    fn definitions(&self) -> &[ToolDefinition];

    /// Called at each turn boundary, before the next request is built: an
    /// executor whose tools can change (an MCP server's list, say)
    /// takes their current list here, so the definitions of the request
    /// and the dispatch of its reply are one list. The default does nothing.
    fn refresh(&mut self) {}

    /// Text attached to the next request only (e.g. the current plan), as a
    /// system attachment after the system prompt; not stored in the history.
    fn attachment(&self) -> Option<String> {
        None
    }

    /// Runs one call and returns its output.
    fn execute(&mut self, call: &ToolCall) -> ToolOutput;

    /// Runs a whole round (the calls of one reply) and returns one output
    /// per call, in call order, with the interrupt that stopped the round
    /// if one did. Effects stay in call order: a call may not start before
    /// every earlier call of the round has finished (an executor may run
    /// consecutive independent calls together, as the agent's runs a run
    /// of `task` calls). `monitor` is told, as `agent`'s, when each call is asked for
    /// and when it has its output ([`Event::ToolRequested`],
    /// [`Event::ToolFinished`]), in call order.
    ///
    /// The default runs the calls one by one through [`Executor::execute`],
    /// asking [`Executor::interrupt`] before each: once it says stop, the
    /// remaining calls are answered `not executed: the run was stopped
    /// (…)` without running. It does the whole round when called, and the
    /// future it returns is already complete.
    fn execute_round<'a>(
        &'a mut self,
        calls: &'a [ToolCall],
        agent: &'a AgentId,
        monitor: &'a mut dyn Monitor,
    ) -> RoundFuture<'a> {
        let mut round = Round::default();
        for call in calls {
            monitor.event(agent, &Event::ToolRequested { call });
            let output = match self.interrupt() {
                Some(interrupt) => {
                    let output = stopped_output(&interrupt);
                    round.stopped = Some(interrupt);
                    output
                }
                None => self.execute(call),
            };
            monitor.event(
                agent,
                &Event::ToolFinished {
                    call,
                    output: &output,
                },
            );
            round.outputs.push(output);
        }
        Box::pin(std::future::ready(round))
    }

    /// The round under way was abandoned (its future dropped): the outputs
    /// of the calls already answered, in call order, then an answer for
    /// every other call of `calls`, which did not run or whose result was
    /// lost (`interrupt` says why). The default, for executors whose round
    /// is done when asked for, answers every call as stopped.
    fn abandon_round(&mut self, calls: &[ToolCall], interrupt: &Interrupt) -> Vec<ToolOutput> {
        calls.iter().map(|_| stopped_output(interrupt)).collect()
    }

    /// The model answered request `call` with `answer` (checked against
    /// the output schema, if any): `Some(message)` sends the agent on,
    /// `message` appended as a user message (a `Stop` hook that blocked),
    /// when `calls_left` says the question's budget allows it; `None` lets
    /// the conversation finish. The default always lets it finish.
    fn review_answer(&mut self, call: u32, answer: &str, calls_left: bool) -> Option<String> {
        let _ = (call, answer, calls_left);
        None
    }

    /// [`Executor::review_answer`] as the loop asks it: an executor whose
    /// review waits (a `Stop` hook, a process) overrides this, so an async
    /// run does not hold its worker meanwhile. The default asks
    /// `review_answer` when called.
    fn review_answer_async<'a>(
        &'a mut self,
        call: u32,
        answer: &'a str,
        calls_left: bool,
    ) -> crate::run::BoxFuture<'a, Option<String>> {
        Box::pin(std::future::ready(
            self.review_answer(call, answer, calls_left),
        ))
    }

    /// Asked at every turn boundary (before each model request and before
    /// each tool call): `Some` stops the run there. A tool that cannot start
    /// is answered `not executed:`; the conversation then finishes with the
    /// interrupt's status. The default never interrupts.
    fn interrupt(&self) -> Option<Interrupt> {
        None
    }

    /// What the run's spans may record (message content or not). The
    /// default records no content.
    fn telemetry(&self) -> Telemetry {
        Telemetry::default()
    }

    /// When and how the conversation's history is compacted, asked once
    /// when the loop starts. `None` (the default): never; a request the
    /// server refuses for its length then finishes the conversation
    /// `context_overflow`.
    fn compaction(&self) -> Option<Compaction> {
        None
    }

    /// The history is about to be compacted for `trigger`, before model
    /// request `call`: `Some(reason)`
    /// blocks it (a `PreCompact` hook that said so). A blocked automatic
    /// compaction leaves the history as it is; a blocked compaction after
    /// an overflow finishes the conversation `context_overflow`. The
    /// default allows it.
    fn before_compaction(&mut self, call: u32, trigger: CompactTrigger) -> Option<String> {
        let _ = (call, trigger);
        None
    }

    /// [`Executor::before_compaction`] as the loop asks it: an executor
    /// whose answer waits (a `PreCompact` hook) overrides this, so an
    /// async run does not hold its worker meanwhile. The default asks
    /// `before_compaction` when called.
    fn before_compaction_async(
        &mut self,
        call: u32,
        trigger: CompactTrigger,
    ) -> crate::run::BoxFuture<'_, Option<String>> {
        Box::pin(std::future::ready(self.before_compaction(call, trigger)))
    }
}

/// The name a summary's compaction is recorded under.
const SUMMARIZE: &str = "summarize";

/// How many times the history may be compacted before one request: each
/// compaction shortens it, and a trigger not relieved after this many is
/// left to the server's verdict.
const COMPACTIONS_PER_REQUEST: usize = 4;

/// The token estimate of a request's fixed part: the system prompt and
/// the tool definitions.
fn fixed_tokens(system: &str, definitions: &[ToolDefinition]) -> u64 {
    let tools = serde_json::to_string(definitions).map_or(0, |text| text.len());
    ((system.len() + tools) as u64).div_ceil(4)
}

/// A summary the model wrote for a compaction, and the history it makes.
struct Summary {
    history: Vec<Message>,
    text: String,
    usage: Option<Usage>,
    attempts: u32,
}

/// Asks `model` for a summary of `history`, as `summarize` says: a
/// request too long for the window is asked again without the oldest half
/// of the rounds it summarizes, at most [`Summarize::ATTEMPTS`] times.
/// `Err` says why there is none.
async fn summarize<M: AsyncModel + ?Sized>(
    model: &mut M,
    summarize: &Summarize,
    history: &[Message],
) -> Result<Summary, String> {
    let rounds = summarize.rounds(history);
    let mut dropped = 0;
    let mut attempts = 0;
    let mut usage: Option<Usage> = None;
    loop {
        let Some(messages) = summarize.request(history, dropped) else {
            return Err(if rounds == 0 {
                "there is nothing to summarize".to_owned()
            } else {
                "even the newest rounds do not fit a summary request".to_owned()
            });
        };
        attempts += 1;
        let request = Request {
            system: Summarize::SYSTEM,
            tools: &[],
            messages: &messages,
            attachment: None,
            output: None,
        };
        match model.respond_async(&request).await {
            Ok(received) => {
                let reply = received.response;
                if let Some(spent) = &reply.usage {
                    usage.get_or_insert_with(Usage::default).add(spent);
                }
                let text = join_text(reply.content.iter().filter_map(|block| match block {
                    ReplyBlock::Known(block) => Some(block),
                    ReplyBlock::Unsupported { .. } => None,
                }));
                if text.trim().is_empty() {
                    return Err("the summary came back empty".to_owned());
                }
                let history = summarize
                    .apply(history, &text)
                    .ok_or_else(|| "there is nothing to summarize".to_owned())?;
                return Ok(Summary {
                    history,
                    text,
                    usage,
                    attempts,
                });
            }
            Err(failure)
                if failure.kind() == Some(&FailureKind::ContextWindow)
                    && (attempts as usize) < Summarize::ATTEMPTS =>
            {
                dropped += rounds.saturating_sub(dropped).div_ceil(2);
            }
            Err(failure) => return Err(format!("the summary request failed: {failure}")),
        }
    }
}

/// The summary `compaction` asks for first, if it asks for one and the
/// model writes one; why there is none is told to `monitor` as
/// `agent`'s warning (the compactor is used instead).
async fn summary_for<M: AsyncModel + ?Sized>(
    model: &mut M,
    compaction: &Compaction,
    history: &[Message],
    agent: &AgentId,
    monitor: &mut dyn Monitor,
) -> Option<Summary> {
    let how = compaction.summarize()?;
    match summarize(model, how, history).await {
        Ok(summary) => Some(summary),
        Err(why) => {
            let text = format!(
                "no summary ({why}); compacted by {} instead",
                compaction.compactor().name()
            );
            monitor.warning(agent, &text);
            None
        }
    }
}

/// The future of a round of tool calls ([`Executor::execute_round`]).
pub(crate) type RoundFuture<'a> = crate::run::BoxFuture<'a, Round>;

/// What a round of tool calls gave ([`Executor::execute_round`]).
#[derive(Debug, Default)]
pub struct Round {
    /// One output per call, in call order. A call without one is answered
    /// as failed; more outputs than calls is a broken round: the monitor is
    /// warned and every call of the round is answered as failed.
    pub outputs: Vec<ToolOutput>,
    /// The interrupt that stopped the round, if one did.
    pub stopped: Option<Interrupt>,
}

/// The answer to a call that was not run because the run was stopped.
pub(crate) fn stopped_output(interrupt: &Interrupt) -> ToolOutput {
    ToolOutput::error(format!(
        "not executed: the run was stopped ({})",
        interrupt.text
    ))
}

/// Drives `conversation` to its end with a blocking model and returns the outcome.
pub fn run(
    conversation: Conversation<AwaitingModel>,
    model: &mut dyn Model,
    executor: &mut dyn Executor,
    monitor: &mut dyn Monitor,
) -> Outcome {
    run_from(&AgentId::Parent, conversation, 0, model, executor, monitor)
}

/// [`run`] for `agent` (its events are told as that agent's), for a
/// conversation whose first `sent` messages the monitor has already seen (a
/// resumed run; 0 for a new one): the first [`Event::Request`]'s
/// `new_messages` starts after them, as if the run had never stopped.
///
/// It is [`drive`] under [`block_on`], the model wrapped in [`Blocking`].
pub(crate) fn run_from(
    agent: &AgentId,
    conversation: Conversation<AwaitingModel>,
    sent: usize,
    model: &mut dyn Model,
    executor: &mut dyn Executor,
    monitor: &mut dyn Monitor,
) -> Outcome {
    let mut model = Blocking(model);
    block_on(drive(
        agent,
        conversation,
        sent,
        &mut model,
        executor,
        monitor,
    ))
}

/// The interrupt of a run whose future was dropped before it finished.
pub(crate) fn dropped_interrupt() -> Interrupt {
    Interrupt {
        kind: InterruptKind::Cancelled,
        text: "the run was dropped before it finished; what was done so far is kept".to_owned(),
    }
}

/// Where the conversation is while the loop runs: waiting for the model
/// (or between turns), or waiting for a round of tool calls; neither once
/// it has finished.
#[derive(Default)]
struct Stage {
    asking: Option<Conversation<AwaitingModel>>,
    /// Whether the request of `asking` has been sent.
    in_flight: bool,
    /// Whether the request of `asking` was refused for its length and a
    /// summary is being written (the refused request counts; its failure
    /// is already told).
    failed_in_flight: bool,
    tools: Option<Conversation<AwaitingTools>>,
}

impl Stage {
    /// Between turns, with `conversation`.
    fn ask(&mut self, conversation: Conversation<AwaitingModel>) {
        self.asking = Some(conversation);
        self.in_flight = false;
        self.failed_in_flight = false;
    }

    /// The conversation between turns. The loop keeps it there from each
    /// turn's start to its reply ([`Stage::ask`] before every turn).
    fn asking(&mut self) -> &Conversation<AwaitingModel> {
        match &mut self.asking {
            Some(conversation) => conversation,
            None => unreachable!("the loop asks only with a conversation in the stage"),
        }
    }

    /// Takes the conversation between turns out of the stage.
    fn take_asking(&mut self) -> Conversation<AwaitingModel> {
        self.in_flight = false;
        self.failed_in_flight = false;
        match self.asking.take() {
            Some(conversation) => conversation,
            None => unreachable!("the loop asks only with a conversation in the stage"),
        }
    }
}

/// The loop's state: what [`Drop`] finishes when the loop's future is
/// dropped before its end.
struct Live<'r, E: Executor + ?Sized> {
    agent: &'r AgentId,
    executor: &'r mut E,
    monitor: &'r mut dyn Monitor,
    stage: Stage,
}

impl<E: Executor + ?Sized> Live<'_, E> {
    /// The history `before` (of which the monitor has seen the first
    /// `*sent` messages) was replaced by `next`'s, before request `call`:
    /// the monitor is told, what it has seen and the token count start
    /// again from `next`, and `next` (charged what a summary spent) waits
    /// for the model.
    #[allow(clippy::too_many_arguments)]
    fn compacted(
        &mut self,
        call: u32,
        trigger: CompactTrigger,
        compactor: &str,
        estimate: u64,
        before: &[Message],
        next: Conversation<AwaitingModel>,
        summary: Option<&Summary>,
        sent: &mut usize,
        tokens: &mut TokenCount,
    ) {
        self.monitor.event(
            self.agent,
            &Event::Compacted {
                call,
                trigger,
                compactor,
                tokens: estimate,
                new_messages: before.get(*sent..).unwrap_or_default(),
                replaced: before.len(),
                history: next.history(),
                summary: summary.map(|summary| summary.text.as_str()),
                summary_usage: summary.and_then(|summary| summary.usage),
                summary_requests: summary.map_or(0, |summary| summary.attempts),
            },
        );
        *sent = next.history().len();
        tokens.reset();
        self.stage
            .ask(next.spent(summary.and_then(|summary| summary.usage)));
    }

    fn finish(&mut self, outcome: Outcome) -> Outcome {
        self.stage = Stage::default();
        self.monitor
            .event(self.agent, &Event::Finished { outcome: &outcome });
        outcome
    }
}

impl<E: Executor + ?Sized> Drop for Live<'_, E> {
    /// The future was dropped mid-run: the conversation finishes
    /// `cancelled` as a stop at that point would finish it. A request in
    /// flight is told as failed and counts; a round under way keeps the
    /// results it has, and every other call is answered `not executed`.
    fn drop(&mut self) {
        let interrupt = dropped_interrupt();
        let stage = std::mem::take(&mut self.stage);
        let outcome = if let Some(pending) = stage.tools {
            let outputs = self.executor.abandon_round(pending.calls(), &interrupt);
            let stopped = Some(interrupt.clone());
            match answer_round(self.agent, &mut *self.monitor, pending, outputs, stopped) {
                AfterRound::Continue(next) => next.interrupt(interrupt).into_outcome(),
                AfterRound::CallLimit(done) => done.into_outcome(),
                AfterRound::Stopped(done) => done.into_outcome(),
            }
        } else if let Some(conversation) = stage.asking {
            if stage.failed_in_flight {
                conversation.interrupt_in_flight(interrupt).into_outcome()
            } else if stage.in_flight {
                let call = conversation.calls_made() + 1;
                let failure = ModelFailure::with_kind(
                    FailureKind::Cancelled,
                    "the request was abandoned because the run was dropped",
                );
                self.monitor.event(
                    self.agent,
                    &Event::ModelFailed {
                        call,
                        failure: &failure,
                    },
                );
                conversation.interrupt_in_flight(interrupt).into_outcome()
            } else {
                conversation.interrupt(interrupt).into_outcome()
            }
        } else {
            return;
        };
        self.finish(outcome);
    }
}

/// The loop: drives `conversation`, as `agent`'s, to its end and returns
/// the outcome; the first `sent` messages are already on record (see
/// [`run_from`]). Nothing here waits on its own: the model's answer and
/// the round's results are the only awaits, so the future is complete at
/// its first poll when both answer when asked ([`Blocking`], an executor
/// of blocking tools).
///
/// Dropping the future before it completes finishes the conversation
/// `cancelled` (see the module's text).
pub(crate) async fn drive<M, E>(
    agent: &AgentId,
    conversation: Conversation<AwaitingModel>,
    sent: usize,
    model: &mut M,
    executor: &mut E,
    monitor: &mut dyn Monitor,
) -> Outcome
where
    M: AsyncModel + ?Sized,
    E: Executor + ?Sized,
{
    let mut live = Live {
        agent,
        executor,
        monitor,
        stage: Stage::default(),
    };
    live.stage.ask(conversation);
    let mut sent = sent;
    let identity = model.identity();
    let telemetry = live.executor.telemetry();
    let compaction = live.executor.compaction();
    // Counted only for a trigger to judge.
    let fixed = match compaction.as_ref().and_then(Compaction::trigger) {
        Some(_) => fixed_tokens(live.stage.asking().system(), live.executor.definitions()),
        None => 0,
    };
    let mut tokens = TokenCount::new(fixed);
    loop {
        let conversation = live.stage.asking();
        let call = conversation.calls_made() + 1;
        if let Some(mut interrupt) = live.executor.interrupt() {
            interrupt.text = format!("{} (stopped before model request {call})", interrupt.text);
            let conversation = live.stage.take_asking();
            return live.finish(conversation.interrupt(interrupt).into_outcome());
        }
        live.executor.refresh();
        if let Some(compaction) = &compaction
            && let Some(trigger) = compaction.trigger()
        {
            for pass in 0..COMPACTIONS_PER_REQUEST {
                let estimate = tokens.of(live.stage.asking().history());
                // Due to start; once started, until relieved.
                let go_on = if pass == 0 {
                    trigger.due(estimate)
                } else {
                    !trigger.relieved(estimate)
                };
                if !go_on {
                    break;
                }
                if let Some(reason) = live
                    .executor
                    .before_compaction_async(call, CompactTrigger::Auto)
                    .await
                {
                    let text = format!(
                        "the history (about {estimate} tokens, {}) was not compacted: {reason}",
                        trigger.describe()
                    );
                    live.monitor.warning(agent, &text);
                    break;
                }
                // The conversation stays in the stage while the model
                // writes a summary: a run dropped then is finished as
                // usual.
                let before = live.stage.asking().history().to_vec();
                let summary =
                    summary_for(model, compaction, &before, agent, &mut *live.monitor).await;
                let conversation = live.stage.take_asking();
                let recorded = summary
                    .as_ref()
                    .map(|summary| Recorded::new(SUMMARIZE, &summary.history));
                let compactor: &dyn Compactor = match &recorded {
                    Some(recorded) => recorded,
                    None => compaction.compactor(),
                };
                match conversation.compact(compactor) {
                    Compacted::Shortened(next) => live.compacted(
                        call,
                        CompactTrigger::Auto,
                        compactor.name(),
                        estimate,
                        &before,
                        next,
                        summary.as_ref(),
                        &mut sent,
                        &mut tokens,
                    ),
                    Compacted::Unchanged(same) => {
                        live.stage.ask(same);
                        break;
                    }
                    Compacted::Refused {
                        conversation,
                        reason,
                    } => {
                        live.monitor.warning(agent, &reason);
                        live.stage.ask(conversation);
                        break;
                    }
                }
            }
        }
        let attachment = live.executor.attachment();
        let span = telemetry::chat_span(identity.as_ref(), agent, call);
        let answer = {
            // No await comes before the request is sent.
            live.stage.in_flight = true;
            let conversation = live.stage.asking();
            let request = conversation.request(live.executor.definitions(), attachment.as_deref());
            let new_messages = request.messages.get(sent..).unwrap_or_default();
            live.monitor.event(
                agent,
                &Event::Request {
                    call,
                    request: &request,
                    new_messages,
                },
            );
            sent = request.messages.len();
            telemetry::record_request(&span, telemetry, &request);
            model.respond_async(&request).instrument(span.clone()).await
        };
        match &answer {
            Ok(received) => telemetry::record_response(&span, telemetry, received),
            Err(failure) => telemetry::record_failure(&span, failure),
        }
        drop(span);
        let mut conversation = live.stage.take_asking();
        let Received {
            response: reply,
            raw,
        } = match answer {
            Ok(received) => received,
            Err(failure) => {
                live.monitor.event(
                    agent,
                    &Event::ModelFailed {
                        call,
                        failure: &failure,
                    },
                );
                // A request abandoned because the run was stopped finishes
                // with the stop's status, not as a model error.
                if let Some(mut interrupt) = live.executor.interrupt() {
                    interrupt.text = format!(
                        "{} (model request {call} was abandoned: {failure})",
                        interrupt.text
                    );
                    return live.finish(conversation.interrupt_in_flight(interrupt).into_outcome());
                }
                if failure.kind() != Some(&FailureKind::ContextWindow) {
                    return live.finish(conversation.model_failed(failure).into_outcome());
                }
                // Too long for the model: compacted and asked again, or
                // finished `context_overflow`.
                let blocked = match compaction {
                    Some(_) => live
                        .executor
                        .before_compaction_async(call + 1, CompactTrigger::Overflow)
                        .await
                        .map(|reason| format!("a PreCompact hook blocked compaction: {reason}")),
                    None => None,
                };
                let before = conversation.history().to_vec();
                let estimate = tokens.of(&before);
                let summary = match (&compaction, &blocked) {
                    (Some(compaction), None) if compaction.summarize().is_some() => {
                        // Back in the stage while the model writes it, the
                        // refused request counted if the run is dropped
                        // meanwhile.
                        live.stage.ask(conversation);
                        live.stage.failed_in_flight = true;
                        let summary =
                            summary_for(model, compaction, &before, agent, &mut *live.monitor)
                                .await;
                        conversation = live.stage.take_asking();
                        summary
                    }
                    _ => None,
                };
                let recorded = summary
                    .as_ref()
                    .map(|summary| Recorded::new(SUMMARIZE, &summary.history));
                let compactor: Result<&dyn Compactor, &str> =
                    match (&compaction, &blocked, &recorded) {
                        (_, Some(blocked), _) => Err(blocked.as_str()),
                        (None, None, _) => Err("compaction is off"),
                        (Some(_), None, Some(recorded)) => Ok(recorded),
                        (Some(compaction), None, None) => Ok(compaction.compactor()),
                    };
                match conversation.overflowed(failure, compactor) {
                    Overflow::Compacted(next) => {
                        live.compacted(
                            call + 1,
                            CompactTrigger::Overflow,
                            compactor.map_or("", |compactor| compactor.name()),
                            estimate,
                            &before,
                            next,
                            summary.as_ref(),
                            &mut sent,
                            &mut tokens,
                        );
                        continue;
                    }
                    Overflow::Overflowed(done) => return live.finish(done.into_outcome()),
                }
            }
        };
        live.monitor.event(
            agent,
            &Event::Response {
                call,
                response: &reply,
                raw: raw.as_ref(),
            },
        );
        drop(raw);
        tokens.replied(reply.usage.as_ref(), conversation.history().len() + 1);
        let pending = match conversation.receive(reply) {
            Reply::Tools(pending) => pending,
            Reply::Continued(next) => {
                live.monitor.event(
                    agent,
                    &Event::EmptyReplyContinued {
                        call,
                        prompt: CONTINUE_PROMPT,
                    },
                );
                live.stage.ask(next);
                continue;
            }
            Reply::InvalidAnswer { next, error } => {
                live.monitor.event(
                    agent,
                    &Event::InvalidAnswer {
                        call,
                        error: &error,
                    },
                );
                live.stage.ask(next);
                continue;
            }
            Reply::Answered(done) => {
                let calls_left = done.calls_left();
                let Some(message) = live
                    .executor
                    .review_answer_async(call, done.text(), calls_left)
                    .await
                else {
                    return live.finish(done.into_outcome());
                };
                match done.keep_going(&message) {
                    Ok(next) => {
                        live.stage.ask(next);
                        continue;
                    }
                    Err(done) => return live.finish(done.into_outcome()),
                }
            }
            Reply::InvalidOutput(done) => return live.finish(done.into_outcome()),
            Reply::ModelStopped(done) => return live.finish(done.into_outcome()),
            Reply::ProtocolError(done) => return live.finish(done.into_outcome()),
        };
        let round = {
            let pending = live.stage.tools.insert(pending);
            live.executor
                .execute_round(pending.calls(), agent, &mut *live.monitor)
                .await
        };
        let Some(pending) = live.stage.tools.take() else {
            unreachable!("the round's conversation is kept in the stage while the round runs");
        };
        let after = answer_round(
            agent,
            &mut *live.monitor,
            pending,
            round.outputs,
            round.stopped,
        );
        match after {
            AfterRound::Continue(next) => live.stage.ask(next),
            AfterRound::CallLimit(done) => return live.finish(done.into_outcome()),
            AfterRound::Stopped(done) => return live.finish(done.into_outcome()),
        }
    }
}

/// Answers a round with the executor's `outputs`. An executor that gave
/// more outputs than the round has calls broke its contract, and which
/// output answers which call is unknown: the monitor is warned, and every
/// call is answered as an error saying so.
fn answer_round(
    agent: &AgentId,
    monitor: &mut dyn Monitor,
    pending: Conversation<AwaitingTools>,
    outputs: Vec<ToolOutput>,
    stopped: Option<Interrupt>,
) -> AfterRound {
    let mut pending = pending;
    let mut outputs = outputs;
    // At most twice: the second time there is one output per call.
    loop {
        match pending.answer_round(outputs, stopped.clone()) {
            Ok(after) => return after,
            Err(rejected) => {
                let text = format!(
                    "the executor's round does not match its calls ({}); every call of the round is answered as failed",
                    rejected.error
                );
                monitor.warning(agent, &text);
                pending = rejected.conversation;
                outputs = pending
                    .calls()
                    .iter()
                    .map(|call| {
                        ToolOutput::error(format!(
                            "{} failed: the round's results could not be matched to its calls",
                            call.name()
                        ))
                    })
                    .collect();
            }
        }
    }
}

/// Runs a future to its end on this thread, parking it while the future
/// waits. The blocking entry points use it over futures that are complete
/// at their first poll; it needs no runtime, and is no substitute for one
/// (a future that waits on a runtime's timers or sockets never wakes here).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}
