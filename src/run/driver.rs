//! The driver: the only loop in the crate.
//!
//! [`run`] asks the model, hands the reply to the conversation, runs the
//! requested tools through an [`Executor`], and repeats until the
//! conversation finishes. It knows nothing of particular tools, files or
//! HTTP: those live behind [`Model`] and [`Executor`]. A model failure
//! finishes the conversation `model_error`; the loop never retries.

use crate::core::agent_id::AgentId;
use crate::core::conversation::{
    AfterRound, AwaitingModel, CONTINUE_PROMPT, Conversation, Interrupt, Outcome, Reply, ToolCall,
    ToolOutput,
};
use crate::core::protocol::ToolDefinition;
use crate::run::model::{Model, Received};
pub use crate::run::monitor::{Event, Monitor, Silent};

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
    /// (…)` without running.
    fn execute_round(
        &mut self,
        calls: &[ToolCall],
        agent: &AgentId,
        monitor: &mut dyn Monitor,
    ) -> Round {
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
        round
    }

    /// Asked at every turn boundary (before each model request and before
    /// each tool call): `Some` stops the run there. A tool that cannot start
    /// is answered `not executed:`; the conversation then finishes with the
    /// interrupt's status. The default never interrupts.
    fn interrupt(&self) -> Option<Interrupt> {
        None
    }
}

/// What a round of tool calls gave ([`Executor::execute_round`]).
#[derive(Debug, Default)]
pub struct Round {
    /// One output per call, in call order.
    pub outputs: Vec<ToolOutput>,
    /// The interrupt that stopped the round, if one did.
    pub stopped: Option<Interrupt>,
}

/// The answer to a call that was not run because the run was stopped.
pub fn stopped_output(interrupt: &Interrupt) -> ToolOutput {
    ToolOutput::error(format!(
        "not executed: the run was stopped ({})",
        interrupt.text
    ))
}

/// Drives `conversation` to its end and returns the outcome.
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
pub fn run_from(
    agent: &AgentId,
    mut conversation: Conversation<AwaitingModel>,
    sent: usize,
    model: &mut dyn Model,
    executor: &mut dyn Executor,
    monitor: &mut dyn Monitor,
) -> Outcome {
    let mut sent = sent;
    let outcome = loop {
        let call = conversation.calls_made() + 1;
        if let Some(mut interrupt) = executor.interrupt() {
            interrupt.text = format!("{} (stopped before model request {call})", interrupt.text);
            break conversation.interrupt(interrupt).into_outcome();
        }
        executor.refresh();
        let attachment = executor.attachment();
        let reply = {
            let request = conversation.request(executor.definitions(), attachment.as_deref());
            let new_messages = request.messages.get(sent..).unwrap_or_default();
            monitor.event(
                agent,
                &Event::Request {
                    call,
                    request: &request,
                    new_messages,
                },
            );
            sent = request.messages.len();
            model.respond_received(&request)
        };
        let Received {
            response: reply,
            raw,
        } = match reply {
            Ok(received) => received,
            Err(failure) => {
                monitor.event(
                    agent,
                    &Event::ModelFailed {
                        call,
                        failure: &failure,
                    },
                );
                // A request abandoned because the run was stopped finishes
                // with the stop's status, not as a model error.
                if let Some(mut interrupt) = executor.interrupt() {
                    interrupt.text = format!(
                        "{} (model request {call} was abandoned: {failure})",
                        interrupt.text
                    );
                    break conversation.interrupt_in_flight(interrupt).into_outcome();
                }
                break conversation.model_failed(failure).into_outcome();
            }
        };
        monitor.event(
            agent,
            &Event::Response {
                call,
                response: &reply,
                raw: raw.as_ref(),
            },
        );
        drop(raw);
        let pending = match conversation.receive(reply) {
            Reply::Tools(pending) => pending,
            Reply::Continued(next) => {
                monitor.event(
                    agent,
                    &Event::EmptyReplyContinued {
                        call,
                        prompt: CONTINUE_PROMPT,
                    },
                );
                conversation = next;
                continue;
            }
            Reply::Answered(done) => break done.into_outcome(),
            Reply::ModelStopped(done) => break done.into_outcome(),
            Reply::ProtocolError(done) => break done.into_outcome(),
        };
        let round = executor.execute_round(pending.calls(), agent, monitor);
        match pending.answer_round(round.outputs, round.stopped) {
            AfterRound::Continue(next) => conversation = next,
            AfterRound::CallLimit(done) => break done.into_outcome(),
            AfterRound::Stopped(done) => break done.into_outcome(),
        }
    };
    monitor.event(agent, &Event::Finished { outcome: &outcome });
    outcome
}
