//! `todo_write {"items": [...]}`: replaces the agent's plan.

use serde_json::{Value, json};

use super::{Capability, Tool, ToolContext};
use crate::core::conversation::ToolOutput;
use crate::core::plan::{
    ItemStatus, MAX_ID_CHARS, MAX_ITEMS, MAX_TEXT_CHARS, Plan, PlanItem, SharedPlan,
};

/// The `todo_write` tool.
#[derive(Debug, Clone)]
pub(crate) struct TodoWrite {
    plan: SharedPlan,
}

impl TodoWrite {
    /// A tool writing to `plan`.
    pub fn new(plan: SharedPlan) -> Self {
        Self { plan }
    }
}

impl Tool for TodoWrite {
    fn name(&self) -> &str {
        "todo_write"
    }

    fn description(&self) -> &str {
        "Replace the current plan with the given items. At most 20 items, unique ids, at most one in_progress."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "maxItems": MAX_ITEMS,
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
                            "text": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS},
                            "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}
                        },
                        "required": ["id", "text", "status"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["items"],
            "additionalProperties": false
        })
    }

    fn capability(&self) -> Capability {
        Capability::Plans
    }

    fn run(&self, input: &Value, _context: &ToolContext<'_>) -> ToolOutput {
        let items = input.get("items").cloned().unwrap_or(Value::Null);
        let items: Vec<PlanItem> = match serde_json::from_value(items) {
            Ok(items) => items,
            Err(err) => {
                return ToolOutput::error(format!(
                    "todo_write: invalid items: {err}; the plan is unchanged"
                ));
            }
        };
        match Plan::new(items) {
            Ok(plan) => {
                let count = |status| {
                    plan.items()
                        .iter()
                        .filter(|item| item.status == status)
                        .count()
                };
                let text = format!(
                    "plan updated: {} item(s), {} pending, {} in progress, {} completed",
                    plan.items().len(),
                    count(ItemStatus::Pending),
                    count(ItemStatus::InProgress),
                    count(ItemStatus::Completed)
                );
                self.plan.replace(plan);
                ToolOutput::ok(text)
            }
            Err(err) => ToolOutput::error(format!("todo_write: {err}; the plan is unchanged")),
        }
    }
}
