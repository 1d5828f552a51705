//! A small JSON-schema subset validator for tool arguments.
//!
//! Supported keywords: `type` (`object`, `string`, `integer`, `number`,
//! `boolean`, `array`, `null`, or a list of them), `properties`,
//! `required`, `additionalProperties` (`false`, or a schema every other
//! field must match, as for a map), `enum`, `const`, `minLength` /
//! `maxLength` (counted in characters), `items`, `prefixItems`, `minItems`
//! / `maxItems`, `minimum` / `maximum` / `exclusiveMinimum` /
//! `exclusiveMaximum`, the integer `format`s (`int8` … `int64`, `uint8` …
//! `uint64`, `int`, `uint`) as ranges, `anyOf`, `oneOf` (exactly one),
//! `allOf`, and `$ref` to a place in the same schema (`#`,
//! `#/$defs/Name`). The boolean schema `false` accepts nothing, `true`
//! anything. Unknown keywords, and a `$ref` that does not lead to a place
//! in the schema, are ignored.
//!
//! This is what `schemars` generates for argument types (a typed tool's
//! schema), and on those schemas the validator agrees with `serde_json`:
//! `integer` is a JSON number written without a fraction or exponent
//! (`1.0` is refused, as serde refuses it for an integer field), and
//! `u8`'s `format: uint8` bounds it to 0..=255.
//!
//! This is our own code rather than the `jsonschema` crate, which pulls in
//! about sixty dependencies for features tool schemas do not use.

use std::collections::BTreeMap;

use serde_json::{Number, Value};
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

/// A schema compiled once: the keywords the validator implements, read out
/// of the schema's JSON when it is made rather than looked up at every
/// check.
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
    root: Node,
    /// The places `$ref`s lead to, each compiled once; a node's
    /// `reference` is an index here.
    targets: Vec<Node>,
}

/// One schema object, compiled.
#[derive(Debug, Clone, Default, PartialEq)]
struct Node {
    /// The boolean schema `false`: nothing matches.
    never: bool,
    types: Types,
    allowed: Option<Vec<Value>>,
    constant: Option<Value>,
    minimum: Option<(Number, bool)>,
    maximum: Option<(Number, bool)>,
    /// The range of an integer `format` (`uint8`: 0..=255).
    range: Option<(i128, i128)>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    prefix_items: Vec<Node>,
    items: Option<Box<Node>>,
    required: Vec<String>,
    properties: Option<BTreeMap<String, Node>>,
    additional: Additional,
    all_of: Vec<Node>,
    any_of: Vec<Node>,
    one_of: Vec<Node>,
    /// Where its `$ref` leads: an index into [`Schema::targets`].
    reference: Option<usize>,
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

/// What `additionalProperties` says of the fields `properties` does not name.
#[derive(Debug, Clone, Default, PartialEq)]
enum Additional {
    /// Absent or `true`: anything.
    #[default]
    Any,
    /// `false`: none may be there.
    Closed,
    /// A schema each must match.
    Each(Box<Node>),
}

/// How many `$ref`s may be followed at one place of the input before the
/// schema is taken to go round in a loop (`{"$ref": "#"}`).
const MAX_REF_HOPS: u32 = 32;

/// How many schema nodes one check may visit: a schema whose `$ref`s and
/// `anyOf`s multiply (an MCP server's, say) is refused rather than checked
/// for ever.
const MAX_VISITS: u32 = 1_000_000;

/// How many forms an `anyOf` / `oneOf` error lists, and how many schema
/// nodes it looks at to find them.
const MAX_FORMS: usize = 24;
const MAX_DESCRIBED: u32 = 256;

/// Reads a schema's JSON into nodes, following each `$ref` once.
struct Compiler<'a> {
    root: &'a Value,
    targets: Vec<Node>,
    /// The target index of each `$ref` seen, by its text.
    seen: BTreeMap<String, usize>,
}

impl Compiler<'_> {
    fn node(&mut self, schema: &Value) -> Node {
        let keywords = match schema {
            Value::Object(keywords) => keywords,
            Value::Bool(false) => {
                return Node {
                    never: true,
                    ..Node::default()
                };
            }
            _ => return Node::default(),
        };
        let bound = |key: &str| keywords.get(key).and_then(Value::as_u64);
        let number = |key: &str| match keywords.get(key) {
            Some(Value::Number(n)) => Some(n.clone()),
            _ => None,
        };
        let list = |compiler: &mut Self, key: &str| match keywords.get(key) {
            Some(Value::Array(schemas)) => schemas.iter().map(|s| compiler.node(s)).collect(),
            _ => Vec::new(),
        };
        let minimum = match (number("minimum"), number("exclusiveMinimum")) {
            (_, Some(exclusive)) => Some((exclusive, true)),
            (inclusive, None) => inclusive.map(|n| (n, false)),
        };
        let maximum = match (number("maximum"), number("exclusiveMaximum")) {
            (_, Some(exclusive)) => Some((exclusive, true)),
            (inclusive, None) => inclusive.map(|n| (n, false)),
        };
        Node {
            never: false,
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
            constant: keywords.get("const").cloned(),
            minimum,
            maximum,
            range: keywords
                .get("format")
                .and_then(Value::as_str)
                .and_then(format_range),
            min_length: bound("minLength"),
            max_length: bound("maxLength"),
            min_items: bound("minItems"),
            max_items: bound("maxItems"),
            prefix_items: list(self, "prefixItems"),
            items: keywords
                .get("items")
                .map(|items| Box::new(self.node(items))),
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
                        .map(|(name, field)| (name.clone(), self.node(field)))
                        .collect()
                }),
            additional: match keywords.get("additionalProperties") {
                Some(Value::Bool(false)) => Additional::Closed,
                Some(schema @ Value::Object(_)) => Additional::Each(Box::new(self.node(schema))),
                _ => Additional::Any,
            },
            all_of: list(self, "allOf"),
            any_of: list(self, "anyOf"),
            one_of: list(self, "oneOf"),
            reference: keywords
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|reference| self.target(reference)),
        }
    }

    /// The index of the node a `$ref` leads to, compiled the first time it
    /// is seen; `None` for a reference outside the schema or to nothing.
    fn target(&mut self, reference: &str) -> Option<usize> {
        let pointer = reference.strip_prefix('#')?;
        if let Some(&index) = self.seen.get(reference) {
            return Some(index);
        }
        let target = self.root.pointer(pointer)?;
        let index = self.targets.len();
        // Reserved before compiling, so a reference back to it (a
        // recursive type) finds it.
        self.targets.push(Node::default());
        self.seen.insert(reference.to_owned(), index);
        let node = self.node(target);
        if let Some(slot) = self.targets.get_mut(index) {
            *slot = node;
        }
        Some(index)
    }
}

/// The range of an integer `format`, as `schemars` writes them (`u32` is
/// `{"type": "integer", "format": "uint32", "minimum": 0}`, with no maximum).
fn format_range(format: &str) -> Option<(i128, i128)> {
    Some(match format {
        "int8" => (i8::MIN.into(), i8::MAX.into()),
        "int16" => (i16::MIN.into(), i16::MAX.into()),
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "int64" => (i64::MIN.into(), i64::MAX.into()),
        "int" => (isize::MIN as i128, isize::MAX as i128),
        "uint8" => (0, u8::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint64" => (0, u64::MAX.into()),
        "uint" => (0, usize::MAX as i128),
        _ => return None,
    })
}

/// A failed check: the error, and how deep into the input the check got
/// (to tell which branch of an `anyOf` came closest).
#[derive(Debug)]
struct Failure {
    error: SchemaError,
    depth: usize,
}

type Checked = Result<(), Failure>;

/// What one check carries: the compiled targets and the visits left.
struct Run<'s> {
    targets: &'s [Node],
    visits: u32,
}

impl Schema {
    /// [`Schema::new`], compiled once per process for each schema: the
    /// last few compiled are kept, and a registry built again with the
    /// same tools (a run per request, say) shares them.
    pub(crate) fn shared(schema: &Value) -> std::sync::Arc<Self> {
        /// How many compiled schemas are kept.
        const KEPT: usize = 32;
        type Compiled = (Value, std::sync::Arc<Schema>);
        static KEPT_SCHEMAS: std::sync::Mutex<Vec<Compiled>> = std::sync::Mutex::new(Vec::new());
        let found = {
            let kept = KEPT_SCHEMAS
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            kept.iter()
                .find(|(source, _)| source == schema)
                .map(|(_, compiled)| std::sync::Arc::clone(compiled))
        };
        if let Some(compiled) = found {
            return compiled;
        }
        let compiled = std::sync::Arc::new(Self::new(schema));
        let mut kept = KEPT_SCHEMAS
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if kept.len() >= KEPT {
            kept.remove(0);
        }
        kept.push((schema.clone(), std::sync::Arc::clone(&compiled)));
        compiled
    }

    /// Compiles `schema`; a value that is not an object checks nothing
    /// (`false` refuses everything), as do the keywords the validator does
    /// not implement.
    pub fn new(schema: &Value) -> Self {
        let mut compiler = Compiler {
            root: schema,
            targets: Vec::new(),
            seen: BTreeMap::new(),
        };
        let root = compiler.node(schema);
        Self {
            root,
            targets: compiler.targets,
        }
    }

    /// Checks `value`; the first mismatch is reported.
    pub fn validate(&self, value: &Value) -> Result<(), SchemaError> {
        let mut run = Run {
            targets: &self.targets,
            visits: MAX_VISITS,
        };
        self.root
            .check(value, &Place::Input, 0, &mut run)
            .map_err(|failure| failure.error)
    }
}

impl Node {
    fn check(&self, value: &Value, path: &Place<'_>, hops: u32, run: &mut Run<'_>) -> Checked {
        let depth = path.depth();
        let fail_here = |message: String| {
            Err(Failure {
                error: SchemaError {
                    path: path.to_string(),
                    message,
                },
                depth,
            })
        };
        if run.visits == 0 {
            return fail_here("the schema is too complex to check".to_owned());
        }
        run.visits -= 1;
        if self.never {
            return fail_here("no value is allowed here".to_owned());
        }
        if let Some(index) = self.reference {
            if hops >= MAX_REF_HOPS {
                return fail_here("the schema's $ref goes round in a loop".to_owned());
            }
            if let Some(target) = run.targets.get(index) {
                target.check(value, path, hops + 1, run)?;
            }
        }
        match &self.types {
            Types::One(expected) if !has_type(value, expected) => {
                return fail_here(format!("expected {expected}, got {}", type_name(value)));
            }
            Types::AnyOf(options) if !options.iter().any(|expected| has_type(value, expected)) => {
                return fail_here(format!(
                    "got {}, which the schema does not allow",
                    type_name(value)
                ));
            }
            _ => {}
        }
        if let Some(constant) = &self.constant
            && constant != value
        {
            return fail_here(format!("must be {constant}"));
        }
        if let Some(allowed) = &self.allowed
            && !allowed.contains(value)
        {
            let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return fail_here(format!("must be one of {}", list.join(", ")));
        }
        match value {
            Value::Number(number) => {
                if let Some(message) = self.out_of_range(number) {
                    return fail_here(message);
                }
            }
            // Characters are counted only when there is a bound to count against.
            Value::String(text) if self.min_length.is_some() || self.max_length.is_some() => {
                let len = text.chars().count() as u64;
                if let Err(error) = bounds(
                    path,
                    len,
                    (self.min_length, self.max_length),
                    ("character", "characters"),
                ) {
                    return Err(Failure { error, depth });
                }
            }
            Value::Array(items) => {
                if let Err(error) = bounds(
                    path,
                    items.len() as u64,
                    (self.min_items, self.max_items),
                    ("item", "items"),
                ) {
                    return Err(Failure { error, depth });
                }
                for (index, item) in items.iter().enumerate() {
                    let item_schema = match self.prefix_items.get(index) {
                        Some(schema) => Some(schema),
                        None => self.items.as_deref(),
                    };
                    if let Some(item_schema) = item_schema {
                        item_schema.check(item, &Place::Item(path, index), 0, run)?;
                    }
                }
            }
            Value::Object(fields) => {
                for name in &self.required {
                    if !fields.contains_key(name) {
                        // Reported at the field, but the check got no
                        // deeper than the object.
                        return Err(Failure {
                            error: SchemaError {
                                path: Place::Field(path, name).to_string(),
                                message: "required field is missing".to_owned(),
                            },
                            depth,
                        });
                    }
                }
                for (name, field) in fields {
                    let field_path = Place::Field(path, name);
                    match self.properties.as_ref().and_then(|props| props.get(name)) {
                        Some(field_schema) => field_schema.check(field, &field_path, 0, run)?,
                        None => match &self.additional {
                            Additional::Any => {}
                            Additional::Closed => {
                                return Err(Failure {
                                    error: SchemaError {
                                        path: field_path.to_string(),
                                        message: "unexpected field".to_owned(),
                                    },
                                    depth: depth + 1,
                                });
                            }
                            Additional::Each(schema) => schema.check(field, &field_path, 0, run)?,
                        },
                    }
                }
            }
            _ => {}
        }
        for schema in &self.all_of {
            schema.check(value, path, hops, run)?;
        }
        if !self.any_of.is_empty() {
            self.branches(&self.any_of, false, value, path, hops, run)?;
        }
        if !self.one_of.is_empty() {
            self.branches(&self.one_of, true, value, path, hops, run)?;
        }
        Ok(())
    }

    /// `anyOf` (at least one branch matches) or `oneOf` (exactly one). When
    /// none does, the error is the one of the branch the value came
    /// closest to (the only one the check got deeper into, or the only one
    /// whose `type` it has), else a list of what the branches allow.
    fn branches(
        &self,
        branches: &[Node],
        exactly_one: bool,
        value: &Value,
        path: &Place<'_>,
        hops: u32,
        run: &mut Run<'_>,
    ) -> Checked {
        let depth = path.depth();
        let mut failures = Vec::with_capacity(branches.len());
        let mut matched = 0;
        for branch in branches {
            match branch.check(value, path, hops, run) {
                Ok(()) if !exactly_one => return Ok(()),
                Ok(()) => matched += 1,
                Err(failure) => failures.push(Some(failure)),
            }
            if run.visits == 0 {
                break;
            }
        }
        let fail_here = |message: String| {
            Err(Failure {
                error: SchemaError {
                    path: path.to_string(),
                    message,
                },
                depth,
            })
        };
        if run.visits == 0 {
            return fail_here("the schema is too complex to check".to_owned());
        }
        match matched {
            1 => return Ok(()),
            0 => {}
            n => {
                return fail_here(format!(
                    "matches {n} of the {} allowed forms; it must match exactly one",
                    branches.len()
                ));
            }
        }
        let deepest = failures.iter().flatten().map(|f| f.depth).max();
        if let Some(deepest) = deepest
            && deepest > depth
        {
            let mut at_deepest = failures
                .iter_mut()
                .filter(|failure| failure.as_ref().is_some_and(|f| f.depth == deepest));
            if let (Some(only), None) = (at_deepest.next(), at_deepest.next())
                && let Some(failure) = only.take()
            {
                return Err(failure);
            }
        }
        // The one branch of the value's type, unless it only lists values
        // (then the list of every branch's values says more).
        let mut typed = branches
            .iter()
            .zip(failures.iter_mut())
            .filter(|(branch, _)| branch.admits_type(value, run.targets));
        if let (Some((branch, only)), None) = (typed.next(), typed.next())
            && branch.constant.is_none()
            && branch.allowed.is_none()
            && let Some(failure) = only.take()
        {
            return Err(failure);
        }
        let mut forms = Vec::new();
        let mut budget = MAX_DESCRIBED;
        for branch in branches {
            branch.describe(run.targets, 0, &mut forms, &mut budget);
        }
        let mut seen = std::collections::BTreeSet::new();
        forms.retain(|form| seen.insert(form.clone()));
        if forms.len() > MAX_FORMS || budget == 0 {
            forms.truncate(MAX_FORMS);
            forms.push("…".to_owned());
        }
        fail_here(format!("must be one of {}", forms.join(", ")))
    }

    /// Whether `value` is of a JSON type this node names (in `type`, or as
    /// the type of a `const` or `enum` value).
    fn admits_type(&self, value: &Value, targets: &[Node]) -> bool {
        if let Some(target) = self.reference.and_then(|index| targets.get(index))
            && self.types == Types::Any
            && target.types != Types::Any
        {
            return target.admits_type(value, targets);
        }
        match &self.types {
            Types::One(expected) => has_type(value, expected),
            Types::AnyOf(options) => options.iter().any(|expected| has_type(value, expected)),
            Types::Any => {
                let same = |other: &Value| type_name(other) == type_name(value);
                self.constant.as_ref().is_some_and(same)
                    || self
                        .allowed
                        .as_ref()
                        .is_some_and(|allowed| allowed.iter().any(same))
            }
        }
    }

    /// Short forms of what this node allows, for an error message: its
    /// values when it lists them, `{"Name": …}` for an object of one
    /// required field (an enum variant with data), else its type.
    fn describe(&self, targets: &[Node], hops: u32, forms: &mut Vec<String>, budget: &mut u32) {
        if *budget == 0 || forms.len() > MAX_FORMS {
            return;
        }
        *budget -= 1;
        if let Some(constant) = &self.constant {
            forms.push(constant.to_string());
            return;
        }
        if let Some(allowed) = &self.allowed {
            forms.extend(allowed.iter().map(Value::to_string));
            return;
        }
        let branches: Vec<&Node> = self.any_of.iter().chain(&self.one_of).collect();
        if !branches.is_empty() && self.types == Types::Any {
            for branch in branches {
                branch.describe(targets, hops, forms, budget);
            }
            return;
        }
        if let Some(target) = self.reference.and_then(|index| targets.get(index))
            && self.types == Types::Any
            && hops < 4
        {
            target.describe(targets, hops + 1, forms, budget);
            return;
        }
        let one = |expected: &str| match expected {
            "object" => match self.required.as_slice() {
                [name] if self.additional == Additional::Closed => {
                    format!("{{{}: …}}", Value::from(name.as_str()))
                }
                _ => "an object".to_owned(),
            },
            "array" => "an array".to_owned(),
            "string" => "a string".to_owned(),
            "integer" => "an integer".to_owned(),
            "number" => "a number".to_owned(),
            "boolean" => "a boolean".to_owned(),
            "null" => "null".to_owned(),
            other => format!("a value of type {other}"),
        };
        match &self.types {
            Types::One(expected) => forms.push(one(expected)),
            Types::AnyOf(options) => forms.extend(options.iter().map(|t| one(t))),
            Types::Any => forms.push("a value".to_owned()),
        }
    }

    /// Why `number` is outside `minimum` / `maximum` or the format's range.
    fn out_of_range(&self, number: &Number) -> Option<String> {
        use std::cmp::Ordering::{Greater, Less};
        if let Some((low, exclusive)) = &self.minimum {
            match (compare(number, low), exclusive) {
                (Some(Less), _) => return Some(format!("must be at least {low} (got {number})")),
                (Some(std::cmp::Ordering::Equal), true) => {
                    return Some(format!("must be more than {low} (got {number})"));
                }
                _ => {}
            }
        }
        if let Some((high, exclusive)) = &self.maximum {
            match (compare(number, high), exclusive) {
                (Some(Greater), _) => {
                    return Some(format!("must be at most {high} (got {number})"));
                }
                (Some(std::cmp::Ordering::Equal), true) => {
                    return Some(format!("must be less than {high} (got {number})"));
                }
                _ => {}
            }
        }
        if let Some((low, high)) = self.range {
            let whole = whole(number);
            let below = match whole {
                Some(n) => n < low,
                None => number.as_f64().is_some_and(|f| f < low as f64),
            };
            let above = match whole {
                Some(n) => n > high,
                None => number.as_f64().is_some_and(|f| f > high as f64),
            };
            if below {
                return Some(format!("must be at least {low} (got {number})"));
            }
            if above {
                return Some(format!("must be at most {high} (got {number})"));
            }
        }
        None
    }
}

/// `number` against `bound`: exactly when both are integers, as floats otherwise.
fn compare(number: &Number, bound: &Number) -> Option<std::cmp::Ordering> {
    match (whole(number), whole(bound)) {
        (Some(a), Some(b)) => Some(a.cmp(&b)),
        _ => number.as_f64()?.partial_cmp(&bound.as_f64()?),
    }
}

/// A number written as an integer, widened so that `i64` and `u64` compare.
fn whole(number: &Number) -> Option<i128> {
    number
        .as_i64()
        .map(i128::from)
        .or_else(|| number.as_u64().map(i128::from))
}

/// Where a value sits in the input; written out only when a check fails, so
/// a call that passes costs no path strings.
enum Place<'a> {
    Input,
    Field(&'a Place<'a>, &'a str),
    Item(&'a Place<'a>, usize),
}

impl Place<'_> {
    /// How many fields and items down from the input.
    fn depth(&self) -> usize {
        match self {
            Self::Input => 0,
            Self::Field(parent, _) | Self::Item(parent, _) => parent.depth() + 1,
        }
    }
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

/// Whether `value` has the JSON type `expected`. An `integer` is a number
/// written without a fraction or an exponent: `1.0` is a `number` only, as
/// serde_json will not read it into an integer field.
fn has_type(value: &Value, expected: &str) -> bool {
    match expected {
        "number" => value.is_number(),
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
