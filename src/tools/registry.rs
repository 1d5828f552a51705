//! The registry: one list that is both the model-visible definitions and the dispatch table.

use std::sync::Arc;

use serde_json::Value;

use super::{Capability, ReadOnlyTool, Tool};
use crate::error::SetupError;
use crate::protocol::ToolDefinition;

#[derive(Clone)]
enum Entry {
    ReadOnly(Arc<dyn ReadOnlyTool>),
    General(Arc<dyn Tool>),
}

impl Entry {
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
    entries: Vec<Entry>,
    definitions: Vec<ToolDefinition>,
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

    fn push(&mut self, entry: Entry) -> Result<(), SetupError> {
        let tool = entry.tool();
        let name = tool.name().to_owned();
        if self.get(&name).is_some() {
            return Err(SetupError::DuplicateTool(name));
        }
        self.definitions.push(ToolDefinition {
            name,
            description: tool.description().to_owned(),
            input_schema: tool.input_schema(),
        });
        self.entries.push(entry);
        Ok(())
    }

    /// Adds a tool. A read-only tool added here cannot be whitelisted for a
    /// subagent; use [`Registry::register_read_only`] for those.
    pub fn register(&mut self, tool: impl Tool + 'static) -> Result<(), SetupError> {
        self.push(Entry::General(Arc::new(tool)))
    }

    /// Adds a read-only tool, which a subagent's whitelist may name.
    pub fn register_read_only(
        &mut self,
        tool: impl ReadOnlyTool + 'static,
    ) -> Result<(), SetupError> {
        self.push(Entry::ReadOnly(Arc::new(tool)))
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
            .map(Entry::tool)
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

    /// A new registry holding exactly the whitelisted tools, for a subagent.
    ///
    /// Every name must be registered here, as a read-only tool whose
    /// capability is [`Capability::ReadOnly`]; otherwise this fails. There
    /// is no fallback to the full set.
    pub fn read_only_subset(&self, whitelist: &[&str]) -> Result<ReadOnlyRegistry, SetupError> {
        let mut child = ReadOnlyRegistry::new();
        for name in whitelist {
            let entry = self
                .entries
                .iter()
                .find(|entry| entry.tool().name() == *name)
                .ok_or_else(|| SetupError::UnknownTool((*name).to_owned()))?;
            match entry {
                Entry::ReadOnly(tool) if tool.capability() == Capability::ReadOnly => {
                    child.0.push(Entry::ReadOnly(Arc::clone(tool)))?;
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
        self.0.push(Entry::ReadOnly(Arc::new(tool)))?;
        Ok(self)
    }

    /// The registry, for dispatch and definitions.
    pub fn registry(&self) -> &Registry {
        &self.0
    }
}
