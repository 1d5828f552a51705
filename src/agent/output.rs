//! Structured answers: an answer the host asked to be a JSON value of a
//! given schema (or Rust type), checked locally whatever the model, and
//! sent back to the model with the reason when it does not match.
//!
//! [`SchemaOutput`] checks against a JSON schema (the CLI's
//! `--output-schema FILE`); [`TypedOutput`] against the schema `schemars`
//! derives from a Rust type, and also deserializes into it. Both are
//! [`OutputCheck`]s, which [`crate::AgentBuilder::output_check`] and
//! `SubagentConfig::output_check` take.

use std::marker::PhantomData;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::core::conversation::OutputCheck;
use crate::tools::schema::Schema;

/// How many times an answer that does not match is sent back by default.
pub(crate) const DEFAULT_OUTPUT_RETRIES: u32 = 1;

/// The JSON value an answer's text holds: the whole text, trimmed, or the
/// inside of one fenced code block (```` ```json … ``` ````) that is the
/// whole text, as models without a native structured output often write it.
pub(crate) fn answer_value(text: &str) -> Result<Value, String> {
    let trimmed = text.trim();
    let inner = trimmed
        .strip_prefix("```")
        .and_then(|rest| rest.strip_suffix("```"))
        .map(|rest| {
            // The fence's language tag (`json`) runs to the end of its line.
            let rest = rest.strip_prefix("json").unwrap_or(rest);
            rest.trim()
        })
        .unwrap_or(trimmed);
    serde_json::from_str(inner).map_err(|err| format!("the answer is not JSON ({err})"))
}

/// An answer checked against a JSON schema, with the crate's schema
/// validator ([`crate::tools::schema`]).
#[derive(Debug, Clone)]
pub struct SchemaOutput {
    schema: Value,
    compiled: Schema,
}

impl SchemaOutput {
    /// How many times an answer that does not match is sent back by default.
    pub const DEFAULT_RETRIES: u32 = DEFAULT_OUTPUT_RETRIES;

    /// A check against `schema`.
    pub fn new(schema: Value) -> Self {
        let compiled = Schema::new(&schema);
        Self { schema, compiled }
    }

    /// The check, shared, for a builder.
    pub fn shared(schema: Value) -> Arc<dyn OutputCheck> {
        Arc::new(Self::new(schema))
    }
}

impl OutputCheck for SchemaOutput {
    fn schema(&self) -> &Value {
        &self.schema
    }

    fn check(&self, text: &str) -> Result<Value, String> {
        let value = answer_value(text)?;
        self.compiled.validate(&value).map_err(|err| {
            // The validator names the root `input` (it checks tool input).
            let path = match err.path.strip_prefix("input") {
                Some(rest) => format!("answer{rest}"),
                None => err.path.clone(),
            };
            format!("{path}: {}", err.message)
        })?;
        Ok(value)
    }
}

/// An answer checked against the schema of `T` and deserialized into it.
pub struct TypedOutput<T> {
    schema: SchemaOutput,
    _type: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for TypedOutput<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedOutput")
            .field("type", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<T: JsonSchema + DeserializeOwned> TypedOutput<T> {
    /// A check against `T`'s schema.
    pub fn new() -> Self {
        Self {
            schema: SchemaOutput::new(crate::tools::input_schema_for::<T>()),
            _type: PhantomData,
        }
    }

    /// The check, shared, for a builder.
    pub fn shared() -> Arc<dyn OutputCheck>
    where
        T: 'static,
    {
        Arc::new(Self::new())
    }
}

impl<T: JsonSchema + DeserializeOwned> Default for TypedOutput<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: JsonSchema + DeserializeOwned> OutputCheck for TypedOutput<T> {
    fn schema(&self) -> &Value {
        self.schema.schema()
    }

    fn check(&self, text: &str) -> Result<Value, String> {
        let value = self.schema.check(text)?;
        // The schema and serde can disagree (a constraint the validator
        // does not know): the value must also be a `T`.
        T::deserialize(&value).map_err(|err| format!("answer: {err}"))?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fenced_and_bare_json_are_read_and_prose_is_not() {
        assert_eq!(answer_value(" {\"a\": 1} "), Ok(json!({"a": 1})));
        assert_eq!(
            answer_value("```json\n{\"a\": 1}\n```"),
            Ok(json!({"a": 1}))
        );
        assert_eq!(answer_value("```\n[1]\n```"), Ok(json!([1])));
        assert!(answer_value("The answer is 42.").is_err());
    }

    #[test]
    fn a_mismatch_names_the_answer_field() {
        let check = SchemaOutput::new(json!({
            "type": "object",
            "properties": {"verdict": {"type": "string"}},
            "required": ["verdict"]
        }));
        assert_eq!(
            check.check("{\"verdict\": 3}"),
            Err("answer.verdict: expected string, got integer".to_owned())
        );
        assert_eq!(
            check.check("{\"verdict\": \"ok\"}"),
            Ok(json!({"verdict": "ok"}))
        );
    }
}
