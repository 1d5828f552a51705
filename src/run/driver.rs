//! The driver: the only loop in the crate.
//!
//! [`run`] asks the model, hands the reply to the conversation, runs the
//! requested tools through an [`Executor`], and repeats until the
//! conversation finishes. It knows nothing of particular tools, files or
//! HTTP: those live behind [`Model`] and [`Executor`]. A model failure
//! finishes the conversation `model_error`; the loop never retries.

use crate::core::conversation::{
    AfterTools, AwaitingModel, CONTINUE_PROMPT, Conversation, Interrupt, Outcome, Reply, ToolCall,
    ToolOutput,
};
use crate::core::error::ModelFailure;
use crate::core::protocol::{Message, ModelResponse, Request, ToolDefinition};
use crate::run::model::{Model, Received};
use serde_json::Value;

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

    /// Called once per tool reply, before [`Executor::execute`] is called for
    /// each call in order; lets an executor plan the reply (e.g. group
    /// consecutive independent calls into one concurrent batch, started when
    /// the batch's first call is executed). Effects must stay in call order:
    /// a call may not start before every earlier call of the reply has
    /// finished. The default does nothing.
    fn prepare(&mut self, calls: &[ToolCall]) {
        let _ = calls;
    }

    /// Runs one call and returns its output; the driver pairs it with the call's id.
    fn execute(&mut self, call: &ToolCall) -> ToolOutput;

    /// Told when the driver answered `call` itself without running it
    /// (the run was stopped), so the executor can record it.
    fn skipped(&mut self, call: &ToolCall, output: &ToolOutput) {
        let _ = (call, output);
    }

    /// Whether `call` already ran, in a batch started by an earlier call of
    /// the same reply: its result is delivered even after an interrupt,
    /// since a result is never lost.
    fn prepared(&self, call: &ToolCall) -> bool {
        let _ = call;
        false
    }

    /// Asked at every turn boundary (before each model request and before
    /// each tool call): `Some` stops the run there. A tool that cannot start
    /// is answered `not executed:`; the conversation then finishes with the
    /// interrupt's status. The default never interrupts.
    fn interrupt(&self) -> Option<Interrupt> {
        None
    }
}

/// A progress event of one conversation. New capabilities may add events,
/// so matches outside the crate need a wildcard arm.
#[non_exhaustive]
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// Model request number `call` is about to be sent.
    Request {
        /// 1-based request number.
        call: u32,
        /// The request.
        request: &'a Request<'a>,
        /// The messages appended to the history since this conversation's previous request.
        new_messages: &'a [Message],
    },
    /// The model replied.
    Response {
        /// 1-based request number.
        call: u32,
        /// The reply, as parsed.
        response: &'a ModelResponse,
        /// The reply as received on the wire, when the model has a wire form
        /// (the trace writes it in preference to `response`).
        raw: Option<&'a Value>,
    },
    /// The reply to request `call` was an empty `end_turn`; under
    /// [`crate::core::conversation::OnEmptyReply::Continue`] it was dropped and answered with
    /// `prompt` as a new user message (sent with the next request).
    EmptyReplyContinued {
        /// 1-based request number of the empty reply.
        call: u32,
        /// The user message's text ([`crate::core::conversation::CONTINUE_PROMPT`]).
        prompt: &'a str,
    },
    /// The model request failed.
    ModelFailed {
        /// 1-based request number.
        call: u32,
        /// What failed.
        failure: &'a ModelFailure,
    },
    /// A tool call is about to be executed.
    ToolRequested {
        /// The call.
        call: &'a ToolCall,
    },
    /// A tool call produced its output.
    ToolFinished {
        /// The call.
        call: &'a ToolCall,
        /// What it produced.
        output: &'a ToolOutput,
    },
    /// The conversation finished.
    Finished {
        /// Its outcome.
        outcome: &'a Outcome,
    },
}

/// Receives progress events.
pub trait Observer {
    /// Called for every event, in order.
    fn on_event(&mut self, event: &Event<'_>);
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Observer for Silent {
    fn on_event(&mut self, _event: &Event<'_>) {}
}

/// Drives `conversation` to its end and returns the outcome.
pub fn run(
    conversation: Conversation<AwaitingModel>,
    model: &mut dyn Model,
    executor: &mut dyn Executor,
    observer: &mut dyn Observer,
) -> Outcome {
    run_from(conversation, 0, model, executor, observer)
}

/// [`run`] for a conversation whose first `sent` messages an observer has
/// already seen (a resumed run): the first [`Event::Request`]'s
/// `new_messages` starts after them, as if the run had never stopped.
pub fn run_from(
    mut conversation: Conversation<AwaitingModel>,
    sent: usize,
    model: &mut dyn Model,
    executor: &mut dyn Executor,
    observer: &mut dyn Observer,
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
            observer.on_event(&Event::Request {
                call,
                request: &request,
                new_messages,
            });
            sent = request.messages.len();
            model.respond_received(&request)
        };
        let Received {
            response: reply,
            raw,
        } = match reply {
            Ok(received) => received,
            Err(failure) => {
                observer.on_event(&Event::ModelFailed {
                    call,
                    failure: &failure,
                });
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
        observer.on_event(&Event::Response {
            call,
            response: &reply,
            raw: raw.as_ref(),
        });
        drop(raw);
        let pending = match conversation.receive(reply) {
            Reply::Tools(pending) => pending,
            Reply::Continued(next) => {
                observer.on_event(&Event::EmptyReplyContinued {
                    call,
                    prompt: CONTINUE_PROMPT,
                });
                conversation = next;
                continue;
            }
            Reply::Answered(done) => break done.into_outcome(),
            Reply::ModelStopped(done) => break done.into_outcome(),
            Reply::ProtocolError(done) => break done.into_outcome(),
        };
        if executor.interrupt().is_none() {
            executor.prepare(pending.calls());
        }
        let mut stopped = None;
        let after = pending.answer_with(|call| {
            observer.on_event(&Event::ToolRequested { call });
            let output = match executor.interrupt() {
                Some(interrupt) if !executor.prepared(call) => {
                    let output = ToolOutput::error(format!(
                        "not executed: the run was stopped ({})",
                        interrupt.text
                    ));
                    executor.skipped(call, &output);
                    stopped = Some(interrupt);
                    output
                }
                _ => executor.execute(call),
            };
            observer.on_event(&Event::ToolFinished {
                call,
                output: &output,
            });
            output
        });
        match after {
            AfterTools::Continue(next) => conversation = next,
            AfterTools::CallLimit(done) => {
                // Calls of the last budgeted round were refused because the
                // run was stopped: the stop, not the budget, ended it.
                let mut outcome = done.into_outcome();
                if let Some(interrupt) = stopped {
                    outcome.status = interrupt.kind.status();
                    outcome.text = interrupt.text;
                }
                break outcome;
            }
        }
    };
    observer.on_event(&Event::Finished { outcome: &outcome });
    outcome
}
