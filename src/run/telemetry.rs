//! Spans for runs, model requests and tool calls, in the OpenTelemetry
//! GenAI semantic conventions, through the `tracing` crate.
//!
//! The loop opens one `chat` span per model request; the agent layer opens
//! one `invoke_agent` span per agent (the parent and each subagent) and one
//! `execute_tool` span per tool call. Nothing is recorded unless the host
//! installs a `tracing` subscriber: without one, every span here is
//! disabled, and the values of its fields are never computed. A host that
//! has a subscriber sees the spans in its own trace (the run's root span is
//! a child of the caller's current span); the CLI exports them over OTLP
//! (see `docs/observability.md`).
//!
//! Message and tool content (the request's messages, the reply, a tool's
//! arguments and result) is recorded only when [`Telemetry::capture_content`]
//! is set.

use serde::Serialize;
use tracing::field::Empty;
use tracing::{Dispatch, Span};

use crate::core::agent_id::AgentId;
use crate::core::conversation::{Outcome, StatusKind, ToolCall};
use crate::core::error::ModelFailure;
use crate::core::protocol::{ModelResponse, Request, Usage};
use crate::run::model::{ModelIdentity, Received};

/// The `tracing` target of every span here.
pub(crate) const TARGET: &str = "subloop";

/// What a run's spans may record, set by the host (see
/// `AgentBuilder::telemetry`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Telemetry {
    /// Record message and tool content as span attributes
    /// (`gen_ai.input.messages`, `gen_ai.output.messages`,
    /// `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`). Off by
    /// default: content may hold anything a file or a model said.
    pub capture_content: bool,
}

impl Telemetry {
    /// The `tracing` target of every span a run opens: a host's filter
    /// selects them with it.
    pub const TARGET: &'static str = TARGET;
}

/// The name an agent's span gives it (`gen_ai.agent.name`).
fn agent_name(agent: &AgentId) -> &'static str {
    match agent {
        AgentId::Parent => "subloop",
        AgentId::Child { .. } => "subloop.task",
    }
}

/// The `invoke_agent` span of `agent`, a child of the current span.
pub(crate) fn agent_span(agent: &AgentId) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "invoke_agent",
        otel.name = format!("invoke_agent {}", agent_name(agent)),
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.id = %agent,
        gen_ai.agent.name = agent_name(agent),
        gen_ai.provider.name = Empty,
        gen_ai.request.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.usage.cache_read.input_tokens = Empty,
        gen_ai.usage.cache_creation.input_tokens = Empty,
        subloop.usage.total_input_tokens = Empty,
        subloop.usage.total_output_tokens = Empty,
        subloop.usage.total_cache_read_input_tokens = Empty,
        subloop.usage.total_cache_creation_input_tokens = Empty,
        subloop.status = Empty,
        subloop.calls = Empty,
        subloop.budget = Empty,
        error.type = Empty,
        gen_ai.input.messages = Empty,
    );
    span
}

/// The subscriber `span` reports to, or else this thread's default: a
/// subagent on another thread reports to its parent's subscriber even when
/// that one is only a thread's default.
pub(crate) fn dispatch_of(span: &Span) -> Dispatch {
    span.with_subscriber(|(_, dispatch)| dispatch.clone())
        .unwrap_or_else(|| tracing::dispatcher::get_default(Dispatch::clone))
}

/// The `invoke_agent` span of a subagent, a child of `parent` (the
/// `execute_tool` span of the `task` call that started it), reported to
/// `dispatch` (see [`dispatch_of`]).
pub(crate) fn child_agent_span(parent: &Span, dispatch: &Dispatch, agent: &AgentId) -> Span {
    tracing::dispatcher::with_default(dispatch, || {
        let _entered = parent.enter();
        agent_span(agent)
    })
}

/// Says on an agent's span which provider and model it asks.
pub(crate) fn record_identity(span: &Span, identity: Option<&ModelIdentity>) {
    if span.is_disabled() {
        return;
    }
    if let Some(identity) = identity {
        span.record("gen_ai.provider.name", identity.provider.as_str());
        if let Some(model) = &identity.model {
            span.record("gen_ai.request.model", model.as_str());
        }
    }
}

/// Records an agent's call budget (model requests it may make).
pub(crate) fn record_budget(span: &Span, budget: u32) {
    span.record("subloop.budget", i64::from(budget));
}

/// Records the task or question an agent was given, when content is captured.
pub(crate) fn record_agent_input(span: &Span, telemetry: Telemetry, text: &str) {
    if span.is_disabled() || !telemetry.capture_content {
        return;
    }
    let messages =
        serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": text}]}]);
    span.record("gen_ai.input.messages", messages.to_string());
}

/// Records how an agent's run ended: its status, calls made and budget,
/// its own usage and its total (`total` includes its children's).
pub(crate) fn record_outcome(span: &Span, outcome: &Outcome, total: &Usage) {
    if span.is_disabled() {
        return;
    }
    record_usage(span, &outcome.usage);
    span.record("subloop.usage.total_input_tokens", int(input_tokens(total)));
    span.record(
        "subloop.usage.total_output_tokens",
        int(total.output_tokens),
    );
    span.record(
        "subloop.usage.total_cache_read_input_tokens",
        int(total.cache_read_input_tokens),
    );
    span.record(
        "subloop.usage.total_cache_creation_input_tokens",
        int(total.cache_creation_input_tokens),
    );
    span.record("subloop.status", outcome.status.as_str());
    span.record("subloop.calls", i64::from(outcome.calls));
    if !matches!(outcome.status, StatusKind::Answered) {
        span.record("error.type", outcome.status.as_str());
        span.record("otel.status_code", "ERROR");
    }
}

/// A count as an OpenTelemetry integer attribute (a signed 64-bit one;
/// an unsigned value would be exported as text).
fn int(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// All input tokens, cached ones included, as the conventions count
/// `gen_ai.usage.input_tokens` (Anthropic's `input_tokens` leaves out
/// the tokens read from or written to its cache).
fn input_tokens(usage: &Usage) -> u64 {
    usage
        .input_tokens
        .saturating_add(usage.cache_read_input_tokens)
        .saturating_add(usage.cache_creation_input_tokens)
}

fn record_usage(span: &Span, usage: &Usage) {
    span.record("gen_ai.usage.input_tokens", int(input_tokens(usage)));
    span.record("gen_ai.usage.output_tokens", int(usage.output_tokens));
    span.record(
        "gen_ai.usage.cache_read.input_tokens",
        int(usage.cache_read_input_tokens),
    );
    span.record(
        "gen_ai.usage.cache_creation.input_tokens",
        int(usage.cache_creation_input_tokens),
    );
}

/// The `chat` span of model request `call` of `agent`, a child of the
/// current span (the agent's).
pub(crate) fn chat_span(identity: Option<&ModelIdentity>, agent: &AgentId, call: u32) -> Span {
    let model = identity.and_then(|identity| identity.model.as_deref());
    tracing::info_span!(
        target: TARGET,
        "chat",
        otel.name = match model {
            Some(model) => format!("chat {model}"),
            None => "chat".to_owned(),
        },
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = identity.map(|identity| identity.provider.as_str()),
        gen_ai.request.model = model,
        gen_ai.agent.id = %agent,
        gen_ai.response.id = Empty,
        gen_ai.response.model = Empty,
        gen_ai.response.finish_reasons = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.usage.cache_read.input_tokens = Empty,
        gen_ai.usage.cache_creation.input_tokens = Empty,
        subloop.call = i64::from(call),
        error.type = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
    )
}

/// Records the request's messages on its `chat` span, when content is captured.
pub(crate) fn record_request(span: &Span, telemetry: Telemetry, request: &Request<'_>) {
    if span.is_disabled() || !telemetry.capture_content {
        return;
    }
    if let Ok(text) = serde_json::to_string(request.messages) {
        span.record("gen_ai.input.messages", text);
    }
}

/// The reply as the output-messages attribute holds it.
#[derive(Serialize)]
struct OutputMessage<'a> {
    role: &'static str,
    content: &'a ModelResponse,
}

/// Records the reply on its `chat` span: the response's id and model (from
/// the wire form, when there is one), the finish reason, the usage, and
/// with content captured, the reply itself.
pub(crate) fn record_response(span: &Span, telemetry: Telemetry, received: &Received) {
    if span.is_disabled() {
        return;
    }
    if let Some(raw) = &received.raw {
        if let Some(id) = raw.get("id").and_then(serde_json::Value::as_str) {
            span.record("gen_ai.response.id", id);
        }
        if let Some(model) = raw.get("model").and_then(serde_json::Value::as_str) {
            span.record("gen_ai.response.model", model);
        }
    }
    if let Some(reason) = &received.response.stop_reason {
        span.record("gen_ai.response.finish_reasons", reason.as_str());
    }
    if let Some(usage) = &received.response.usage {
        record_usage(span, usage);
    }
    if telemetry.capture_content {
        let message = OutputMessage {
            role: "assistant",
            content: &received.response,
        };
        if let Ok(text) = serde_json::to_string(&[message]) {
            span.record("gen_ai.output.messages", text);
        }
    }
}

/// Records a failed request on its `chat` span.
pub(crate) fn record_failure(span: &Span, failure: &ModelFailure) {
    if span.is_disabled() {
        return;
    }
    span.record(
        "error.type",
        failure.kind().map_or("model_error", |kind| kind.as_str()),
    );
    span.record("otel.status_code", "ERROR");
}

/// The `execute_tool` span of `call`, a child of the current span (the
/// calling agent's).
pub(crate) fn tool_span(call: &ToolCall, telemetry: Telemetry) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = format!("execute_tool {}", call.name()),
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = call.name(),
        gen_ai.tool.call.id = call.id().as_str(),
        gen_ai.tool.type = "function",
        subloop.decision = Empty,
        subloop.is_error = Empty,
        error.type = Empty,
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
    );
    if telemetry.capture_content && !span.is_disabled() {
        span.record("gen_ai.tool.call.arguments", call.input().to_string());
    }
    span
}

/// Records how a tool call ended on its `execute_tool` span: the gate's
/// decision (`not_required`, `allowed`, `denied`…), whether the result is
/// an error, and with content captured, the result.
pub(crate) fn record_tool(
    span: &Span,
    telemetry: Telemetry,
    decision: &str,
    is_error: bool,
    content: &str,
) {
    if span.is_disabled() {
        return;
    }
    span.record("subloop.decision", decision);
    span.record("subloop.is_error", is_error);
    if is_error {
        let kind = match decision {
            "allowed" | "not_required" => "tool_error",
            refused => refused,
        };
        span.record("error.type", kind);
        span.record("otel.status_code", "ERROR");
    }
    if telemetry.capture_content {
        span.record("gen_ai.tool.call.result", content);
    }
}
