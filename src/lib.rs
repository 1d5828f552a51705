//! subloop: a tool-using model conversation whose protocol is enforced by types.
#![deny(missing_docs)]

pub mod agent;
pub mod agent_id;
pub mod app;
pub mod conversation;
pub mod driver;
pub mod error;
pub mod executor;
pub mod hooks;
pub mod model;
pub mod monitor;
pub mod permission;
pub mod plan;
pub mod progress;
pub mod protocol;
pub mod subagent;
pub mod tools;
pub mod trace;

pub use agent::{Agent, AgentBuilder, RunReport};
pub use agent_id::AgentId;
pub use conversation::{
    AfterTools, Answered, AwaitingModel, AwaitingTools, Budget, CallLimit, Conversation, Finished,
    ModelError, ModelStopped, Outcome, ProtocolError, Rejected, Reply, Status, StatusKind,
    ToolCall, ToolOutput, ToolResult, Violation,
};
pub use driver::{Event, Executor, Observer, Silent, run};
pub use error::{InputError, ModelFailure, ScriptError, SetupError, SubmitError};
pub use model::{Model, Script, ScriptedModel, ScriptedReply};
pub use protocol::{
    Block, Message, ModelResponse, ReplyBlock, Request, Role, StopReason, ToolDefinition,
    ToolResultContent, ToolUseId, Usage,
};
