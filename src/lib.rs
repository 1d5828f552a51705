//! # subloop
//!
//! A tool-using language-model conversation (an *agent loop*) whose protocol
//! is enforced by the type system, with a `task` tool that hands
//! sub-questions to **subagents**: the same loop, with a fresh history, a
//! host-chosen tool whitelist, its own call budget and a bounded report.
//!
//! ## Layers
//!
//! | layer | module |
//! |---|---|
//! | 1 loop: history, replies, stop statuses, budget | [`conversation`], [`driver`], [`protocol`], [`model`] |
//! | 2 tools: registry, schema checks, dispatch | [`tools`] |
//! | 3 permissions: `run_main` only after approval | [`permission`] |
//! | 4 hooks: before/after observers, audit log | [`hooks`] |
//! | 5 plan: `todo_write`, attached to every parent request | [`plan`] |
//! | 6 subagent: `task`, whitelist, budget, report | [`subagent`] |
//!
//! [`limits`] bounds a whole run (tool calls per reply, delegations, a
//! deadline, a token budget) and cancels it from another thread.
//! [`agent`] assembles them; [`executor`] is the gated tool pipeline the
//! driver calls for the parent and every child; [`trace`] writes a JSON Lines
//! record of every request and reply, in a place [`trace_target`] allows,
//! which [`model::replay`] answers from and [`replay`] checks a replayed run
//! against; [`app`] is what the CLI runs, [`cli`] parses its command line,
//! [`output`] how it prints the answer, and [`signals`] how it ends on
//! Ctrl-C, `SIGTERM` and `SIGHUP`.
//!
//! ## Invariants, and the tests that guard them
//!
//! * A turn is a type: [`Conversation<AwaitingModel>`], [`Conversation<AwaitingTools>`],
//!   [`Conversation<Finished<S>>`]. Transitions consume `self`; a finished
//!   conversation has no transition, and tools cannot be skipped (the
//!   `compile_fail` examples in [`conversation`]).
//! * A reply is checked once, at [`Conversation::receive`]: known block types,
//!   non-empty unique tool_use ids, stop reason and content in agreement;
//!   anything else finishes `protocol_error` naming the [`Violation`], never a
//!   panic (`tests/conversation_rules.rs`, `tests/loop_properties.rs`).
//! * The assistant reply is stored before any tool runs; every call gets
//!   exactly one result, carrying its id, in the next user message, in call
//!   order ([`Conversation::answer_with`] pairs ids itself; the raw
//!   [`Conversation::submit`] rejects mismatches and hands the state back).
//! * At most `max_calls` model requests; budget 0 is an [`InputError`].
//! * A tool runs only if the registry that produced the request's tool list
//!   holds it and its arguments match its schema (`tests/registry_schema.rs`,
//!   `tests/dispatch_properties.rs`); `run_main` runs only after approval,
//!   and a denial wins over every hook (`tests/gate_and_hooks.rs`,
//!   `tests/run_main_process.rs`); `read_file` never leaves the workspace nor
//!   hangs (`tests/read_file_paths.rs`).
//! * The plan rides on each parent request, never in the history
//!   (`tests/plan_attachment.rs`).
//! * A child starts from `[user: task]`, holds only read-only whitelisted
//!   tools (holding `task` does not compile: see [`subagent`]), passes the
//!   parent's gate, runs the hooks the host named, and always yields a report
//!   under the original id (`tests/subagent.rs`, `tests/demo_runs.rs`).
//! * No run exceeds its limits, and every id is still answered exactly once
//!   when one is hit (`tests/run_limits.rs`).
//!
//! ## Embedding
//!
//! ```
//! use std::sync::Arc;
//! use serde_json::json;
//! use subloop::permission::DenyAll;
//! use subloop::subagent::{ScriptedChildren, SubagentConfig};
//! use subloop::tools::{ReadFile, DEFAULT_READ_LIMIT};
//! use subloop::{AgentBuilder, Budget, Hooks, ModelResponse, ScriptedModel, StatusKind};
//!
//! let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace");
//! let children = ScriptedChildren(vec![vec![Ok(ModelResponse::answer("main.py prints 42"))]]);
//! let agent = AgentBuilder::new(Arc::new(DenyAll))
//!     .read_only_tool(ReadFile::new(&workspace, DEFAULT_READ_LIMIT)?)?
//!     .subagents(SubagentConfig::new(Arc::new(children), Hooks::none()))?
//!     .build();
//! let mut model = ScriptedModel::new(vec![
//!     Ok(ModelResponse::tool_calls([("t1", "task", json!({"task": "What does main.py print?"}))])),
//!     Ok(ModelResponse::answer("It prints 42.")),
//! ]);
//! let report = agent.run("Check main.py", Budget::new(4)?, &mut model)?;
//! assert_eq!(report.outcome.status, StatusKind::Answered);
//! assert_eq!(report.children[0].report.summary, "main.py prints 42");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod agent;
pub mod agent_id;
pub mod app;
pub mod chat;
pub mod cli;
pub mod conversation;
pub mod driver;
pub mod error;
pub mod executor;
pub mod hooks;
pub mod invariants;
pub mod json_report;
pub mod limits;
pub mod model;
pub mod monitor;
pub mod output;
pub mod permission;
pub mod plan;
pub mod progress;
pub mod protocol;
pub mod replay;
pub mod resume;
pub mod shared_text;
pub mod signals;
pub mod subagent;
pub mod terminal;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tools;
pub mod trace;
mod trace_lines;
pub mod trace_target;
pub mod view;
pub mod view_html;

pub use agent::{Agent, AgentBuilder, RunReport};
pub use agent_id::AgentId;
pub use conversation::{
    AfterTools, Answered, AwaitingModel, AwaitingTools, Budget, CONTINUE_PROMPT, CallLimit,
    Cancelled, Conversation, Deadline, Finished, Interrupt, InterruptKind, Interrupted, ModelError,
    ModelStopped, OnEmptyReply, Outcome, ProtocolError, Rejected, Reply, Status, StatusKind,
    TokenLimit, ToolCall, ToolOutput, ToolResult, Violation,
};
pub use driver::{Event, Executor, Observer, Silent, run};
pub use error::{InputError, ModelFailure, ScriptError, SetupError, SubmitError};
pub use hooks::Hooks;
pub use model::{Model, Script, ScriptedModel, ScriptedReply};
pub use protocol::{
    Block, Message, ModelResponse, ReplyBlock, Request, Role, StopReason, ToolDefinition,
    ToolResultContent, ToolUseId, Usage,
};
pub use shared_text::SharedText;
