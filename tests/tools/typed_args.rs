//! Typed tools (`TypedTool`): for representative argument types, the
//! schema generated from the type accepts exactly the JSON values that
//! serde_json deserializes into it, over values built from the type's
//! schema, values serialized from the type itself, those values mutated,
//! and random JSON; and a typed tool runs through an agent with its
//! arguments checked, then read into its type.

use crate::common::RunDriven;
use crate::common::{RecordingModel, tool_results};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::FileFailurePersistence;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::ModelResponse;
use subloop::core::agent_id::AgentId;
use subloop::core::conversation::{ToolCall, ToolOutput};
use subloop::policy::permission::{ApprovalRequest, Approver, Decision};
use subloop::tools::schema::Schema;
use subloop::tools::{Capability, Tool, ToolContext, TypedTool, input_schema_for};

// ------------------------------------------------------------ the types

/// Most argument shapes at once; unknown fields refused.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Everything {
    small: u8,
    medium: u16,
    signed: i32,
    big: u64,
    ratio: f64,
    flag: bool,
    name: String,
    initial: char,
    maybe: Option<String>,
    inner: Inner,
    inners: Vec<Inner>,
    color: Color,
    shape: Shape,
    #[serde(default)]
    count: u32,
    scores: HashMap<String, u16>,
    #[serde(rename = "renamedField")]
    renamed: i64,
    maybe_shape: Option<Shape>,
    level: Level,
}

/// Open: serde ignores unknown fields, and the schema allows them.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct Inner {
    small: Option<u8>,
    tags: Vec<String>,
    #[serde(default)]
    on: bool,
}

/// Unit variants only: a string enum.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Color {
    Red,
    DarkBlue,
}

/// Externally tagged, with data: a `oneOf` of a string enum and one-key objects.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
enum Shape {
    Dot,
    Circle { r: f64 },
    Square(u32),
    Pair(u8, i8),
    Boxed(Inner),
}

/// Unit variants with doc comments: schemars writes them as `const`s with
/// descriptions in a `oneOf`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
enum Level {
    /// Quiet.
    Low,
    /// Loud.
    High,
    Medium,
}

/// Every field defaulted.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
struct Defaults {
    retries: u8,
    label: String,
    ids: Vec<i16>,
    #[serde(rename = "max-depth")]
    max_depth: Option<usize>,
}

/// Recursive at the top: its schema refers to itself with `$ref: "#"`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct List {
    value: i16,
    next: Option<Box<List>>,
}

/// Recursive below the top: `$defs` and `$ref`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Tree {
    root: Node,
    width: isize,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct Node {
    label: String,
    children: Vec<Node>,
}

// ------------------------------------------------------- the agreement

/// Checks that the schema of `T` accepts `value` exactly when serde reads
/// it into `T`, except where serde is laxer ([`lax`]): then only that
/// an accepted value is read.
fn agree<T: DeserializeOwned + JsonSchema>(value: &Value) -> Result<(), TestCaseError> {
    let schema = input_schema_for::<T>();
    let verdict = Schema::new(&schema).validate(value);
    let read = T::deserialize(value).map(|_| ());
    match (verdict, read) {
        (Ok(()), Err(err)) => {
            prop_assert!(
                false,
                "the schema takes what serde refuses ({err}): {value}"
            )
        }
        (Err(err), Ok(())) => prop_assert!(
            lax(&schema, &schema, value),
            "serde takes what the schema refuses ({err}): {value}"
        ),
        _ => {}
    }
    Ok(())
}

/// Whether `value` holds, somewhere, a form serde_json's `Value`
/// deserializer takes that the schema rightly does not offer, where the
/// two cannot agree:
/// - a struct written as an array of its fields in order
///   (`deserialize_struct` takes a sequence too);
/// - a unit variant written as `{"Variant": null}` (an enum is read from a
///   one-key map as well as from a string, and `()` from `null`).
///
/// Found by walking the value along the schema; a value holding one of them
/// is still checked in the other direction (what the schema takes, serde
/// reads).
fn lax(schema: &Value, root: &Value, value: &Value) -> bool {
    lax_at(schema, root, value, 0)
}

fn lax_at(schema: &Value, root: &Value, value: &Value, hops: u32) -> bool {
    if hops > 8 {
        return false;
    }
    if let Some(target) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|reference| reference.strip_prefix('#'))
        .and_then(|pointer| root.pointer(pointer))
        && lax_at(target, root, value, hops + 1)
    {
        return true;
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(branches)) = schema.get(key)
            && branches
                .iter()
                .any(|branch| lax_at(branch, root, value, hops + 1))
        {
            return true;
        }
    }
    if value.is_array() && schema.get("properties").is_some() {
        return true;
    }
    if let Value::Object(fields) = value
        && let [(name, Value::Null)] = fields.iter().collect::<Vec<_>>().as_slice()
    {
        let names = schema
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .chain(schema.get("const"));
        if names.into_iter().any(|known| known.as_str() == Some(name)) {
            return true;
        }
    }
    match value {
        Value::Object(fields) => fields.iter().any(|(name, field)| {
            let sub = schema
                .get("properties")
                .and_then(|properties| properties.get(name))
                .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()));
            sub.is_some_and(|sub| lax_at(sub, root, field, 0))
        }),
        Value::Array(items) => items.iter().enumerate().any(|(index, item)| {
            let sub = schema
                .get("prefixItems")
                .and_then(|prefix| prefix.get(index))
                .or_else(|| schema.get("items"));
            sub.is_some_and(|sub| lax_at(sub, root, item, 0))
        }),
        _ => false,
    }
}

// ------------------------------------------- values from the schema

/// How deep values built from a schema go; below it, options are `null`
/// and arrays empty, so recursive types end.
const DEPTH: u32 = 5;

/// Values built from a schema: mostly valid, with numbers at the edges of
/// their ranges.
fn from_schema(schema: &Value, root: &Value, depth: u32) -> BoxedStrategy<Value> {
    let shallow = depth >= DEPTH;
    if let Some(target) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|reference| reference.strip_prefix('#'))
        .and_then(|pointer| root.pointer(pointer))
    {
        return from_schema(target, root, depth + 1);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = schema.get(key) {
            let null = json!({"type": "null"});
            if shallow && branches.contains(&null) {
                return Just(Value::Null).boxed();
            }
            let options: Vec<BoxedStrategy<Value>> = branches
                .iter()
                .map(|branch| from_schema(branch, root, depth + 1))
                .collect();
            return Union::new(options).boxed();
        }
    }
    if let Some(constant) = schema.get("const") {
        return Just(constant.clone()).boxed();
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        return prop::sample::select(allowed.clone()).boxed();
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => vec!["null", "boolean", "integer", "string"],
    };
    if shallow && types.contains(&"null") {
        return Just(Value::Null).boxed();
    }
    let options: Vec<BoxedStrategy<Value>> = types
        .into_iter()
        .map(|kind| of_type(kind, schema, root, depth))
        .collect();
    Union::new(options).boxed()
}

fn of_type(kind: &str, schema: &Value, root: &Value, depth: u32) -> BoxedStrategy<Value> {
    let number = |key: &str| schema.get(key).and_then(Value::as_i64);
    let length = |key: &str| schema.get(key).and_then(Value::as_u64);
    match kind {
        "null" => Just(Value::Null).boxed(),
        "boolean" => any::<bool>().prop_map(Value::from).boxed(),
        "integer" => {
            let (mut low, mut high) = match schema.get("format").and_then(Value::as_str) {
                Some("uint8") => (0, i128::from(u8::MAX)),
                Some("uint16") => (0, i128::from(u16::MAX)),
                Some("uint32") => (0, i128::from(u32::MAX)),
                Some("uint64" | "uint") => (0, i128::from(u64::MAX)),
                Some("int8") => (i128::from(i8::MIN), i128::from(i8::MAX)),
                Some("int16") => (i128::from(i16::MIN), i128::from(i16::MAX)),
                Some("int32") => (i128::from(i32::MIN), i128::from(i32::MAX)),
                _ => (i128::from(i64::MIN), i128::from(i64::MAX)),
            };
            if let Some(min) = number("minimum") {
                low = low.max(i128::from(min));
            }
            if let Some(max) = number("maximum") {
                high = high.min(i128::from(max));
            }
            prop_oneof![
                Just(low),
                Just(high),
                Just(low + 1),
                Just(high - 1),
                Just(0.clamp(low, high)),
                low..=high,
            ]
            .prop_map(integer)
            .boxed()
        }
        "number" => prop_oneof![
            Just(json!(0)),
            Just(json!(-7)),
            Just(json!(u64::MAX)),
            Just(json!(1.5)),
            Just(json!(-0.0)),
            Just(json!(1e300)),
            // Finite only: a JSON number cannot be NaN or infinite.
            (-1e9f64..1e9).prop_map(Value::from),
        ]
        .boxed(),
        "string" => {
            let min = length("minLength").unwrap_or(0);
            let max = length("maxLength").unwrap_or(min + 5).min(min + 5);
            proptest::string::string_regex(&format!("[a-z_é😀 ]{{{min},{max}}}"))
                .map(|strategy| strategy.prop_map(Value::String).boxed())
                .unwrap_or_else(|_| Just(json!("")).boxed())
        }
        "array" => {
            if let Some(Value::Array(prefix)) = schema.get("prefixItems") {
                let items: Vec<BoxedStrategy<Value>> = prefix
                    .iter()
                    .map(|item| from_schema(item, root, depth + 1))
                    .collect();
                return items.prop_map(Value::Array).boxed();
            }
            let min = length("minItems").unwrap_or(0) as usize;
            if depth >= DEPTH && min == 0 {
                return Just(json!([])).boxed();
            }
            let max = min + 3;
            let item = match schema.get("items") {
                Some(item) => from_schema(item, root, depth + 1),
                None => Just(Value::Null).boxed(),
            };
            prop::collection::vec(item, min..=max)
                .prop_map(Value::Array)
                .boxed()
        }
        "object" => {
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = schema
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(name, field)| {
                    let name = name.clone();
                    let value = from_schema(field, root, depth + 1);
                    if required.contains(&name.as_str()) {
                        value.prop_map(move |v| Some((name.clone(), v))).boxed()
                    } else {
                        prop::option::of(value.prop_map(move |v| (name.clone(), v))).boxed()
                    }
                })
                .collect();
            let extra = match schema.get("additionalProperties") {
                Some(each @ Value::Object(_)) => prop::collection::btree_map(
                    "[a-z]{0,3}",
                    from_schema(each, root, depth + 1),
                    0..3,
                )
                .boxed(),
                _ => Just(Default::default()).boxed(),
            };
            (fields, extra)
                .prop_map(|(fields, extra)| {
                    let mut object: Map<String, Value> = extra.into_iter().collect();
                    object.extend(fields.into_iter().flatten());
                    Value::Object(object)
                })
                .boxed()
        }
        _ => Just(Value::Null).boxed(),
    }
}

fn integer(n: i128) -> Value {
    match (i64::try_from(n), u64::try_from(n)) {
        (Ok(n), _) => Value::from(n),
        (_, Ok(n)) => Value::from(n),
        _ => Value::Null,
    }
}

// ---------------------------------------------------------- mutations

/// One change to a value, at the `at`-th node (in pre-order, wrapping).
#[derive(Debug, Clone)]
enum Mutation {
    /// The node becomes another value.
    Replace(Value),
    /// A field (or item) of the node, by index, is removed.
    Remove(usize),
    /// A field is added (or the node becomes an object of it).
    Add(String, Value),
    /// The node is wrapped in an array.
    Wrap,
}

/// Values near the edges of what the types take, of every JSON type.
fn noise() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop::sample::select(vec![
            0i64,
            -1,
            1,
            127,
            128,
            -128,
            -129,
            255,
            256,
            32767,
            32768,
            -32768,
            -32769,
            65535,
            65536,
            i64::from(i32::MAX),
            i64::from(i32::MAX) + 1,
            i64::from(i32::MIN),
            i64::from(i32::MIN) - 1,
            i64::from(u32::MAX),
            i64::from(u32::MAX) + 1,
            i64::MAX,
            i64::MIN,
        ])
        .prop_map(Value::from),
        Just(json!(u64::MAX)),
        prop::sample::select(vec![0.0, 1.0, -1.0, 1.5, 255.0, 3e9, 1e300, -0.0])
            .prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "a",
            "ab",
            "é",
            "😀",
            "red",
            "dark_blue",
            "Red",
            "Dot",
            "Low",
            "High",
            "Medium",
            "Circle",
            "Square",
        ])
        .prop_map(Value::from),
        Just(json!([])),
        Just(json!({})),
        Just(json!(["x"])),
        Just(json!([1, -1])),
        Just(json!({"Dot": null})),
        Just(json!({"Low": null})),
        Just(json!({"Square": 3})),
        Just(json!({"Square": 3, "Dot": null})),
        Just(json!({"Circle": {"r": 1}})),
        Just(json!({"Pair": [1, 2]})),
        Just(json!({"Pair": []})),
        Just(json!({"Boxed": {"tags": []}})),
    ]
}

fn mutation(keys: Vec<String>) -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => noise().prop_map(Mutation::Replace),
        2 => any::<usize>().prop_map(Mutation::Remove),
        2 => (prop::sample::select(keys), noise()).prop_map(|(k, v)| Mutation::Add(k, v)),
        1 => Just(Mutation::Wrap),
    ]
}

/// Applies `mutation` at the `at`-th node of `value` (pre-order, wrapping).
fn mutate(value: &mut Value, at: usize, mutation: &Mutation) {
    let count = nodes(value);
    let mut left = at % count;
    apply(value, &mut left, mutation);
}

fn nodes(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(nodes).sum(),
        Value::Object(fields) => fields.values().map(nodes).sum(),
        _ => 0,
    }
}

fn apply(value: &mut Value, left: &mut usize, mutation: &Mutation) -> bool {
    if *left == 0 {
        match mutation {
            Mutation::Replace(other) => *value = other.clone(),
            Mutation::Remove(index) => match value {
                Value::Object(fields) if !fields.is_empty() => {
                    if let Some(name) = fields.keys().nth(index % fields.len()).cloned() {
                        fields.remove(&name);
                    }
                }
                Value::Array(items) if !items.is_empty() => {
                    items.remove(index % items.len());
                }
                _ => *value = Value::Null,
            },
            Mutation::Add(name, other) => match value {
                Value::Object(fields) => {
                    fields.insert(name.clone(), other.clone());
                }
                _ => *value = json!({ name.clone(): other.clone() }),
            },
            Mutation::Wrap => *value = Value::Array(vec![value.take()]),
        }
        return true;
    }
    *left -= 1;
    match value {
        Value::Array(items) => items.iter_mut().any(|item| apply(item, left, mutation)),
        Value::Object(fields) => fields
            .values_mut()
            .any(|field| apply(field, left, mutation)),
        _ => false,
    }
}

// ---------------------------------------------------------- random JSON

/// The property names a schema mentions, and a few it does not: what
/// random objects are made of, so that some of them come close.
fn keys(schema: &Value) -> Vec<String> {
    fn walk(schema: &Value, keys: &mut Vec<String>) {
        match schema {
            Value::Object(keywords) => {
                if let Some(Value::Object(properties)) = keywords.get("properties") {
                    keys.extend(properties.keys().cloned());
                }
                keywords.values().for_each(|sub| walk(sub, keys));
            }
            Value::Array(items) => items.iter().for_each(|sub| walk(sub, keys)),
            _ => {}
        }
    }
    let mut keys = vec!["zz".to_owned(), "Dot".to_owned(), "Low".to_owned()];
    walk(schema, &mut keys);
    keys.sort();
    keys.dedup();
    keys
}

fn random_json(keys: Vec<String>) -> impl Strategy<Value = Value> {
    noise().prop_recursive(4, 24, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(prop::sample::select(keys.clone()), inner, 0..5)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Values for `T`: built from its schema, those mutated (once or twice),
/// and random JSON made of its field names.
fn values_for<T: JsonSchema>() -> BoxedStrategy<Value> {
    let schema = input_schema_for::<T>();
    let keys = keys(&schema);
    let built = from_schema(&schema, &schema, 0);
    let mutated = (
        built.clone(),
        prop::collection::vec((any::<usize>(), mutation(keys.clone())), 1..3),
    )
        .prop_map(|(mut value, mutations)| {
            for (at, mutation) in &mutations {
                mutate(&mut value, *at, mutation);
            }
            value
        });
    prop_oneof![
        2 => built,
        3 => mutated,
        1 => random_json(keys),
    ]
    .boxed()
}

// -------------------------------------------------- values of the type

fn finite() -> impl Strategy<Value = f64> {
    // A NaN or an infinity has no JSON form (serde_json writes `null`,
    // which is then no `f64`): the one place the type and JSON cannot
    // agree, so Rust values here have finite floats.
    prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL | prop::num::f64::ZERO
}

fn inner() -> impl Strategy<Value = Inner> {
    (
        any::<Option<u8>>(),
        prop::collection::vec(".{0,3}", 0..3),
        any::<bool>(),
    )
        .prop_map(|(small, tags, on)| Inner { small, tags, on })
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        Just(Shape::Dot),
        finite().prop_map(|r| Shape::Circle { r }),
        any::<u32>().prop_map(Shape::Square),
        any::<(u8, i8)>().prop_map(|(a, b)| Shape::Pair(a, b)),
        inner().prop_map(Shape::Boxed),
    ]
}

fn everything() -> impl Strategy<Value = Everything> {
    let numbers = (
        any::<u8>(),
        any::<u16>(),
        any::<i32>(),
        any::<u64>(),
        finite(),
        any::<bool>(),
        any::<u32>(),
        any::<i64>(),
    );
    let rest = (
        ".{0,5}",
        any::<char>(),
        prop::option::of(".{0,5}"),
        inner(),
        prop::collection::vec(inner(), 0..3),
        prop_oneof![Just(Color::Red), Just(Color::DarkBlue)],
        shape(),
        prop::collection::hash_map(".{0,3}", any::<u16>(), 0..3),
        prop::option::of(shape()),
        prop_oneof![Just(Level::Low), Just(Level::High), Just(Level::Medium)],
    );
    (numbers, rest).prop_map(
        |(
            (small, medium, signed, big, ratio, flag, count, renamed),
            (name, initial, maybe, inner, inners, color, shape, scores, maybe_shape, level),
        )| Everything {
            small,
            medium,
            signed,
            big,
            ratio,
            flag,
            name,
            initial,
            maybe,
            inner,
            inners,
            color,
            shape,
            count,
            scores,
            renamed,
            maybe_shape,
            level,
        },
    )
}

fn list() -> impl Strategy<Value = List> {
    let leaf = any::<i16>().prop_map(|value| List { value, next: None });
    leaf.prop_recursive(4, 8, 1, |inner| {
        (any::<i16>(), inner).prop_map(|(value, next)| List {
            value,
            next: Some(Box::new(next)),
        })
    })
}

fn tree() -> impl Strategy<Value = Tree> {
    let leaf = ".{0,3}".prop_map(|label| Node {
        label,
        children: Vec::new(),
    });
    let node = leaf.prop_recursive(3, 12, 3, |inner| {
        (".{0,3}", prop::collection::vec(inner, 0..3))
            .prop_map(|(label, children)| Node { label, children })
    });
    (node, any::<isize>()).prop_map(|(root, width)| Tree { root, width })
}

/// What serde writes for a value of `T` is taken by the schema, and read
/// back; the same value mutated is judged alike by both.
fn round_trip<T: Serialize + DeserializeOwned + JsonSchema>(
    typed: &T,
    mutations: &[(usize, Mutation)],
) -> Result<(), TestCaseError> {
    let mut value = serde_json::to_value(typed).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let schema = input_schema_for::<T>();
    prop_assert_eq!(Schema::new(&schema).validate(&value), Ok(()), "{}", value);
    agree::<T>(&value)?;
    for (at, mutation) in mutations {
        mutate(&mut value, *at, mutation);
        agree::<T>(&value)?;
    }
    Ok(())
}

fn some_mutations() -> impl Strategy<Value = Vec<(usize, Mutation)>> {
    let names: Vec<String> = [
        "small",
        "ratio",
        "initial",
        "inner",
        "tags",
        "shape",
        "count",
        "renamed",
        "renamedField",
        "level",
        "next",
        "value",
        "root",
        "children",
        "zz",
    ]
    .map(str::to_owned)
    .to_vec();
    prop::collection::vec((any::<usize>(), mutation(names)), 0..3)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // 512 by default; PROPTEST_CASES raises it for a long run.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(512),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/typed_args.txt",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn everything_schema_accepts_what_serde_reads(value in values_for::<Everything>()) {
        agree::<Everything>(&value)?;
    }

    #[test]
    fn inner_schema_accepts_what_serde_reads(value in values_for::<Inner>()) {
        agree::<Inner>(&value)?;
    }

    #[test]
    fn shape_schema_accepts_what_serde_reads(value in values_for::<Shape>()) {
        agree::<Shape>(&value)?;
    }

    #[test]
    fn option_of_an_enum_schema_accepts_what_serde_reads(value in values_for::<Option<Level>>()) {
        agree::<Option<Level>>(&value)?;
    }

    #[test]
    fn defaults_schema_accepts_what_serde_reads(value in values_for::<Defaults>()) {
        agree::<Defaults>(&value)?;
    }

    #[test]
    fn recursive_schemas_accept_what_serde_reads(
        list in values_for::<List>(),
        tree in values_for::<Tree>(),
    ) {
        agree::<List>(&list)?;
        agree::<Tree>(&tree)?;
    }

    #[test]
    fn maps_of_bounded_integers_accept_what_serde_reads(
        value in values_for::<HashMap<String, i8>>(),
    ) {
        agree::<HashMap<String, i8>>(&value)?;
    }

    #[test]
    fn what_serde_writes_is_accepted_and_mutations_are_judged_alike(
        everything in everything(),
        list in list(),
        tree in tree(),
        mutations in some_mutations(),
    ) {
        round_trip(&everything, &mutations)?;
        round_trip(&list, &mutations)?;
        round_trip(&tree, &mutations)?;
        round_trip(&Defaults::default(), &mutations)?;
    }
}

/// The generated schemas have the shapes the properties above rely on.
#[test]
fn generated_schemas_are_clean_and_keep_field_descriptions() {
    /// The arguments of `greet`.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Greet {
        /// Who to greet.
        name: String,
        /// How often, 1 to 3.
        #[schemars(range(min = 1, max = 3))]
        times: Option<u8>,
    }
    let schema = input_schema_for::<Greet>();
    assert_eq!(
        schema,
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "Who to greet."},
                "times": {
                    "type": ["integer", "null"],
                    "format": "uint8",
                    "description": "How often, 1 to 3.",
                    "minimum": 1,
                    "maximum": 3
                }
            },
            "required": ["name"],
            "additionalProperties": false
        })
    );
    let everything = input_schema_for::<Everything>();
    for key in ["$schema", "title", "$defs"] {
        assert!(everything.get(key).is_none(), "{key} in {everything}");
    }
    // Recursion keeps a reference: to the top, or into `$defs`.
    let list = input_schema_for::<List>();
    assert_eq!(list["properties"]["next"]["anyOf"][0]["$ref"], "#");
    let tree = input_schema_for::<Tree>();
    assert!(tree["$defs"]["Node"].is_object(), "{tree}");
    assert_eq!(
        tree["properties"]["root"]["properties"]["children"]["items"]["$ref"],
        "#/$defs/Node"
    );
}

// -------------------------------------------------- a typed tool in a run

/// `add {"numbers": [...], "label"?}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct AddArgs {
    /// The numbers to add.
    #[schemars(length(min = 1))]
    numbers: Vec<i32>,
    /// What to call the sum.
    label: Option<String>,
}

#[derive(Clone, Default)]
struct Add {
    runs: Arc<AtomicUsize>,
}

impl TypedTool for Add {
    type Args = AddArgs;

    fn name(&self) -> &str {
        "add"
    }

    fn description(&self) -> &str {
        "Add whole numbers."
    }

    fn capability(&self) -> Capability {
        Capability::Executes
    }

    fn action(&self, args: &AddArgs) -> Option<String> {
        Some(format!("add {} numbers", args.numbers.len()))
    }

    fn run(&self, args: AddArgs, _context: &ToolContext<'_>) -> ToolOutput {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let sum: i64 = args.numbers.iter().map(|&n| i64::from(n)).sum();
        ToolOutput::ok(format!("{}{sum}", args.label.unwrap_or_default()))
    }
}

/// Allows every call, keeping the actions it was shown.
#[derive(Default)]
struct Shown(std::sync::Mutex<Vec<String>>);

impl Approver for Shown {
    fn decide(&self, request: &ApprovalRequest<'_>) -> Decision {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(request.action.to_owned());
        Decision::Allow
    }
}

#[test]
fn a_typed_tool_runs_with_its_arguments_read_and_bad_ones_refused() {
    let add = Add::default();
    let shown = Arc::new(Shown::default());
    let mut model = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls([
            ("c1", "add", json!({"numbers": [1, 2, 3]})),
            ("c2", "add", json!({"numbers": [1, 2], "label": "sum: "})),
            ("c3", "add", json!({"numbers": [1, 2.0]})),
            ("c4", "add", json!({"numbers": []})),
            ("c5", "add", json!({"numbers": [3_000_000_000u64]})),
            ("c6", "add", json!({"numbers": [1], "extra": true})),
        ])),
        Ok(ModelResponse::answer("done")),
    ]);
    let report = AgentBuilder::new(shown.clone())
        .tool(add.clone())
        .unwrap()
        .build()
        .run_driven("add", Budget::new(3).unwrap(), &mut model)
        .unwrap();
    let results = tool_results(&report.outcome.messages);
    let expected = [
        ("c1", "6", false),
        ("c2", "sum: 3", false),
        (
            "c3",
            "not executed: invalid input for add: input.numbers[1]: expected integer, got number",
            true,
        ),
        (
            "c4",
            "not executed: invalid input for add: input.numbers: must have at least 1 item (got 0)",
            true,
        ),
        (
            "c5",
            "not executed: invalid input for add: input.numbers[0]: must be at most 2147483647 (got 3000000000)",
            true,
        ),
        (
            "c6",
            "not executed: invalid input for add: input.extra: unexpected field",
            true,
        ),
    ];
    let expected: Vec<(String, String, bool)> = expected
        .iter()
        .map(|(id, text, e)| ((*id).to_owned(), (*text).to_owned(), *e))
        .collect();
    assert_eq!(results, expected);
    assert_eq!(add.runs.load(Ordering::SeqCst), 2);
    // The approver saw the typed action of the two calls that passed the schema.
    let shown = shown.0.lock().unwrap().clone();
    assert_eq!(shown, ["add 3 numbers", "add 2 numbers"]);
    // The model was offered the generated schema.
    let offered = &model.requests()[0].tools[0];
    assert_eq!(offered.input_schema, input_schema_for::<AddArgs>());
    assert_eq!(
        offered.input_schema["properties"]["numbers"]["description"],
        "The numbers to add."
    );
}

/// Called past the registry (a host calling `Tool::run` itself), a typed
/// tool refuses arguments it cannot read with serde's message; it does not
/// panic, and does not run.
#[test]
fn arguments_that_do_not_deserialize_are_refused_not_panicked_on() {
    let add = Add::default();
    let agent = AgentId::Parent;
    for (input, message) in [
        (
            json!({"numbers": "1"}),
            "not executed: invalid input for add: invalid type: string \"1\", expected a sequence",
        ),
        (
            json!({}),
            "not executed: invalid input for add: missing field `numbers`",
        ),
        (
            json!([1]),
            "not executed: invalid input for add: invalid type: integer `1`, expected a sequence",
        ),
    ] {
        let call = ToolCall::new("c1", "add", input.clone());
        let span = tracing::Span::none();
        let context = ToolContext::new(&agent, &call, &span);
        let output = Tool::run(&add, &input, &context);
        assert!(output.is_error, "{input}");
        assert_eq!(output.content.as_str(), message, "{input}");
        // The default action (the name and the JSON) when the arguments do not read.
        assert_eq!(Tool::action(&add, &input), format!("add {input}"));
    }
    assert_eq!(add.runs.load(Ordering::SeqCst), 0);
}

crate::async_twins!(a_typed_tool_runs_with_its_arguments_read_and_bad_ones_refused);
