//! What kind of failure an API's error is ([`FailureKind`]): the kind its
//! name gives (Anthropic's `error.type`; an OpenAI-compatible server's
//! `type`, else its `code`), unless it says the prompt does not fit the
//! model's context window, which every server says its own way:
//!
//! * Anthropic: HTTP 400 `invalid_request_error`, "prompt is too long:
//!   208656 tokens > 200000 maximum", or "input length and `max_tokens`
//!   exceed context limit: 197000 + 8192 > 200000, ...";
//! * OpenAI: HTTP 400 `invalid_request_error` with the code
//!   `context_length_exceeded`, "This model's maximum context length is
//!   8192 tokens. However, your messages resulted in 8227 tokens. ...";
//!   vLLM, DeepSeek and OpenRouter say "maximum context length" too (vLLM
//!   with the type `BadRequestError` and a numeric code);
//! * llama.cpp: HTTP 400 `exceed_context_size_error`, "request (9412
//!   tokens) exceeds the available context size (8192 tokens), try
//!   increasing it" (older builds: "the request exceeds the available
//!   context size, try increasing it").

use serde_json::Value;

use crate::core::error::FailureKind;

/// Error types and codes that name a context-window overflow.
const CONTEXT_NAMES: [&str; 2] = ["context_length_exceeded", "exceed_context_size_error"];

/// What the messages of context-window overflows say, in lower case.
const CONTEXT_PHRASES: [&str; 5] = [
    // Anthropic
    "prompt is too long",
    "exceed context limit",
    // OpenAI, vLLM, DeepSeek, OpenRouter, Mistral
    "maximum context length",
    "exceeds the context window",
    // llama.cpp
    "exceeds the available context size",
];

/// The kind of an API error named `name` (with an OpenAI-compatible
/// `code`, if any) saying `message`.
pub(crate) fn api_kind(name: &str, code: Option<&str>, message: &str) -> FailureKind {
    let context_name = |text: &str| CONTEXT_NAMES.contains(&text);
    let message = message.to_lowercase();
    if context_name(name)
        || code.is_some_and(context_name)
        || CONTEXT_PHRASES
            .iter()
            .any(|phrase| message.contains(phrase))
    {
        return FailureKind::ContextWindow;
    }
    FailureKind::from_name(name)
}

/// The text `code` of an OpenAI-compatible error body (`{"error": {"code"}}`,
/// or a bare `{"object": "error", "code"}`), if it has one.
pub(crate) fn openai_code(body: &Value) -> Option<&str> {
    body.get("error")
        .filter(|error| error.is_object())
        .unwrap_or(body)
        .get("code")
        .and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The kind of an error body (Anthropic's `{"type": "error", "error":
    /// {"type", "message"}}`, or an OpenAI-compatible one), its name read
    /// as the providers read it: the `type`, else a text `code`.
    fn kind_of(body: &Value) -> FailureKind {
        let error = body.get("error").filter(|e| e.is_object()).unwrap_or(body);
        let text = |key| error.get(key).and_then(Value::as_str);
        let name = text("type").or(text("code")).unwrap_or("api_error");
        api_kind(name, openai_code(body), text("message").unwrap_or_default())
    }

    #[test]
    fn anthropic_context_overflows_are_recognised() {
        let too_long = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "prompt is too long: 208656 tokens > 200000 maximum"},
            "request_id": "req_011CWdepJvA2D819tdYYq4h7"});
        assert_eq!(kind_of(&too_long), FailureKind::ContextWindow);
        let with_output = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "input length and `max_tokens` exceed context limit: 197824 + 8192 > 200000, decrease input length or `max_tokens` and try again"}});
        assert_eq!(kind_of(&with_output), FailureKind::ContextWindow);
    }

    #[test]
    fn other_anthropic_errors_keep_their_type() {
        let output_limit = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "max_tokens: 10000 > 4096, which is the maximum allowed number of output tokens for claude-3-5-sonnet-20240620"}});
        assert_eq!(kind_of(&output_limit), FailureKind::InvalidRequest);
        let too_large = json!({"type": "error", "error": {"type": "request_too_large",
            "message": "Request exceeds the maximum allowed number of bytes."}});
        assert_eq!(
            kind_of(&too_large),
            FailureKind::Api("request_too_large".into())
        );
        let overloaded = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        assert_eq!(kind_of(&overloaded), FailureKind::Overloaded);
        let limited = json!({"type": "error", "error": {"type": "rate_limit_error",
            "message": "Number of request tokens has exceeded your per-minute rate limit"}});
        assert_eq!(kind_of(&limited), FailureKind::RateLimited);
    }

    #[test]
    fn openai_compatible_context_overflows_are_recognised() {
        let openai = json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 8227 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        assert_eq!(kind_of(&openai), FailureKind::ContextWindow);
        // The code alone says it, whatever the message.
        let coded = json!({"error": {"message": "Input tokens exceed the configured limit of 272000 tokens.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        assert_eq!(kind_of(&coded), FailureKind::ContextWindow);
        let vllm = json!({"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError", "param": null, "code": 400});
        assert_eq!(kind_of(&vllm), FailureKind::ContextWindow);
        let llama = json!({"error": {"code": 400, "message": "request (9412 tokens) exceeds the available context size (8192 tokens), try increasing it",
            "type": "exceed_context_size_error", "n_prompt_tokens": 9412, "n_ctx": 8192}});
        assert_eq!(kind_of(&llama), FailureKind::ContextWindow);
        let older_llama = json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
            "type": "invalid_request_error"}});
        assert_eq!(kind_of(&older_llama), FailureKind::ContextWindow);
    }

    #[test]
    fn other_openai_compatible_errors_keep_their_name() {
        let key = json!({"error": {"message": "Incorrect API key provided",
            "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}});
        assert_eq!(kind_of(&key), FailureKind::InvalidRequest);
        let server = json!({"error": {"message": "overloaded", "type": "server_error"}});
        assert_eq!(kind_of(&server), FailureKind::Api("server_error".into()));
        let quota = json!({"error": {"message": "You exceeded your current quota",
            "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}});
        assert_eq!(
            kind_of(&quota),
            FailureKind::Api("insufficient_quota".into())
        );
        assert_eq!(openai_code(&key), Some("invalid_api_key"));
        assert_eq!(openai_code(&json!({"object": "error", "code": 400})), None);
        assert_eq!(openai_code(&json!({"error": "model not found"})), None);
    }
}
