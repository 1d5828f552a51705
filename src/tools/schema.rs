//! A small JSON-schema subset validator for tool arguments.
//!
//! Supported keywords: `type` (`object`, `string`, `integer`, `number`,
//! `boolean`, `array`, `null`), `properties`, `required`,
//! `additionalProperties: false`, `enum`, `minLength` / `maxLength` (counted
//! in characters), `items`, `minItems` / `maxItems`. Unknown keywords are
//! ignored. This is our own code rather than the `jsonschema` crate, which
//! pulls in about sixty dependencies for features tool schemas do not use.

use serde_json::Value;
use thiserror::Error;

/// Arguments that do not match a schema; `path` names the bad field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    /// Where: `input`, `input.path`, `input.items[2].status`, ...
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// Checks `value` against `schema`; the first mismatch is reported.
pub fn validate(schema: &Value, value: &Value) -> Result<(), SchemaError> {
    check(schema, value, &Place::Input)
}

/// Where a value sits in the input; written out only when a check fails, so
/// a call that passes costs no path strings.
enum Place<'a> {
    Input,
    Field(&'a Place<'a>, &'a str),
    Item(&'a Place<'a>, usize),
}

impl std::fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Input => f.write_str("input"),
            Self::Field(parent, name) => write!(f, "{parent}.{name}"),
            Self::Item(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

fn fail(path: &Place<'_>, message: impl Into<String>) -> Result<(), SchemaError> {
    Err(SchemaError {
        path: path.to_string(),
        message: message.into(),
    })
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(value: &Value, expected: &str) -> bool {
    match expected {
        "number" => value.is_number(),
        "integer" => match value {
            Value::Number(n) => {
                n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
            }
            _ => false,
        },
        other => type_name(value) == other,
    }
}

fn bound(schema: &Value, key: &str) -> Option<u64> {
    schema.get(key).and_then(Value::as_u64)
}

/// Checks a length against the schema's `(min, max)` keywords.
fn bounds(
    schema: &Value,
    path: &Place<'_>,
    len: u64,
    keys: (&str, &str),
    unit: (&str, &str),
) -> Result<(), SchemaError> {
    // `1 character`, `2 characters`.
    let units = |n: u64| if n == 1 { unit.0 } else { unit.1 };
    if let Some(min) = bound(schema, keys.0)
        && len < min
    {
        return fail(
            path,
            format!("must have at least {min} {} (got {len})", units(min)),
        );
    }
    if let Some(max) = bound(schema, keys.1)
        && len > max
    {
        return fail(
            path,
            format!("must have at most {max} {} (got {len})", units(max)),
        );
    }
    Ok(())
}

fn check(schema: &Value, value: &Value, path: &Place<'_>) -> Result<(), SchemaError> {
    match schema.get("type") {
        Some(Value::String(expected)) if !has_type(value, expected) => {
            return fail(
                path,
                format!("expected {expected}, got {}", type_name(value)),
            );
        }
        Some(Value::Array(options)) => {
            let matches = options
                .iter()
                .filter_map(Value::as_str)
                .any(|expected| has_type(value, expected));
            if !matches {
                return fail(
                    path,
                    format!("got {}, which the schema does not allow", type_name(value)),
                );
            }
        }
        _ => {}
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return fail(path, format!("must be one of {}", list.join(", ")));
    }
    match value {
        Value::String(text) => {
            let len = text.chars().count() as u64;
            bounds(
                schema,
                path,
                len,
                ("minLength", "maxLength"),
                ("character", "characters"),
            )?;
        }
        Value::Array(items) => {
            bounds(
                schema,
                path,
                items.len() as u64,
                ("minItems", "maxItems"),
                ("item", "items"),
            )?;
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    check(item_schema, item, &Place::Item(path, index))?;
                }
            }
        }
        Value::Object(fields) => {
            if let Some(Value::Array(required)) = schema.get("required") {
                for name in required.iter().filter_map(Value::as_str) {
                    if !fields.contains_key(name) {
                        return fail(&Place::Field(path, name), "required field is missing");
                    }
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
            for (name, field) in fields {
                let field_path = Place::Field(path, name);
                match properties.and_then(|props| props.get(name)) {
                    Some(field_schema) => check(field_schema, field, &field_path)?,
                    None if closed => return fail(&field_path, "unexpected field"),
                    None => {}
                }
            }
        }
        _ => {}
    }
    Ok(())
}
