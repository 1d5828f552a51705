//! The `hooks` of a settings file, in Claude Code's format:
//!
//! ```json
//! {"hooks": {"PreToolUse": [{"matcher": "run_main|read_file",
//!   "hooks": [{"type": "command", "command": "./guard.sh", "timeout": 30}]}]}}
//! ```
//!
//! Read once, checked whole: a hook that is not a `command` hook, a
//! command that is empty, a timeout that is not a positive number or a
//! matcher that is not a valid regular expression is an error naming where
//! it is. Events subloop does not run (`Notification`, `PreCompact`, …) are
//! left out with a note, so one file can serve Claude Code and subloop.

use std::collections::BTreeMap;
use std::time::Duration;

use regex::{Regex, RegexBuilder};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::core::hook::HookEvent;

/// How long a hook may run when its settings give no `timeout`.
pub(crate) const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// A settings file whose hooks cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HookSettingsError {
    /// The file could not be read.
    #[error("cannot read settings {path}: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The settings are not JSON, or their hooks are not of the format.
    #[error("invalid settings {origin}: {message}")]
    Invalid {
        /// The file (or what the text came from).
        origin: String,
        /// What is wrong, and where.
        message: String,
    },
}

/// Which names a matcher group applies to.
#[derive(Debug, Clone)]
pub(crate) enum Matcher {
    /// `""`, `"*"` or no matcher: every one.
    All,
    /// Letters, digits, `_` and `|` only: these exact names.
    Names(Vec<String>),
    /// Anything else: a regular expression, searched anywhere in the name
    /// (anchor it with `^…$` to match whole names), as Claude Code does.
    Pattern(Regex),
}

impl Matcher {
    /// The matcher written as `text`.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() || text == "*" {
            return Ok(Self::All);
        }
        if text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|')
        {
            return Ok(Self::Names(
                text.split('|')
                    .filter(|name| !name.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ));
        }
        RegexBuilder::new(text)
            .size_limit(1 << 20)
            .build()
            .map(Self::Pattern)
            .map_err(|err| format!("matcher {text:?} is not a valid regular expression: {err}"))
    }

    /// Whether `subject` (a tool name, an agent type, a source, a reason) matches.
    pub(crate) fn matches(&self, subject: &str) -> bool {
        match self {
            Self::All => true,
            Self::Names(names) => names.iter().any(|name| name == subject),
            Self::Pattern(pattern) => pattern.is_match(subject),
        }
    }
}

/// One command hook of a settings file.
#[derive(Debug, Clone)]
pub(crate) struct CommandHook {
    /// Run by `sh -c`.
    pub(crate) command: String,
    /// Killed (its whole process group) after this long.
    pub(crate) timeout: Duration,
    /// A failure is a warning even before a tool call (`"failOpen": true`).
    pub(crate) fail_open: bool,
}

/// A matcher and its hooks.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) matcher: Matcher,
    pub(crate) hooks: Vec<CommandHook>,
}

/// Every event's groups, in the order written, and the notes on what was
/// left out.
#[derive(Debug, Clone, Default)]
pub(crate) struct Config {
    pub(crate) events: BTreeMap<&'static str, (HookEvent, Vec<Group>)>,
    pub(crate) notes: Vec<String>,
}

/// The Claude Code events that have no counterpart in subloop, and why.
fn not_applicable(name: &str) -> Option<&'static str> {
    Some(match name {
        "Notification" => "subloop sends no notifications",
        "PreCompact" | "PostCompact" => "subloop never compacts a conversation",
        "PermissionRequest" | "PermissionDenied" => {
            "the approver decides permissions (a PreToolUse hook may answer `ask`)"
        }
        "PostToolUseFailure" => "PostToolUse runs after every call that ran, failed or not",
        _ => return None,
    })
}

fn invalid(origin: &str, message: String) -> HookSettingsError {
    HookSettingsError::Invalid {
        origin: origin.to_owned(),
        message,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Config {
    /// The hooks of the settings `text` (from `origin`, for messages).
    pub(crate) fn parse(text: &str, origin: &str) -> Result<Self, HookSettingsError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|err| invalid(origin, format!("not JSON: {err}")))?;
        let Value::Object(top) = value else {
            return Err(invalid(
                origin,
                format!("the settings are a JSON object, not {}", kind(&value)),
            ));
        };
        let mut config = Self::default();
        if top.get("disableAllHooks") == Some(&Value::Bool(true)) {
            config
                .notes
                .push("disableAllHooks is true: no hook runs".to_owned());
            return Ok(config);
        }
        let hooks = match top.get("hooks") {
            None | Some(Value::Null) => return Ok(config),
            Some(Value::Object(hooks)) => hooks,
            Some(other) => {
                return Err(invalid(
                    origin,
                    format!("`hooks` is an object, not {}", kind(other)),
                ));
            }
        };
        for (name, groups) in hooks {
            let Some(event) = HookEvent::parse(name) else {
                let why = not_applicable(name).unwrap_or("not an event subloop knows");
                config
                    .notes
                    .push(format!("{name} hooks are left out: {why}"));
                continue;
            };
            let groups = parse_groups(groups, &format!("hooks.{name}"), &mut config.notes)
                .map_err(|message| invalid(origin, message))?;
            config.events.insert(event.as_str(), (event, groups));
        }
        Ok(config)
    }
}

fn parse_groups(value: &Value, at: &str, notes: &mut Vec<String>) -> Result<Vec<Group>, String> {
    let Value::Array(groups) = value else {
        return Err(format!(
            "{at} is an array of matcher groups, not {}",
            kind(value)
        ));
    };
    let mut parsed = Vec::with_capacity(groups.len());
    for (index, group) in groups.iter().enumerate() {
        let at = format!("{at}[{index}]");
        let Value::Object(group) = group else {
            return Err(format!(
                "{at} is an object with `hooks`, not {}",
                kind(group)
            ));
        };
        let matcher = match group.get("matcher") {
            None | Some(Value::Null) => Matcher::All,
            Some(Value::String(text)) => {
                Matcher::parse(text).map_err(|err| format!("{at}: {err}"))?
            }
            Some(other) => {
                return Err(format!("{at}.matcher is a string, not {}", kind(other)));
            }
        };
        let hooks = match group.get("hooks") {
            Some(Value::Array(hooks)) => hooks,
            Some(other) => {
                return Err(format!("{at}.hooks is an array, not {}", kind(other)));
            }
            None => return Err(format!("{at} has no `hooks` array")),
        };
        let hooks = hooks
            .iter()
            .enumerate()
            .map(|(index, hook)| parse_hook(hook, &format!("{at}.hooks[{index}]"), notes))
            .collect::<Result<Vec<_>, _>>()?;
        parsed.push(Group { matcher, hooks });
    }
    Ok(parsed)
}

fn parse_hook(value: &Value, at: &str, notes: &mut Vec<String>) -> Result<CommandHook, String> {
    let Value::Object(hook) = value else {
        return Err(format!("{at} is an object, not {}", kind(value)));
    };
    match hook.get("type") {
        Some(Value::String(kind)) if kind == "command" => {}
        Some(Value::String(other)) => {
            return Err(format!(
                "{at}: subloop runs only `command` hooks, not `{other}` hooks"
            ));
        }
        _ => return Err(format!("{at} needs \"type\": \"command\"")),
    }
    let command = match hook.get("command") {
        Some(Value::String(command)) if !command.trim().is_empty() => command.clone(),
        Some(Value::String(_)) => return Err(format!("{at}.command is empty")),
        Some(other) => return Err(format!("{at}.command is a string, not {}", kind(other))),
        None => return Err(format!("{at} has no `command`")),
    };
    let timeout = match hook.get("timeout") {
        None | Some(Value::Null) => DEFAULT_HOOK_TIMEOUT,
        Some(Value::Number(secs)) => secs
            .as_f64()
            .filter(|secs| secs.is_finite() && *secs > 0.0 && *secs <= 86_400.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                format!("{at}.timeout is a number of seconds above 0 and at most a day, not {secs}")
            })?,
        Some(other) => {
            return Err(format!(
                "{at}.timeout is a number of seconds, not {}",
                kind(other)
            ));
        }
    };
    let fail_open = flag(hook, "failOpen", at)?;
    if flag(hook, "async", at)? {
        notes.push(format!(
            "{at}: `async` is not supported; the hook runs before the run goes on"
        ));
    }
    if hook.contains_key("if") {
        notes.push(format!(
            "{at}: `if` is not supported; the hook runs wherever its matcher matches"
        ));
    }
    Ok(CommandHook {
        command,
        timeout,
        fail_open,
    })
}

fn flag(hook: &Map<String, Value>, name: &str, at: &str) -> Result<bool, String> {
    match hook.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(value)) => Ok(*value),
        Some(other) => Err(format!("{at}.{name} is a boolean, not {}", kind(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_are_exact_names_or_searched_patterns() {
        let all = Matcher::parse("*");
        assert!(matches!(all, Ok(Matcher::All)));
        let names = Matcher::parse("run_main|read_file").unwrap_or(Matcher::All);
        assert!(names.matches("run_main") && names.matches("read_file"));
        assert!(!names.matches("run_main2") && !names.matches("run"));
        let prefix = Matcher::parse("mcp__").unwrap_or(Matcher::All);
        assert!(
            !prefix.matches("mcp__notes__read"),
            "a bare prefix is a name"
        );
        let server = Matcher::parse("mcp__notes__.*").unwrap_or(Matcher::All);
        assert!(server.matches("mcp__notes__read") && !server.matches("mcp__other__read"));
        let anchored = Matcher::parse("^read").unwrap_or(Matcher::All);
        assert!(anchored.matches("read_file") && !anchored.matches("x_read"));
        assert!(Matcher::parse("(").is_err());
    }

    #[test]
    fn settings_are_checked_whole() {
        let ok = Config::parse(
            r#"{"hooks": {"PreToolUse": [{"matcher": "run_main", "hooks": [{"type": "command", "command": "true", "timeout": 5, "failOpen": true}]}],
                          "Notification": [{"hooks": [{"type": "command", "command": "x"}]}]}, "permissions": {}}"#,
            "test",
        );
        let Ok(config) = ok else {
            panic!("valid settings refused: {ok:?}");
        };
        assert_eq!(config.events.len(), 1);
        assert!(
            config
                .notes
                .iter()
                .any(|note| note.starts_with("Notification"))
        );
        for bad in [
            "[]",
            r#"{"hooks": []}"#,
            r#"{"hooks": {"Stop": {}}}"#,
            r#"{"hooks": {"Stop": [{"hooks": [{"type": "prompt", "prompt": "x"}]}]}}"#,
            r#"{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": " "}]}]}}"#,
            r#"{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x", "timeout": 0}]}]}}"#,
            r#"{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x", "timeout": "5"}]}]}}"#,
            r#"{"hooks": {"PreToolUse": [{"matcher": "[", "hooks": []}]}}"#,
        ] {
            assert!(Config::parse(bad, "test").is_err(), "{bad}");
        }
    }
}
