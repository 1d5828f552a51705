//! # subloop
//!
//! A tool-using language-model conversation (an *agent loop*) whose protocol
//! is enforced by the type system, with a `task` tool that hands
//! sub-questions to **subagents**: the same loop, with a fresh history, a
//! host-chosen tool whitelist, its own call budget and a bounded report.
//!
//! ## Layers
//!
//! The crate is built in layers, one folder each; a layer names only the
//! layers below it (an architecture test in `tests/` keeps it so):
//!
//! ```text
//! core ← run ← {policy, tools, providers} ← agent ← record
//! ```
//!
//! | layer | what it holds |
//! |---|---|
//! | [`core`] | wire types ([`core::protocol`]), the [`Conversation`] typestate, errors, [`core::agent_id::AgentId`], the plan, terminal-safe text; no I/O, no threads, no clock |
//! | [`run`] | the one loop ([`run::driver`]), the [`Model`] trait, run [`run::limits`] and cancellation, the [`run::monitor::Monitor`] that watches a run, the [`run::shutdown`] actions a host runs on its way out |
//! | [`policy`] | the permission gate and its approvers ([`policy::permission`]), [`Hooks`], the command hooks of a settings file ([`policy::command_hooks`]) |
//! | [`tools`] | the [`tools::Tool`] trait, the registry and its schema checks, `read_file`, `run_main`, `todo_write`, MCP servers |
//! | [`providers`] | models: Anthropic and OpenAI-compatible clients, scripted replies, the demo's offline models |
//! | [`agent`] | [`AgentBuilder`], [`Agent`], [`RunReport`], the gated executor, subagents (`task`) |
//! | [`record`] | the JSON Lines trace, a trace read back, [`record::replay`], resume, the loop's invariants, the JSON report, the views |
//!
//! The course's six lessons map onto them: the loop (layer 1) is [`core`]
//! and [`run`]; tools (2) are [`tools`]; permissions (3) and hooks (4) are
//! [`policy`]; the plan (5) is [`core::plan`] and `todo_write`; the
//! subagent (6) is [`agent::subagent`]. The command line is the binary's
//! own (`src/main.rs`; `src/cli/` parses flags, wires Ctrl-C, `SIGTERM` and
//! `SIGHUP` to the library's handles, and prints; `src/host/` configures a
//! run from the flags), built with the default `cli` feature. The library
//! installs no signal handler and keeps no process-wide state.
//!
//! ## Invariants, and the tests that guard them
//!
//! * A turn is a type: `Conversation<Fresh>`, `Conversation<AwaitingModel>`,
//!   `Conversation<AwaitingTools>`, `Conversation<Finished<S>>` ([`Conversation`]).
//!   Transitions consume `self`; a finished conversation has no transition,
//!   tools cannot be skipped, and the configuration (system prompt, output
//!   check, empty-reply policy) is set only before the conversation begins
//!   (the `compile_fail` examples in [`core::conversation`]).
//! * A reply is checked once, at [`Conversation::receive`]: known block types,
//!   non-empty unique tool_use ids, stop reason and content in agreement;
//!   anything else finishes `protocol_error` naming the [`core::conversation::Violation`], never a
//!   panic (`tests/core/conversation_rules.rs`, `tests/core/loop_properties.rs`).
//! * The assistant reply is stored before any tool runs; every call gets
//!   exactly one result, carrying its id, in the next user message, in call
//!   order ([`Conversation::answer_with`] pairs ids itself; the raw
//!   [`Conversation::submit`] and [`Conversation::answer_round`] reject
//!   mismatches and hand the state back).
//! * At most `max_calls` model requests; budget 0 is an [`core::error::InputError`].
//! * A tool runs only if the registry that produced the request's tool list
//!   holds it and its arguments match its schema (`tests/tools/registry_schema.rs`,
//!   `tests/tools/dispatch_properties.rs`); `run_main` runs only after approval,
//!   and a denial wins over every hook (`tests/tools/gate_and_hooks.rs`,
//!   `tests/tools/run_main_process.rs`); `read_file` never leaves the workspace nor
//!   hangs (`tests/tools/read_file_paths.rs`). On Linux `run_main`'s program
//!   runs in a sandbox ([`tools::sandbox`]: the workspace and a private
//!   `TMPDIR`, the system read-only, no socket, no signal out, a short
//!   environment), or does not run where the kernel cannot enforce it
//!   (`tests/tools/sandbox.rs`).
//! * The plan rides on each parent request, never in the history
//!   (`tests/tools/plan_attachment.rs`).
//! * A child starts from `[user: task]`, holds only read-only whitelisted
//!   tools (holding `task` does not compile: see [`agent::subagent`]), passes the
//!   parent's gate, runs the hooks the host named, and always yields a report
//!   under the original id (`tests/tools/subagent.rs`, `tests/cli/demo_runs.rs`).
//! * No run exceeds its limits, and every id is still answered exactly once
//!   when one is hit (`tests/core/run_limits.rs`).
//!
//! ## Embedding
//!
//! ```
//! use std::sync::Arc;
//! use serde_json::json;
//! use subloop::policy::permission::DenyAll;
//! use subloop::agent::subagent::SubagentConfig;
//! use subloop::providers::scripted::ScriptedChildren;
//! use subloop::tools::ReadFile;
//! use subloop::providers::scripted::ScriptedModel;
//! use subloop::{AgentBuilder, Budget, Hooks, ModelResponse, StatusKind};
//!
//! let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace");
//! let children = ScriptedChildren(vec![vec![Ok(ModelResponse::answer("main.py prints 42"))]]);
//! let agent = AgentBuilder::new(Arc::new(DenyAll))
//!     .read_only_tool(ReadFile::new(&workspace, ReadFile::DEFAULT_LIMIT)?)?
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
pub mod core;
pub mod policy;
pub mod providers;
pub mod record;
pub mod run;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tools;

pub use agent::{Agent, AgentBuilder, RunReport};
pub use core::conversation::{Budget, Conversation, Outcome, StatusKind};
pub use core::protocol::ModelResponse;
pub use policy::hooks::Hooks;
pub use policy::permission::Approver;
pub use run::limits::{CancelHandle, Limits, StopSignal};
pub use run::model::Model;
pub use tools::{ReadOnlyTool, Tool, TypedTool};

/// The manual's pages whose examples are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/tools.md")]
pub struct ToolsManual;
