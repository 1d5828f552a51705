//! The registry: one list that is both the model-visible definitions and the dispatch table.

use std::sync::Arc;

use serde_json::Value;

use super::schema::Schema;
use super::{Capability, ReadOnlyTool, Tool};
use crate::core::error::SetupError;
use crate::core::protocol::ToolDefinition;

/// A tool a [`ToolSource`] provides: read-only (a child may hold it) or not.
#[derive(Clone)]
pub enum ToolEntry {
    /// A read-only tool.
    ReadOnly(Arc<dyn ReadOnlyTool>),
    /// Any other tool.
    General(Arc<dyn Tool>),
}

/// Tools whose set can change during a run (an MCP server's, which says so
/// with `notifications/tools/list_changed`). A registry holding a source
/// offers and dispatches its tools as they were at the last turn boundary:
/// an agent's executor asks [`Registry::refreshed`] there, before a request
/// is built, so the definitions sent and the dispatch table stay one list.
pub trait ToolSource: Send + Sync {
    /// What the source is (`MCP server fs`), for messages.
    fn label(&self) -> String;
    /// The tools now, with their generation (a number that changes when
    /// they do), and a warning when they could not be read again (the last
    /// ones are given then). A source whose tools may have changed lists
    /// them again here.
    fn current(&self) -> (u64, Vec<ToolEntry>, Option<String>);
}

/// A source, with where its tools go among the others.
#[derive(Clone)]
struct Source {
    source: Arc<dyn ToolSource>,
    /// Registered after this many fixed tools.
    after: usize,
    /// The generation of the tools registered from it.
    generation: u64,
}

impl std::fmt::Debug for ToolEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.tool().name())
    }
}

impl ToolEntry {
    /// The tool's name.
    pub fn name(&self) -> &str {
        self.tool().name()
    }

    fn tool(&self) -> &dyn Tool {
        match self {
            Self::ReadOnly(tool) => tool.as_ref(),
            Self::General(tool) => tool.as_ref(),
        }
    }
}

/// The tools of one agent: definitions and dispatch from the same list.
#[derive(Clone, Default)]
pub struct Registry {
    entries: Vec<ToolEntry>,
    definitions: Vec<ToolDefinition>,
    /// For each entry, its definition's input schema, compiled for dispatch.
    schemas: Vec<Arc<Schema>>,
    /// For each entry, the source it came from (an index into `sources`).
    origins: Vec<Option<usize>>,
    sources: Vec<Source>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("tools", &self.names())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, entry: ToolEntry) -> Result<(), SetupError> {
        self.push_from(entry, None)
    }

    fn push_from(&mut self, entry: ToolEntry, origin: Option<usize>) -> Result<(), SetupError> {
        let tool = entry.tool();
        let name = tool.name().to_owned();
        if self.get(&name).is_some() {
            return Err(SetupError::DuplicateTool(name));
        }
        // The one place a tool's schema is asked for (a typed tool
        // generates it then): a registry made from this one keeps it.
        let input_schema = tool.input_schema();
        let schema = Schema::shared(&input_schema);
        let definition = ToolDefinition {
            name,
            description: tool.description().to_owned(),
            input_schema,
        };
        self.keep(entry, definition, schema, origin);
        Ok(())
    }

    /// Adds an entry with the definition and compiled schema it had in
    /// another registry (its name is known to be free here).
    fn keep(
        &mut self,
        entry: ToolEntry,
        definition: ToolDefinition,
        schema: Arc<Schema>,
        origin: Option<usize>,
    ) {
        self.definitions.push(definition);
        self.schemas.push(schema);
        self.entries.push(entry);
        self.origins.push(origin);
    }

    /// The entry at `index` with its definition and compiled schema.
    fn kept(&self, index: usize) -> Option<(ToolEntry, ToolDefinition, Arc<Schema>)> {
        Some((
            self.entries.get(index)?.clone(),
            self.definitions.get(index)?.clone(),
            self.schemas.get(index)?.clone(),
        ))
    }

    /// Adds a source's tools as they are now; later, [`Registry::refreshed`]
    /// gives a registry with its tools as they are then, in the same place.
    pub fn register_source(&mut self, source: Arc<dyn ToolSource>) -> Result<(), SetupError> {
        let (generation, tools, warning) = source.current();
        if let Some(warning) = warning {
            return Err(SetupError::ToolSource(warning));
        }
        let index = self.sources.len();
        let after = self
            .origins
            .iter()
            .filter(|origin| origin.is_none())
            .count();
        self.sources.push(Source {
            source,
            after,
            generation,
        });
        for entry in tools {
            self.push_from(entry, Some(index))?;
        }
        Ok(())
    }

    /// At a turn boundary: when a source's tools changed since this
    /// registry was built, this registry with every source's current tools
    /// (the fixed tools and the order kept), else `None`; and the warnings
    /// (a list that could not be read again, a name already taken).
    pub fn refreshed(&self) -> (Option<Registry>, Vec<String>) {
        if self.sources.is_empty() {
            return (None, Vec::new());
        }
        let mut warnings = Vec::new();
        let mut current = Vec::with_capacity(self.sources.len());
        let mut changed = false;
        for source in &self.sources {
            let (generation, tools, warning) = source.source.current();
            warnings.extend(warning);
            changed |= generation != source.generation;
            current.push((generation, tools));
        }
        if !changed {
            return (None, warnings);
        }
        let fixed: Vec<usize> = self
            .origins
            .iter()
            .enumerate()
            .filter(|(_, origin)| origin.is_none())
            .map(|(index, _)| index)
            .collect();
        let mut fresh = Registry {
            sources: self
                .sources
                .iter()
                .zip(&current)
                .map(|(source, (generation, _))| Source {
                    generation: *generation,
                    ..source.clone()
                })
                .collect(),
            ..Registry::default()
        };
        for position in 0..=fixed.len() {
            for (index, (source, (_, tools))) in self.sources.iter().zip(&current).enumerate() {
                if source.after != position {
                    continue;
                }
                for entry in tools.iter().cloned() {
                    let name = entry.tool().name().to_owned();
                    if fresh.push_from(entry, Some(index)).is_err() {
                        warnings.push(format!(
                            "{}: tool {name} is left out: the name is taken",
                            source.source.label()
                        ));
                    }
                }
            }
            if let Some((entry, definition, schema)) =
                fixed.get(position).and_then(|&index| self.kept(index))
            {
                let name = definition.name.clone();
                // Fixed tools were unique when registered, but a source's
                // tool placed before this one may have taken the name.
                if fresh.get(&name).is_none() {
                    fresh.keep(entry, definition, schema, None);
                }
            }
        }
        (Some(fresh), warnings)
    }

    /// Adds a tool. A read-only tool added here cannot be whitelisted for a
    /// subagent; use [`Registry::register_read_only`] for those.
    pub fn register(&mut self, tool: impl Tool + 'static) -> Result<(), SetupError> {
        self.push(ToolEntry::General(Arc::new(tool)))
    }

    /// Adds a read-only tool, which a subagent's whitelist may name.
    pub fn register_read_only(
        &mut self,
        tool: impl ReadOnlyTool + 'static,
    ) -> Result<(), SetupError> {
        self.push(ToolEntry::ReadOnly(Arc::new(tool)))
    }

    /// The definitions offered to the model, in registration order.
    pub fn definitions(&self) -> &[ToolDefinition] {
        &self.definitions
    }

    /// The tool names, in registration order.
    pub fn names(&self) -> Vec<&str> {
        self.definitions
            .iter()
            .map(|def| def.name.as_str())
            .collect()
    }

    /// The tool registered under `name`: the only way to dispatch.
    pub fn get(&self, name: &str) -> Option<&dyn Tool> {
        self.entries
            .iter()
            .map(ToolEntry::tool)
            .find(|tool| tool.name() == name)
    }

    /// The tool registered under `name` with the input schema its definition
    /// offers (computed once, at registration): what dispatch checks calls against.
    pub fn lookup(&self, name: &str) -> Option<(&dyn Tool, &Value)> {
        self.entries
            .iter()
            .zip(&self.definitions)
            .find(|(entry, _)| entry.tool().name() == name)
            .map(|(entry, definition)| (entry.tool(), &definition.input_schema))
    }

    /// [`Registry::lookup`], with the tool as a shared handle (an executor
    /// holds it while its registry may be refreshed) and the input schema
    /// compiled (once, at registration) for checking calls.
    pub fn lookup_shared(&self, name: &str) -> Option<(Arc<dyn Tool>, &Schema)> {
        self.entries
            .iter()
            .zip(&self.schemas)
            .find(|(entry, _)| entry.tool().name() == name)
            .map(|(entry, schema)| {
                let tool: Arc<dyn Tool> = match entry {
                    ToolEntry::ReadOnly(tool) => Arc::clone(tool) as Arc<dyn Tool>,
                    ToolEntry::General(tool) => Arc::clone(tool),
                };
                (tool, &**schema)
            })
    }

    /// A new registry holding exactly the whitelisted tools, for a subagent.
    ///
    /// Every name must be registered here, as a read-only tool whose
    /// capability is [`Capability::ReadOnly`]; otherwise this fails. There
    /// is no fallback to the full set.
    pub fn read_only_subset(&self, whitelist: &[&str]) -> Result<ReadOnlyRegistry, SetupError> {
        let mut child = ReadOnlyRegistry::new();
        for name in whitelist {
            let index = self
                .entries
                .iter()
                .position(|entry| entry.tool().name() == *name)
                .ok_or_else(|| SetupError::UnknownTool((*name).to_owned()))?;
            match self.kept(index) {
                Some((entry @ ToolEntry::ReadOnly(_), definition, schema))
                    if entry.tool().capability() == Capability::ReadOnly =>
                {
                    if child.0.get(name).is_some() {
                        return Err(SetupError::DuplicateTool((*name).to_owned()));
                    }
                    child.0.keep(entry, definition, schema, None);
                }
                _ => return Err(SetupError::NotReadOnly((*name).to_owned())),
            }
        }
        Ok(child)
    }
}

/// A registry that can only hold read-only tools: what a subagent gets.
#[derive(Clone, Default, Debug)]
pub struct ReadOnlyRegistry(Registry);

impl ReadOnlyRegistry {
    /// An empty read-only registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a read-only tool; a tool whose capability is not read-only is refused.
    pub fn with(mut self, tool: impl ReadOnlyTool + 'static) -> Result<Self, SetupError> {
        if tool.capability() != Capability::ReadOnly {
            return Err(SetupError::NotReadOnly(tool.name().to_owned()));
        }
        self.0.push(ToolEntry::ReadOnly(Arc::new(tool)))?;
        Ok(self)
    }

    /// The registry, for dispatch and definitions.
    pub fn registry(&self) -> &Registry {
        &self.0
    }
}
