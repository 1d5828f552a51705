//! The schema subset validator, the registry, and dispatch through an agent:
//! unknown names and bad arguments are refused before anything runs.

use crate::common;
use crate::common::RunDriven;

use common::tool_results;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{RecordingModel, TempDir};
use serde_json::{Value, json};
use subloop::AgentBuilder;
use subloop::Budget;
use subloop::ModelResponse;
use subloop::StatusKind;
use subloop::core::call::CallDecision;
use subloop::core::conversation::ToolOutput;
use subloop::core::error::SetupError;
use subloop::policy::permission::AllowAll;
use subloop::tools::schema::{Schema, SchemaError};
use subloop::tools::{
    Capability, ReadFile, ReadOnlyRegistry, ReadOnlyTool, Registry, RunMain, RunSettings, Tool,
    ToolContext,
};

// ---------------------------------------------------------------- validator

/// `value` checked against `schema`.
fn validate(schema: &Value, value: &Value) -> Result<(), SchemaError> {
    Schema::new(schema).validate(value)
}

fn err(schema: &Value, value: Value) -> SchemaError {
    validate(schema, &value).expect_err(&format!("{value} should be refused"))
}

fn plan_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "minLength": 1},
                        "text": {"type": "string", "minLength": 2, "maxLength": 4},
                        "status": {"type": "string", "enum": ["pending", "done"]}
                    },
                    "required": ["id", "status"],
                    "additionalProperties": false
                }
            },
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "flag": {"type": "boolean"},
            "maybe": {"type": ["string", "null"]}
        },
        "required": ["items"],
        "additionalProperties": false
    })
}

#[test]
fn valid_values_pass() {
    let schema = plan_schema();
    validate(
        &schema,
        &json!({"items": [{"id": "a", "status": "pending", "text": "ab"}]}),
    )
    .unwrap();
    validate(
        &schema,
        &json!({
            "items": [{"id": "a", "status": "done"}, {"id": "b", "status": "pending", "text": "abcd"}],
            "count": 3, "ratio": 0.5, "flag": true, "maybe": null
        }),
    )
    .unwrap();
    validate(
        &schema,
        &json!({"items": [{"id": "a", "status": "done"}], "maybe": "x", "ratio": 2}),
    )
    .unwrap();
    // An empty schema accepts anything.
    validate(&json!({}), &json!([1, "two", null])).unwrap();
}

#[test]
fn type_mismatches_name_the_field() {
    let schema = plan_schema();
    let e = err(&schema, json!([]));
    assert_eq!(e.path, "input");
    assert_eq!(e.message, "expected object, got array");

    let e = err(&schema, json!({"items": "no"}));
    assert_eq!(e.path, "input.items");
    assert_eq!(e.message, "expected array, got string");

    let e = err(
        &schema,
        json!({"items": [{"id": "a", "status": "done"}], "count": 1.5}),
    );
    assert_eq!(e.path, "input.count");
    assert_eq!(e.message, "expected integer, got number");

    let e = err(
        &schema,
        json!({"items": [{"id": "a", "status": "done"}], "ratio": "1"}),
    );
    assert_eq!(e.path, "input.ratio");

    let e = err(
        &schema,
        json!({"items": [{"id": "a", "status": "done"}], "flag": 1}),
    );
    assert_eq!(e.path, "input.flag");
    assert_eq!(e.message, "expected boolean, got integer");

    let e = err(
        &schema,
        json!({"items": [{"id": "a", "status": "done"}], "maybe": 7}),
    );
    assert_eq!(e.path, "input.maybe");
    assert!(e.message.contains("integer"), "{e}");

    let e = err(&schema, json!({"items": [{"id": 5, "status": "done"}]}));
    assert_eq!(e.path, "input.items[0].id");
    assert_eq!(
        e.to_string(),
        "input.items[0].id: expected string, got integer"
    );
}

#[test]
fn required_fields_are_checked() {
    let schema = plan_schema();
    let e = err(&schema, json!({}));
    assert_eq!(e.path, "input.items");
    assert_eq!(e.message, "required field is missing");
    let e = err(
        &schema,
        json!({"items": [{"id": "a", "status": "done"}, {"id": "b"}]}),
    );
    assert_eq!(e.path, "input.items[1].status");
    assert_eq!(e.message, "required field is missing");
}

#[test]
fn additional_properties_false_refuses_extra_fields() {
    let schema = plan_schema();
    let e = err(
        &schema,
        json!({"items": [{"id": "a", "status": "done"}], "extra": 1}),
    );
    assert_eq!(e.path, "input.extra");
    assert_eq!(e.message, "unexpected field");
    let e = err(
        &schema,
        json!({"items": [{"id": "a", "status": "done", "owner": "me"}]}),
    );
    assert_eq!(e.path, "input.items[0].owner");
    // Without `additionalProperties: false`, extra fields are fine.
    validate(
        &json!({"type": "object", "properties": {"a": {"type": "string"}}}),
        &json!({"a": "x", "b": 2}),
    )
    .unwrap();
}

#[test]
fn enums_are_checked() {
    let schema = plan_schema();
    let e = err(
        &schema,
        json!({"items": [{"id": "a", "status": "done"}, {"id": "b", "status": "started"}]}),
    );
    assert_eq!(e.path, "input.items[1].status");
    assert_eq!(e.message, r#"must be one of "pending", "done""#);
    // Enum values are compared as JSON: 1 is not "1".
    let e = err(&json!({"enum": [1, 2]}), json!("1"));
    assert_eq!(e.path, "input");
    validate(&json!({"enum": [1, 2]}), &json!(2)).unwrap();
}

#[test]
fn string_lengths_count_characters() {
    let schema = plan_schema();
    let item = |text: &str| json!({"items": [{"id": "a", "status": "done", "text": text}]});
    // 4 characters of 2 to 4 bytes each: 4 chars, more than 4 bytes.
    validate(&schema, &item("\u{e9}\u{e9}\u{1F600}\u{1F600}")).unwrap();
    let e = err(&schema, item("\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}"));
    assert_eq!(e.path, "input.items[0].text");
    assert_eq!(e.message, "must have at most 4 characters (got 5)");
    let e = err(&schema, item("\u{1F600}"));
    assert_eq!(e.message, "must have at least 2 characters (got 1)");
    let e = err(&schema, json!({"items": [{"id": "", "status": "done"}]}));
    assert_eq!(e.path, "input.items[0].id");
    assert_eq!(e.message, "must have at least 1 character (got 0)");
}

#[test]
fn array_lengths_and_items_are_checked() {
    let schema = plan_schema();
    let e = err(&schema, json!({"items": []}));
    assert_eq!(e.path, "input.items");
    assert_eq!(e.message, "must have at least 1 item (got 0)");
    let four: Vec<Value> = (0..4)
        .map(|i| json!({"id": i.to_string(), "status": "done"}))
        .collect();
    let e = err(&schema, json!({ "items": four }));
    assert_eq!(e.path, "input.items");
    assert_eq!(e.message, "must have at most 3 items (got 4)");
    let e = err(
        &schema,
        json!({"items": [{"id": "a", "status": "done"}, 7]}),
    );
    assert_eq!(e.path, "input.items[1]");
    assert_eq!(e.message, "expected object, got integer");
}

/// `integer` is a number written without a fraction: serde_json refuses
/// `3.0` for an integer field, so the validator does too (it once took
/// whole floats, as JSON Schema does).
#[test]
fn integer_refuses_every_float_as_serde_does() {
    let schema = json!({"type": "integer"});
    validate(&schema, &json!(3)).unwrap();
    validate(&schema, &json!(-3)).unwrap();
    validate(&schema, &json!(u64::MAX)).unwrap();
    let e = err(&schema, json!(3.0));
    assert_eq!(e.to_string(), "input: expected integer, got number");
    assert_eq!(err(&schema, json!(3.5)).path, "input");
    assert_eq!(err(&schema, json!("3")).path, "input");
    assert!(serde_json::from_value::<u8>(json!(3.0)).is_err());
    // `number` takes both.
    validate(&json!({"type": "number"}), &json!(3)).unwrap();
    validate(&json!({"type": "number"}), &json!(3.5)).unwrap();
}

#[test]
fn numbers_are_bounded_by_minimum_maximum_and_integer_formats() {
    let schema = json!({"type": "integer", "format": "uint8", "minimum": 0, "maximum": 255});
    validate(&schema, &json!(0)).unwrap();
    validate(&schema, &json!(255)).unwrap();
    assert_eq!(
        err(&schema, json!(256)).to_string(),
        "input: must be at most 255 (got 256)"
    );
    assert_eq!(
        err(&schema, json!(-1)).to_string(),
        "input: must be at least 0 (got -1)"
    );
    // schemars gives `u32` only `minimum: 0`: the format is the upper bound.
    let schema = json!({"type": "integer", "format": "uint32", "minimum": 0});
    validate(&schema, &json!(u32::MAX)).unwrap();
    assert_eq!(
        err(&schema, json!(u64::from(u32::MAX) + 1)).message,
        "must be at most 4294967295 (got 4294967296)"
    );
    // And `i32` no bound at all.
    let schema = json!({"type": "integer", "format": "int32"});
    validate(&schema, &json!(i32::MIN)).unwrap();
    assert_eq!(
        err(&schema, json!(i64::from(i32::MIN) - 1)).message,
        "must be at least -2147483648 (got -2147483649)"
    );
    let schema = json!({"type": "integer", "format": "int64"});
    validate(&schema, &json!(i64::MIN)).unwrap();
    assert_eq!(
        err(&schema, json!(u64::MAX)).message,
        "must be at most 9223372036854775807 (got 18446744073709551615)"
    );
    let schema = json!({"type": "integer", "format": "uint64", "minimum": 0});
    validate(&schema, &json!(u64::MAX)).unwrap();
    // Float bounds, exclusive bounds, and an unknown format (ignored).
    let schema =
        json!({"type": "number", "format": "double", "minimum": 0.5, "exclusiveMaximum": 2});
    validate(&schema, &json!(0.5)).unwrap();
    validate(&schema, &json!(1)).unwrap();
    assert_eq!(
        err(&schema, json!(0.25)).message,
        "must be at least 0.5 (got 0.25)"
    );
    assert_eq!(
        err(&schema, json!(2)).message,
        "must be less than 2 (got 2)"
    );
}

#[test]
fn const_and_boolean_schemas() {
    let e = err(&json!({"const": "pending"}), json!("done"));
    assert_eq!(e.to_string(), r#"input: must be "pending""#);
    validate(&json!({"const": 1}), &json!(1)).unwrap();
    validate(&json!(true), &json!([1])).unwrap();
    let e = err(&json!({"items": false}), json!([1]));
    assert_eq!(e.to_string(), "input[0]: no value is allowed here");
    validate(&json!({"items": false}), &json!([])).unwrap();
}

#[test]
fn additional_properties_may_be_a_schema_for_maps() {
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "additionalProperties": {"type": "integer", "format": "uint8", "minimum": 0, "maximum": 255}
    });
    validate(&schema, &json!({"name": "n", "a": 1, "b": 255})).unwrap();
    let e = err(&schema, json!({"name": "n", "a": 1, "b": 256}));
    assert_eq!(e.to_string(), "input.b: must be at most 255 (got 256)");
    let e = err(&schema, json!({"name": 5}));
    assert_eq!(e.to_string(), "input.name: expected string, got integer");
}

#[test]
fn prefix_items_check_tuples_by_position() {
    let schema = json!({
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2
    });
    validate(&schema, &json!([1, "a"])).unwrap();
    assert_eq!(
        err(&schema, json!(["a", 1])).to_string(),
        "input[0]: expected integer, got string"
    );
    assert_eq!(
        err(&schema, json!([1])).to_string(),
        "input: must have at least 2 items (got 1)"
    );
}

/// What schemars makes of an `Option<Enum>` field and of an externally
/// tagged enum with data.
fn enum_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "status": {
                "anyOf": [
                    {"oneOf": [
                        {"type": "string", "enum": ["pending", "done"]},
                        {"type": "string", "const": "blocked", "description": "Waiting."}
                    ]},
                    {"type": "null"}
                ]
            },
            "shape": {"$ref": "#/$defs/Shape"}
        },
        "$defs": {
            "Shape": {
                "oneOf": [
                    {"type": "string", "enum": ["Dot"]},
                    {
                        "type": "object",
                        "properties": {"Circle": {"type": "object", "properties": {"r": {"type": "number"}}, "required": ["r"]}},
                        "required": ["Circle"],
                        "additionalProperties": false
                    },
                    {
                        "type": "object",
                        "properties": {"Square": {"type": "integer", "format": "uint32", "minimum": 0}},
                        "required": ["Square"],
                        "additionalProperties": false
                    }
                ]
            }
        }
    })
}

#[test]
fn any_of_one_of_and_refs_name_the_closest_branch() {
    let schema = enum_schema();
    for good in [
        json!({}),
        json!({"status": null, "shape": "Dot"}),
        json!({"status": "blocked", "shape": {"Circle": {"r": 1.5}}}),
        json!({"status": "done", "shape": {"Square": 3}}),
    ] {
        validate(&schema, &good).unwrap();
    }
    // A value none of the branches takes: what they take, listed.
    assert_eq!(
        err(&schema, json!({"status": "started"})).to_string(),
        r#"input.status: must be one of "pending", "done", "blocked", null"#
    );
    assert_eq!(
        err(&schema, json!({"shape": "Triangle"})).to_string(),
        r#"input.shape: must be one of "Dot", {"Circle": …}, {"Square": …}"#
    );
    assert_eq!(
        err(&schema, json!({"shape": {"Triangle": 3}})).to_string(),
        r#"input.shape: must be one of "Dot", {"Circle": …}, {"Square": …}"#
    );
    // A value shaped like one branch: that branch's error.
    assert_eq!(
        err(&schema, json!({"shape": {"Circle": {"r": "big"}}})).to_string(),
        "input.shape.Circle.r: expected number, got string"
    );
    assert_eq!(
        err(&schema, json!({"shape": {"Square": -1}})).to_string(),
        "input.shape.Square: must be at least 0 (got -1)"
    );
    // oneOf: exactly one.
    let both = json!({"oneOf": [{"type": "integer"}, {"type": "number"}]});
    validate(&both, &json!(1.5)).unwrap();
    assert_eq!(
        err(&both, json!(1)).to_string(),
        "input: matches 2 of the 2 allowed forms; it must match exactly one"
    );
    // allOf: each.
    let all = json!({"allOf": [{"type": "string"}, {"minLength": 2}]});
    validate(&all, &json!("ab")).unwrap();
    assert_eq!(
        err(&all, json!("a")).message,
        "must have at least 2 characters (got 1)"
    );
}

#[test]
fn refs_follow_recursive_types_and_stop_on_loops() {
    // What schemars makes of `struct List { value: u8, next: Option<Box<List>> }`.
    let list = json!({
        "type": "object",
        "properties": {
            "value": {"type": "integer", "format": "uint8", "minimum": 0, "maximum": 255},
            "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}
        },
        "required": ["value"]
    });
    validate(
        &list,
        &json!({"value": 1, "next": {"value": 2, "next": null}}),
    )
    .unwrap();
    assert_eq!(
        err(
            &list,
            json!({"value": 1, "next": {"value": 2, "next": {"value": 300}}})
        )
        .to_string(),
        "input.next.next.value: must be at most 255 (got 300)"
    );
    // A reference to a place that is not there checks nothing.
    validate(&json!({"$ref": "#/$defs/Missing"}), &json!(5)).unwrap();
    validate(&json!({"$ref": "https://example.com/schema"}), &json!(5)).unwrap();
    // A schema that refers to itself without looking into the value is
    // refused, not followed for ever.
    // Nor is one whose error would list more forms than anyone can read.
    let wide: Vec<Value> = (0..40).map(|n| json!({"const": n})).collect();
    let nested = json!({"anyOf": [{"anyOf": wide.clone()}, {"anyOf": wide}]});
    let e = err(&nested, json!("x"));
    assert!(e.message.ends_with(", 23, …"), "{e}");
    for looping in [
        json!({"$ref": "#"}),
        json!({"anyOf": [{"$ref": "#"}, {"$ref": "#"}]}),
        json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
    ] {
        let e = err(&looping, json!(1));
        assert!(
            e.message.contains("loop") || e.message.contains("too complex"),
            "{looping}: {e}"
        );
    }
}

#[test]
fn the_builtin_schemas_refuse_bad_arguments() {
    let tmp = TempDir::new("schema-builtin");
    let read = ReadFile::new(tmp.path(), ReadFile::DEFAULT_LIMIT).unwrap();
    let schema = read.input_schema();
    validate(&schema, &json!({"path": "a.txt"})).unwrap();
    assert_eq!(err(&schema, json!({})).path, "input.path");
    assert_eq!(err(&schema, json!({"path": ""})).path, "input.path");
    assert_eq!(err(&schema, json!({"path": 1})).path, "input.path");
    assert_eq!(
        err(&schema, json!({"path": "a", "mode": "r"})).path,
        "input.mode"
    );
    assert_eq!(err(&schema, json!("a.txt")).path, "input");

    let planning = AgentBuilder::new(Arc::new(AllowAll)).plan().unwrap();
    let schema = planning
        .registry()
        .get("todo_write")
        .expect("plan() registers todo_write")
        .input_schema();
    let e = err(
        &schema,
        json!({"items": [{"id": "1", "text": "t", "status": "pending"}, {"id": "2", "text": "t", "status": "blocked"}]}),
    );
    assert_eq!(e.path, "input.items[1].status");

    let run = RunMain::new(tmp.path(), RunSettings::default()).unwrap();
    let schema = run.input_schema();
    validate(&schema, &json!({})).unwrap();
    assert_eq!(err(&schema, json!({"cmd": "rm -rf /"})).path, "input.cmd");
}

// ---------------------------------------------------------------- registry

/// A tool that counts its runs.
#[derive(Clone)]
struct Counting {
    name: &'static str,
    capability: Capability,
    schema: Value,
    runs: Arc<AtomicUsize>,
}

impl Counting {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            capability: Capability::ReadOnly,
            schema: json!({
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": false
            }),
            runs: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Tool for Counting {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        "counts its runs"
    }

    fn input_schema(&self) -> Value {
        self.schema.clone()
    }

    fn capability(&self) -> Capability {
        self.capability
    }

    fn run(&self, input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        self.runs.fetch_add(1, Ordering::SeqCst);
        ToolOutput::ok(format!("{} ran with {input}", self.name))
    }
}

impl ReadOnlyTool for Counting {}

#[test]
fn duplicate_names_are_refused() {
    let mut registry = Registry::new();
    registry.register(Counting::new("count")).unwrap();
    assert_eq!(
        registry.register(Counting::new("count")),
        Err(SetupError::DuplicateTool("count".to_owned()))
    );
    assert_eq!(
        registry.register_read_only(Counting::new("count")),
        Err(SetupError::DuplicateTool("count".to_owned()))
    );
    assert_eq!(registry.names(), ["count"]);
    assert_eq!(registry.definitions().len(), 1);

    let builder = AgentBuilder::new(Arc::new(AllowAll)).plan().unwrap();
    assert_eq!(
        builder.tool(Counting::new("todo_write")).err(),
        Some(SetupError::DuplicateTool("todo_write".to_owned()))
    );
}

#[test]
fn definitions_and_dispatch_come_from_the_same_list() {
    let tmp = TempDir::new("registry-same");
    let mut registry = Registry::new();
    registry
        .register_read_only(ReadFile::new(tmp.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap();
    registry.register(Counting::new("count")).unwrap();
    registry
        .register(RunMain::new(tmp.path(), RunSettings::default()).unwrap())
        .unwrap();
    assert_eq!(registry.names(), ["read_file", "count", "run_main"]);
    for def in registry.definitions() {
        let tool = registry
            .get(&def.name)
            .expect("every definition dispatches");
        assert_eq!(tool.name(), def.name);
        assert_eq!(tool.description(), def.description);
        assert_eq!(tool.input_schema(), def.input_schema);
    }
    assert!(registry.get("todo_write").is_none());
    assert!(registry.get("READ_FILE").is_none());
    assert!(registry.get("").is_none());
}

#[test]
fn read_only_subset_refuses_unknown_and_non_read_only_tools() {
    let tmp = TempDir::new("registry-subset");
    let mut registry = Registry::new();
    registry
        .register_read_only(ReadFile::new(tmp.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap();
    registry
        .register(RunMain::new(tmp.path(), RunSettings::default()).unwrap())
        .unwrap();
    // Plans, as the real todo_write does.
    let mut todo = Counting::new("todo_write");
    todo.capability = Capability::Plans;
    registry.register(todo).unwrap();
    // Read-only by capability, but registered as a general tool.
    registry.register(Counting::new("general")).unwrap();
    // Registered as read-only, but its capability says otherwise.
    let mut planner = Counting::new("sneaky");
    planner.capability = Capability::Plans;
    registry.register_read_only(planner.clone()).unwrap();

    let child = registry.read_only_subset(&["read_file"]).unwrap();
    assert_eq!(child.registry().names(), ["read_file"]);
    assert!(child.registry().get("run_main").is_none());
    assert_eq!(
        registry.read_only_subset(&[]).unwrap().registry().names(),
        Vec::<&str>::new()
    );

    assert_eq!(
        registry.read_only_subset(&["read_file", "grep"]).err(),
        Some(SetupError::UnknownTool("grep".to_owned()))
    );
    for name in ["run_main", "todo_write", "general", "sneaky"] {
        assert_eq!(
            registry.read_only_subset(&["read_file", name]).err(),
            Some(SetupError::NotReadOnly(name.to_owned())),
            "{name}"
        );
    }
    assert_eq!(
        ReadOnlyRegistry::new().with(planner).err(),
        Some(SetupError::NotReadOnly("sneaky".to_owned()))
    );
    let direct = ReadOnlyRegistry::new()
        .with(Counting::new("a"))
        .unwrap()
        .with(Counting::new("b"))
        .unwrap();
    assert_eq!(direct.registry().names(), ["a", "b"]);
    assert_eq!(
        direct.with(Counting::new("a")).err(),
        Some(SetupError::DuplicateTool("a".to_owned()))
    );
}

// ---------------------------------------------------------------- end to end

#[test]
fn an_unregistered_name_is_refused_and_nothing_runs() {
    let tmp = TempDir::new("registry-unregistered");
    tmp.write("main.py", "open('marker', 'w').write('ran')\n");
    let count = Counting::new("count");
    let mut model = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls([
            ("c1", "run_main", json!({})),
            ("c2", "Count", json!({"n": 1})),
            ("c3", "count", json!({"n": 1})),
        ])),
        Ok(ModelResponse::answer("done")),
    ]);
    let report = AgentBuilder::new(Arc::new(AllowAll))
        .tool(count.clone())
        .unwrap()
        .build()
        .run_driven("go", Budget::new(3).unwrap(), &mut model)
        .unwrap();

    assert_eq!(report.outcome.status, StatusKind::Answered);
    let results = tool_results(&report.outcome.messages);
    assert_eq!(
        results,
        vec![
            (
                "c1".into(),
                "not executed: unregistered tool run_main".into(),
                true
            ),
            (
                "c2".into(),
                "not executed: unregistered tool Count".into(),
                true
            ),
            ("c3".into(), "count ran with {\"n\":1}".into(), false),
        ]
    );
    assert_eq!(count.runs(), 1);
    let decisions: Vec<CallDecision> = report.tools.iter().map(|t| t.decision).collect();
    assert_eq!(
        decisions,
        [
            CallDecision::Unregistered,
            CallDecision::Unregistered,
            CallDecision::NotRequired
        ]
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(!tmp.path().join("marker").exists());
    // The model was offered exactly the registry.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let offered: Vec<&str> = requests[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(offered, ["count"]);
}

#[test]
fn invalid_arguments_are_refused_and_the_tool_does_not_run() {
    let tmp = TempDir::new("registry-invalid");
    tmp.write("a.txt", "alpha\n");
    let count = Counting::new("count");
    let mut model = RecordingModel::new(vec![
        Ok(ModelResponse::tool_calls([
            ("c1", "read_file", json!({"path": 5})),
            ("c2", "read_file", json!({})),
            ("c3", "read_file", json!({"path": "a.txt", "follow": true})),
            ("c4", "count", json!({"n": "1"})),
            ("c5", "count", json!("n")),
            ("c6", "read_file", json!({"path": "a.txt"})),
        ])),
        Ok(ModelResponse::answer("done")),
    ]);
    let report = AgentBuilder::new(Arc::new(AllowAll))
        .read_only_tool(ReadFile::new(tmp.path(), ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .tool(count.clone())
        .unwrap()
        .build()
        .run_driven("go", Budget::new(3).unwrap(), &mut model)
        .unwrap();

    let results = tool_results(&report.outcome.messages);
    let expected = [
        (
            "c1",
            "not executed: invalid input for read_file: input.path: expected string, got integer",
            true,
        ),
        (
            "c2",
            "not executed: invalid input for read_file: input.path: required field is missing",
            true,
        ),
        (
            "c3",
            "not executed: invalid input for read_file: input.follow: unexpected field",
            true,
        ),
        (
            "c4",
            "not executed: invalid input for count: input.n: expected integer, got string",
            true,
        ),
        (
            "c5",
            // A string input is arguments sent as text that are not a JSON
            // object (how Chat Completions' unparsable arguments are kept).
            "not executed: arguments are not valid JSON (EOF while parsing a value at line 1 column 1)",
            true,
        ),
        ("c6", "alpha\n", false),
    ];
    let expected: Vec<(String, String, bool)> = expected
        .iter()
        .map(|(id, text, e)| ((*id).to_owned(), (*text).to_owned(), *e))
        .collect();
    assert_eq!(results, expected);
    assert_eq!(count.runs(), 0);
    assert_eq!(
        report
            .tools
            .iter()
            .filter(|t| t.decision == CallDecision::Invalid)
            .count(),
        5
    );
}

crate::async_twins!(
    valid_values_pass,
    type_mismatches_name_the_field,
    required_fields_are_checked,
    additional_properties_false_refuses_extra_fields,
    enums_are_checked,
    string_lengths_count_characters,
    array_lengths_and_items_are_checked,
    integer_refuses_every_float_as_serde_does,
    the_builtin_schemas_refuse_bad_arguments,
    duplicate_names_are_refused,
    definitions_and_dispatch_come_from_the_same_list,
    read_only_subset_refuses_unknown_and_non_read_only_tools,
    an_unregistered_name_is_refused_and_nothing_runs,
    invalid_arguments_are_refused_and_the_tool_does_not_run,
);
