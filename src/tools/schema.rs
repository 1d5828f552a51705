//! A small JSON-schema subset validator for tool arguments.
//!
//! Supported keywords: `type` (`object`, `string`, `integer`, `number`,
//! `boolean`, `array`, `null`), `properties`, `required`,
//! `additionalProperties: false`, `enum`, `minLength` / `maxLength` (counted
//! in characters), `items`, `minItems` / `maxItems`. Unknown keywords are
//! ignored. This is our own code rather than the `jsonschema` crate, which
//! pulls in about sixty dependencies for features tool schemas do not use.

use std::collections::BTreeMap;

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
///
/// The same as [`Schema::new`] then [`Schema::validate`]; a schema checked
/// many times is better compiled once (the registry does so for each tool).
pub fn validate(schema: &Value, value: &Value) -> Result<(), SchemaError> {
    Schema::new(schema).validate(value)
}

/// A schema compiled once: the keywords the validator implements, read out
/// of the schema's JSON when it is made rather than looked up at every
/// check. What it accepts and the errors it reports are [`validate`]'s.
///
/// ```
/// use serde_json::json;
/// use subloop::tools::schema::Schema;
///
/// let schema = Schema::new(&json!({
///     "type": "object",
///     "properties": {"path": {"type": "string", "minLength": 1}},
///     "required": ["path"],
///     "additionalProperties": false
/// }));
/// assert!(schema.validate(&json!({"path": "main.py"})).is_ok());
/// let err = schema.validate(&json!({"path": ""})).unwrap_err();
/// assert_eq!(err.to_string(), "input.path: must have at least 1 character (got 0)");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Schema {
    types: Types,
    allowed: Option<Vec<Value>>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    items: Option<Box<Schema>>,
    required: Vec<String>,
    properties: Option<BTreeMap<String, Schema>>,
    closed: bool,
}

/// The `type` keyword: absent (or not a string or an array), one type, or
/// a list of them (its non-string entries ignored).
#[derive(Debug, Clone, Default, PartialEq)]
enum Types {
    #[default]
    Any,
    One(String),
    AnyOf(Vec<String>),
}

impl Schema {
    /// Compiles `schema`; a value that is not an object checks nothing, as
    /// do the keywords the validator does not implement.
    pub fn new(schema: &Value) -> Self {
        let Some(keywords) = schema.as_object() else {
            return Self::default();
        };
        let bound = |key: &str| keywords.get(key).and_then(Value::as_u64);
        Self {
            types: match keywords.get("type") {
                Some(Value::String(expected)) => Types::One(expected.clone()),
                Some(Value::Array(options)) => Types::AnyOf(
                    options
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect(),
                ),
                _ => Types::Any,
            },
            allowed: match keywords.get("enum") {
                Some(Value::Array(allowed)) => Some(allowed.clone()),
                _ => None,
            },
            min_length: bound("minLength"),
            max_length: bound("maxLength"),
            min_items: bound("minItems"),
            max_items: bound("maxItems"),
            items: keywords
                .get("items")
                .map(|items| Box::new(Self::new(items))),
            required: match keywords.get("required") {
                Some(Value::Array(required)) => required
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect(),
                _ => Vec::new(),
            },
            properties: keywords
                .get("properties")
                .and_then(Value::as_object)
                .map(|properties| {
                    properties
                        .iter()
                        .map(|(name, field)| (name.clone(), Self::new(field)))
                        .collect()
                }),
            closed: keywords.get("additionalProperties") == Some(&Value::Bool(false)),
        }
    }

    /// Checks `value`; the first mismatch is reported.
    pub fn validate(&self, value: &Value) -> Result<(), SchemaError> {
        self.check(value, &Place::Input)
    }

    fn check(&self, value: &Value, path: &Place<'_>) -> Result<(), SchemaError> {
        match &self.types {
            Types::One(expected) if !has_type(value, expected) => {
                return fail(
                    path,
                    format!("expected {expected}, got {}", type_name(value)),
                );
            }
            Types::AnyOf(options) if !options.iter().any(|expected| has_type(value, expected)) => {
                return fail(
                    path,
                    format!("got {}, which the schema does not allow", type_name(value)),
                );
            }
            _ => {}
        }
        if let Some(allowed) = &self.allowed
            && !allowed.contains(value)
        {
            let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return fail(path, format!("must be one of {}", list.join(", ")));
        }
        match value {
            // Characters are counted only when there is a bound to count against.
            Value::String(text) if self.min_length.is_some() || self.max_length.is_some() => {
                let len = text.chars().count() as u64;
                bounds(
                    path,
                    len,
                    (self.min_length, self.max_length),
                    ("character", "characters"),
                )?;
            }
            Value::Array(items) => {
                bounds(
                    path,
                    items.len() as u64,
                    (self.min_items, self.max_items),
                    ("item", "items"),
                )?;
                if let Some(item_schema) = &self.items {
                    for (index, item) in items.iter().enumerate() {
                        item_schema.check(item, &Place::Item(path, index))?;
                    }
                }
            }
            Value::Object(fields) => {
                for name in &self.required {
                    if !fields.contains_key(name) {
                        return fail(&Place::Field(path, name), "required field is missing");
                    }
                }
                for (name, field) in fields {
                    let field_path = Place::Field(path, name);
                    match self.properties.as_ref().and_then(|props| props.get(name)) {
                        Some(field_schema) => field_schema.check(field, &field_path)?,
                        None if self.closed => return fail(&field_path, "unexpected field"),
                        None => {}
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
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

/// Checks a length against a `(min, max)` pair of keywords.
fn bounds(
    path: &Place<'_>,
    len: u64,
    (min, max): (Option<u64>, Option<u64>),
    unit: (&str, &str),
) -> Result<(), SchemaError> {
    // `1 character`, `2 characters`.
    let units = |n: u64| if n == 1 { unit.0 } else { unit.1 };
    if let Some(min) = min
        && len < min
    {
        return fail(
            path,
            format!("must have at least {min} {} (got {len})", units(min)),
        );
    }
    if let Some(max) = max
        && len > max
    {
        return fail(
            path,
            format!("must have at most {max} {} (got {len})", units(max)),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The compiled schema against the interpreter it replaced, which looked
    //! every keyword up in the schema's JSON at every check: kept here as
    //! the oracle, so compiling changes no verdict and no message.

    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn bound(schema: &Value, key: &str) -> Option<u64> {
        schema.get(key).and_then(Value::as_u64)
    }

    fn old_bounds(
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

    fn interpreted(schema: &Value, value: &Value, path: &Place<'_>) -> Result<(), SchemaError> {
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
                old_bounds(
                    schema,
                    path,
                    len,
                    ("minLength", "maxLength"),
                    ("character", "characters"),
                )?;
            }
            Value::Array(items) => {
                old_bounds(
                    schema,
                    path,
                    items.len() as u64,
                    ("minItems", "maxItems"),
                    ("item", "items"),
                )?;
                if let Some(item_schema) = schema.get("items") {
                    for (index, item) in items.iter().enumerate() {
                        interpreted(item_schema, item, &Place::Item(path, index))?;
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
                        Some(field_schema) => interpreted(field_schema, field, &field_path)?,
                        None if closed => return fail(&field_path, "unexpected field"),
                        None => {}
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Schemas made of the keywords the validator implements (with good and
    /// bad values for each) and some it ignores.
    fn schema() -> impl Strategy<Value = Value> {
        let type_name = prop_oneof![
            Just(json!("object")),
            Just(json!("string")),
            Just(json!("integer")),
            Just(json!("number")),
            Just(json!("boolean")),
            Just(json!("array")),
            Just(json!("null")),
            Just(json!("nonsense")),
            Just(json!(5)),
        ];
        let types = prop_oneof![
            type_name.clone(),
            prop::collection::vec(type_name, 0..3).prop_map(Value::Array),
        ];
        let bound = prop_oneof![
            Just(json!(0)),
            Just(json!(1)),
            Just(json!(3)),
            Just(json!(-1)),
            Just(json!("2"))
        ];
        let leaf = (
            prop::option::of(types),
            prop::option::of(prop::collection::vec(value(), 0..3)),
            prop::option::of(bound.clone()),
            prop::option::of(bound),
        )
            .prop_map(|(types, allowed, low, high)| {
                let mut schema = serde_json::Map::new();
                if let Some(types) = types {
                    schema.insert("type".into(), types);
                }
                if let Some(allowed) = allowed {
                    schema.insert("enum".into(), Value::Array(allowed));
                }
                if let Some(low) = low {
                    schema.insert("minLength".into(), low.clone());
                    schema.insert("minItems".into(), low);
                }
                if let Some(high) = high {
                    schema.insert("maxLength".into(), high.clone());
                    schema.insert("maxItems".into(), high);
                }
                schema.insert("$ref".into(), json!("#/ignored"));
                Value::Object(schema)
            })
            .boxed();
        prop_oneof![Just(json!(true)), leaf.clone()].prop_recursive(3, 24, 3, move |inner| {
            (
                leaf.clone(),
                prop::option::of(inner.clone()),
                prop::option::of(prop::collection::btree_map("[abc]", inner, 0..3)),
                prop::option::of(prop::collection::vec(
                    prop_oneof![Just(json!("a")), Just(json!("b")), Just(json!(1))],
                    0..3,
                )),
                prop::option::of(prop_oneof![Just(json!(false)), Just(json!(true))]),
            )
                .prop_map(|(mut schema, items, properties, required, additional)| {
                    if let Value::Object(keywords) = &mut schema {
                        if let Some(items) = items {
                            keywords.insert("items".into(), items);
                        }
                        if let Some(properties) = properties {
                            keywords.insert("properties".into(), json!(properties));
                        }
                        if let Some(required) = required {
                            keywords.insert("required".into(), Value::Array(required));
                        }
                        if let Some(additional) = additional {
                            keywords.insert("additionalProperties".into(), additional);
                        }
                    }
                    schema
                })
        })
    }

    /// Arguments of every JSON type, nested.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-3i64..4).prop_map(Value::from),
            Just(json!(2.0)),
            Just(json!(2.5)),
            "[aé]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[abc]", inner, 0..3).prop_map(|map| json!(map)),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]
        #[test]
        fn compiling_changes_no_verdict_and_no_message(schema in schema(), value in value()) {
            prop_assert_eq!(
                Schema::new(&schema).validate(&value),
                interpreted(&schema, &value, &Place::Input),
                "schema {} value {}", schema, value
            );
        }
    }
}
