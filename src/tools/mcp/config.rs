//! MCP server configuration: the `mcpServers` file, the command-line forms,
//! the host's read-only marks, tool names and the server environment.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::McpError;

use crate::tools::split_command;

/// The longest tool name the API accepts.
#[cfg(feature = "mcp")]
pub(crate) const MAX_TOOL_NAME: usize = 64;

/// One configured server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The server's name (`fs` in `mcp__fs__read_text_file`).
    pub name: String,
    /// The program to start.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables set for it (besides `PATH`, `HOME` and the locale).
    pub env: BTreeMap<String, String>,
    /// Tools the host marks read-only (server-side names).
    pub read_only: Vec<String>,
    /// Whether the server's `readOnlyHint` annotations count as the host's mark.
    pub trust_annotations: bool,
}

/// Other keys of the file (other tools' settings) are left alone.
#[derive(Deserialize)]
struct File {
    #[serde(rename = "mcpServers")]
    mcp_servers: BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    read_only: Vec<String>,
    #[serde(default)]
    trust_annotations: bool,
    /// Other agents' way to keep a server configured but off.
    #[serde(default)]
    disabled: bool,
    /// The transport: only `stdio` (the default) is supported.
    #[serde(default, rename = "type")]
    transport: Option<String>,
}

fn check_name(name: &str) -> Result<(), McpError> {
    // No `__`, and no `_` at the end: `mcp__a___x` must name one tool.
    let fits = (1..=40).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !name.contains("__")
        && !name.ends_with('_');
    if fits {
        Ok(())
    } else {
        Err(McpError::BadName(name.to_owned()))
    }
}

impl ServerConfig {
    /// Parses an `mcpServers` file's text; `source_name` names it in errors.
    pub fn parse_file(text: &str, source_name: &str) -> Result<Vec<Self>, McpError> {
        parse_file(text, source_name)
    }

    /// Parses the command-line form `NAME=COMMAND ARGS…` (split without a
    /// shell, as [`crate::tools::RunSettings::split_command`] splits).
    pub fn parse_flag(value: &str) -> Result<Self, McpError> {
        parse_server_flag(value)
    }

    /// Marks `NAME:TOOL,…` read-only in the configured `servers`.
    pub fn apply_read_only(servers: &mut [Self], value: &str) -> Result<(), McpError> {
        apply_read_only(servers, value)
    }

    /// Adds `more` to `servers`, refusing a name configured twice.
    pub fn merge(servers: &mut Vec<Self>, more: Vec<Self>) -> Result<(), McpError> {
        merge(servers, more)
    }
}

/// Parses an `mcpServers` file's text; `source_name` names it in errors.
fn parse_file(text: &str, source_name: &str) -> Result<Vec<ServerConfig>, McpError> {
    let file: File = serde_json::from_str(text).map_err(|err| McpError::Invalid {
        source_name: source_name.to_owned(),
        message: err.to_string(),
    })?;
    file.mcp_servers
        .into_iter()
        .filter(|(_, entry)| !entry.disabled)
        .map(|(name, entry)| {
            check_name(&name)?;
            if let Some(transport) = entry.transport.as_deref().filter(|t| *t != "stdio") {
                return Err(McpError::Invalid {
                    source_name: source_name.to_owned(),
                    message: format!(
                        "server {name}: transport {transport:?} is not supported (only stdio)"
                    ),
                });
            }
            if entry.command.trim().is_empty() {
                return Err(McpError::Invalid {
                    source_name: source_name.to_owned(),
                    message: format!("server {name}: the command is empty"),
                });
            }
            Ok(ServerConfig {
                name,
                command: entry.command,
                args: entry.args,
                env: entry.env,
                read_only: entry.read_only,
                trust_annotations: entry.trust_annotations,
            })
        })
        .collect()
}

/// Parses `--mcp 'NAME=COMMAND ARGS…'` (split without a shell, as `--run-command`).
fn parse_server_flag(value: &str) -> Result<ServerConfig, McpError> {
    let bad = || McpError::BadServerFlag(value.to_owned());
    let (name, line) = value.split_once('=').ok_or_else(bad)?;
    check_name(name)?;
    let words = split_command(line).map_err(|err| McpError::BadServerCommand {
        value: value.to_owned(),
        reason: err.to_string(),
    })?;
    let (command, args) = words.split_first().ok_or_else(bad)?;
    Ok(ServerConfig {
        name: name.to_owned(),
        command: command.clone(),
        args: args.to_vec(),
        env: BTreeMap::new(),
        read_only: Vec::new(),
        trust_annotations: false,
    })
}

/// Applies `--mcp-read-only NAME:TOOL,…` to the configured `servers`.
fn apply_read_only(servers: &mut [ServerConfig], value: &str) -> Result<(), McpError> {
    let bad = || McpError::BadReadOnlyFlag(value.to_owned());
    let (name, tools) = value.split_once(':').ok_or_else(bad)?;
    let server = servers
        .iter_mut()
        .find(|server| server.name == name)
        .ok_or_else(bad)?;
    let tools: Vec<&str> = tools.split(',').map(str::trim).collect();
    if tools.iter().any(|tool| tool.is_empty()) {
        return Err(bad());
    }
    for tool in tools {
        if !server.read_only.iter().any(|known| known == tool) {
            server.read_only.push(tool.to_owned());
        }
    }
    Ok(())
}

/// Adds `more` to `servers`, refusing a name configured twice.
fn merge(servers: &mut Vec<ServerConfig>, more: Vec<ServerConfig>) -> Result<(), McpError> {
    for server in more {
        if servers.iter().any(|known| known.name == server.name) {
            return Err(McpError::Duplicate(server.name));
        }
        servers.push(server);
    }
    Ok(())
}

/// The registered name `mcp__SERVER__TOOL`, or `None` when it does not fit
/// the API's rule `^[a-zA-Z0-9_-]{1,64}$` (such a tool is skipped with a warning).
#[cfg(feature = "mcp")]
pub(crate) fn tool_name(server: &str, tool: &str) -> Option<String> {
    let name = format!("mcp__{server}__{tool}");
    let fits = name.len() <= MAX_TOOL_NAME
        && !tool.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    fits.then_some(name)
}

/// The environment a server starts with: `PATH`, `HOME`, `LANG` and `LC_*`
/// from `parent` (subloop's own environment), then the configured `env`
/// on top. Nothing else — in particular no API key — is passed on.
#[cfg(feature = "mcp")]
pub(crate) fn server_env(
    configured: &BTreeMap<String, String>,
    parent: impl IntoIterator<Item = (String, String)>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = parent
        .into_iter()
        .filter(|(key, _)| {
            matches!(key.as_str(), "PATH" | "HOME" | "LANG") || key.starts_with("LC_")
        })
        .collect();
    env.extend(configured.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mcp_servers_file_is_read_with_the_hosts_marks() {
        let text = r#"{"mcpServers": {
            "fs": {"command": "npx", "args": ["-y", "server-filesystem", "/w"],
                   "env": {"DEBUG": "1"}, "readOnly": ["read_text_file"]},
            "every": {"command": "node", "trustAnnotations": true}
        }}"#;
        let servers = parse_file(text, "mcp.json").unwrap();
        assert_eq!(servers.len(), 2);
        let fs = servers.iter().find(|s| s.name == "fs").unwrap();
        assert_eq!(fs.args, ["-y", "server-filesystem", "/w"]);
        assert_eq!(fs.env.get("DEBUG").map(String::as_str), Some("1"));
        assert_eq!(fs.read_only, ["read_text_file"]);
        assert!(!fs.trust_annotations);
        let every = servers.iter().find(|s| s.name == "every").unwrap();
        assert!(every.trust_annotations && every.args.is_empty());
    }

    #[test]
    fn unusable_files_and_names_are_errors() {
        assert!(matches!(
            parse_file("{}", "x.json"),
            Err(McpError::Invalid { .. })
        ));
        // Other tools' keys are left alone; a disabled server is left out;
        // a transport other than stdio and an ambiguous name are refused.
        let servers = parse_file(
            r#"{"globalShortcut": "x", "mcpServers": {"a": {"command": "x", "disabled": true}, "b": {"command": "y", "type": "stdio"}}}"#,
            "x.json",
        )
        .unwrap();
        assert_eq!(servers.len(), 1);
        assert!(
            parse_file(
                r#"{"mcpServers": {"a": {"command": "x", "type": "sse"}}}"#,
                "x.json"
            )
            .is_err()
        );
        assert!(matches!(
            parse_file(r#"{"mcpServers": {"a_": {"command": "x"}}}"#, "x.json"),
            Err(McpError::BadName(_))
        ));
        assert!(matches!(
            parse_server_flag("t=python3 \"open"),
            Err(McpError::BadServerCommand { .. })
        ));
        assert!(matches!(
            parse_file(r#"{"mcpServers": {"a__b": {"command": "x"}}}"#, "x.json"),
            Err(McpError::BadName(_))
        ));
        assert!(matches!(
            parse_file(r#"{"mcpServers": {"a": {"command": " "}}}"#, "x.json"),
            Err(McpError::Invalid { .. })
        ));
    }

    #[test]
    fn the_command_line_forms_parse() {
        let mut servers = vec![parse_server_flag("t=python3 'my server.py' --slow").unwrap()];
        assert_eq!(servers[0].command, "python3");
        assert_eq!(servers[0].args, ["my server.py", "--slow"]);
        assert!(parse_server_flag("python3 server.py").is_err());
        assert!(parse_server_flag("t=").is_err());
        apply_read_only(&mut servers, "t:look,peek").unwrap();
        assert_eq!(servers[0].read_only, ["look", "peek"]);
        assert!(apply_read_only(&mut servers, "other:look").is_err());
        assert!(apply_read_only(&mut servers, "t:").is_err());
        let again = vec![parse_server_flag("t=x").unwrap()];
        assert!(matches!(
            merge(&mut servers, again),
            Err(McpError::Duplicate(name)) if name == "t"
        ));
    }

    #[test]
    #[cfg(feature = "mcp")]
    fn tool_names_follow_the_api_rule() {
        assert_eq!(
            tool_name("fs", "read_text_file").as_deref(),
            Some("mcp__fs__read_text_file")
        );
        assert_eq!(tool_name("fs", "has space"), None);
        assert_eq!(tool_name("fs", "dot.ted"), None);
        assert_eq!(tool_name("fs", &"x".repeat(60)), None);
    }

    #[test]
    #[cfg(feature = "mcp")]
    fn servers_get_no_api_key() {
        let parent = [
            ("PATH", "/bin"),
            ("HOME", "/home/u"),
            ("LC_ALL", "C"),
            ("ANTHROPIC_API_KEY", "secret"),
            ("OPENAI_API_KEY", "secret"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let configured = BTreeMap::from([("DEBUG".to_owned(), "1".to_owned())]);
        let env = server_env(&configured, parent);
        let keys: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(keys, ["DEBUG", "HOME", "LC_ALL", "PATH"]);
    }
}
