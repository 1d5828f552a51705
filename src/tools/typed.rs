//! Typed tools: arguments declared as a Rust type, from which the input
//! schema is generated and into which each call's arguments are read.

use std::future::ready;

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Capability, Tool, ToolContext, ToolFuture, refusal};
use crate::core::conversation::ToolOutput;

/// A tool whose arguments are a Rust type: its input schema is generated
/// from [`TypedTool::Args`] (with [`schemars`]), and [`TypedTool::run`] is
/// handed the arguments already read into that type, so the schema the
/// model sees and the code that reads the arguments cannot drift apart.
///
/// Every typed tool is a [`Tool`] (a blanket implementation), registered
/// like any other. As for any tool, a call's arguments are first checked
/// against the schema and a mismatch is answered `not executed: invalid
/// input for <name>: <where>: <what>`; then they are deserialized, which on
/// the schemas `schemars` generates cannot fail (the validator and
/// `serde_json` agree on them, a property test says so), and if it did the
/// call would be answered `not executed:` with serde's message.
///
/// `Args` should be a struct (a model's tool input is always a JSON
/// object). Its fields' doc comments become their `description`s; the doc
/// comment of the type itself is for Rust readers and is left out, as are
/// `$schema` and `title` (what the model reads about the tool is
/// [`TypedTool::description`]). `#[serde(deny_unknown_fields)]` makes the
/// schema `additionalProperties: false`, and `#[schemars(length(min = 1))]`
/// and the like add bounds (checked before the tool runs; serde does not
/// check them).
///
/// The schema is generated when the tool is registered, and the registry
/// keeps it, compiled, for as long as it holds the tool.
///
/// ```
/// use schemars::JsonSchema;
/// use serde::Deserialize;
/// use subloop::core::conversation::ToolOutput;
/// use subloop::tools::{Capability, Tool, ToolContext, TypedTool};
///
/// #[derive(Deserialize, JsonSchema)]
/// #[serde(deny_unknown_fields)]
/// struct AddArgs {
///     /// The numbers to add.
///     numbers: Vec<i64>,
/// }
///
/// struct Add;
///
/// impl TypedTool for Add {
///     type Args = AddArgs;
///     fn name(&self) -> &str { "add" }
///     fn description(&self) -> &str { "Add whole numbers." }
///     fn capability(&self) -> Capability { Capability::ReadOnly }
///     fn run(&self, args: AddArgs, _context: &ToolContext<'_>) -> ToolOutput {
///         ToolOutput::ok(args.numbers.iter().sum::<i64>().to_string())
///     }
/// }
///
/// let schema = Tool::input_schema(&Add);
/// assert_eq!(schema["properties"]["numbers"]["description"], "The numbers to add.");
/// assert_eq!(schema["additionalProperties"], false);
/// ```
///
/// `run` is handed the arguments' type, never the raw JSON:
///
/// ```compile_fail
/// # use schemars::JsonSchema;
/// # use serde::Deserialize;
/// # use subloop::core::conversation::ToolOutput;
/// # use subloop::tools::{Capability, ToolContext, TypedTool};
/// # #[derive(Deserialize, JsonSchema)]
/// # struct AddArgs { numbers: Vec<i64> }
/// struct Add;
/// impl TypedTool for Add {
///     type Args = AddArgs;
///     fn name(&self) -> &str { "add" }
///     fn description(&self) -> &str { "Add whole numbers." }
///     fn capability(&self) -> Capability { Capability::ReadOnly }
///     fn run(&self, input: serde_json::Value, _context: &ToolContext<'_>) -> ToolOutput {
///         ToolOutput::ok(input["numbers"].to_string())
///     }
/// }
/// ```
pub trait TypedTool: Send + Sync {
    /// The arguments: their schema is the tool's input schema.
    type Args: DeserializeOwned + JsonSchema;

    /// The name the model calls it by.
    fn name(&self) -> &str;
    /// What it does, for the model.
    fn description(&self) -> &str;
    /// What it may do.
    fn capability(&self) -> Capability;

    /// A one-line description of what a call would do, shown when asking
    /// for approval; `None` (the default) shows the tool's name and the
    /// arguments as JSON, as for any tool.
    fn action(&self, args: &Self::Args) -> Option<String> {
        let _ = args;
        None
    }

    /// Runs one call with checked and deserialized arguments.
    fn run(&self, args: Self::Args, context: &ToolContext<'_>) -> ToolOutput;

    /// Runs one call in an async run ([`Tool::run_async`]); the default
    /// runs [`TypedTool::run`] when called. A tool that waits (on a
    /// program, a server) overrides it.
    fn run_async<'a>(&'a self, args: Self::Args, context: &'a ToolContext<'a>) -> ToolFuture<'a> {
        Box::pin(ready(self.run(args, context)))
    }
}

/// The input schema of a tool whose arguments are `A`, as a typed tool
/// offers it: generated for JSON Schema draft 2020-12 with every
/// subschema inlined (a recursive type keeps `$defs` and `$ref`, which the
/// validator follows), without `$schema`, and without the type's own
/// `title` and `description` at the top.
///
/// ```
/// use schemars::JsonSchema;
/// use serde::Deserialize;
/// use serde_json::json;
///
/// #[derive(Deserialize, JsonSchema)]
/// #[serde(deny_unknown_fields)]
/// /// The arguments of `greet`.
/// struct Greet {
///     /// Who to greet.
///     name: String,
/// }
///
/// assert_eq!(
///     subloop::tools::input_schema_for::<Greet>(),
///     json!({
///         "type": "object",
///         "properties": {"name": {"type": "string", "description": "Who to greet."}},
///         "required": ["name"],
///         "additionalProperties": false
///     })
/// );
/// ```
pub fn input_schema_for<A: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .with(|settings| {
            settings.meta_schema = None;
            settings.inline_subschemas = true;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<A>().to_value();
    if let Value::Object(keywords) = &mut schema {
        keywords.remove("$schema");
        keywords.remove("title");
        keywords.remove("description");
    }
    schema
}

/// A call's arguments read into `T::Args`, or the refusal its call gets.
fn arguments<T: TypedTool>(tool: &T, input: &Value) -> Result<T::Args, ToolOutput> {
    T::Args::deserialize(input).map_err(|err| {
        refusal(format_args!(
            "invalid input for {}: {err}",
            TypedTool::name(tool)
        ))
    })
}

impl<T: TypedTool> Tool for T {
    fn name(&self) -> &str {
        TypedTool::name(self)
    }

    fn description(&self) -> &str {
        TypedTool::description(self)
    }

    fn input_schema(&self) -> Value {
        input_schema_for::<T::Args>()
    }

    fn capability(&self) -> Capability {
        TypedTool::capability(self)
    }

    fn action(&self, input: &Value) -> String {
        arguments(self, input)
            .ok()
            .and_then(|args| TypedTool::action(self, &args))
            .unwrap_or_else(|| format!("{} {}", TypedTool::name(self), input))
    }

    fn run(&self, input: &Value, context: &ToolContext<'_>) -> ToolOutput {
        match arguments(self, input) {
            Ok(args) => TypedTool::run(self, args, context),
            Err(refused) => refused,
        }
    }

    fn run_async<'a>(&'a self, input: &'a Value, context: &'a ToolContext<'a>) -> ToolFuture<'a> {
        match arguments(self, input) {
            Ok(args) => TypedTool::run_async(self, args, context),
            Err(refused) => Box::pin(ready(refused)),
        }
    }
}
