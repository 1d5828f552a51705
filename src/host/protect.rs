//! What a program started by `run_main` may not write in the workspace
//! because code outside the sandbox reads or runs it: the host's own
//! configuration files, the script, the files hook and MCP server commands
//! name, and the folder of an interpreter's script (Python puts it first
//! on its module path). And the commands refused outright: an interpreter
//! whose module path starts at the working directory, which is the
//! workspace.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::Settings;
use subloop::tools::sandbox::{Sandbox, SandboxPolicy};

/// A hook or MCP server command that would run code a confined program can
/// plant: refused when a run starts at `workspace-write`.
#[derive(Debug, Error)]
#[error(
    "the {what} `{command}` runs {interpreter} with the workspace on its module path ({why}); \
     a program run_main starts may write modules there, which would then run outside the \
     sandbox. {fix}"
)]
#[non_exhaustive]
pub struct PlantableHook {
    /// `hook` or `MCP server NAME`.
    pub what: String,
    /// The command line.
    pub command: String,
    /// The interpreter named.
    pub interpreter: String,
    /// Why its module path holds the workspace.
    pub why: &'static str,
    /// What to do instead.
    pub fix: &'static str,
}

/// The sandbox policy of `settings` with every file above protected.
pub(super) fn policy(settings: &Settings) -> SandboxPolicy {
    let mut policy = settings.sandbox.clone();
    for path in protected(settings) {
        policy = policy.protect(path);
    }
    policy
}

/// The paths a program may not write (those outside the workspace are
/// dropped by the policy: nothing outside is writable anyway).
fn protected(settings: &Settings) -> Vec<PathBuf> {
    let workspace = &settings.workspace;
    let mut paths: Vec<PathBuf> = settings.config_files.clone();
    paths.extend(settings.script.clone());
    let mut lines: Vec<Vec<String>> = settings.hooks.commands().into_iter().map(words).collect();
    for server in &settings.mcp {
        let mut line = vec![server.command.clone()];
        line.extend(server.args.iter().cloned());
        lines.push(line);
    }
    for line in &lines {
        for (index, word) in line.iter().enumerate() {
            let Some(path) = named_file(word, workspace) else {
                continue;
            };
            // The script of an interpreter: its folder is on the module
            // path (Python), so all of it is protected.
            let after_interpreter = index > 0
                && line
                    .get(..index)
                    .is_some_and(|before| before.iter().any(|word| interpreter(word).is_some()));
            if after_interpreter && let Some(folder) = path.parent() {
                paths.push(folder.to_path_buf());
            }
            paths.push(path);
        }
    }
    paths
}

/// The command lines a run at `workspace-write` refuses to start with.
pub(super) fn refuse_plantable(settings: &Settings) -> Result<(), PlantableHook> {
    if settings.sandbox.level() != Sandbox::WorkspaceWrite {
        return Ok(());
    }
    for command in settings.hooks.commands() {
        check("hook", command, &words(command))?;
    }
    for server in &settings.mcp {
        let mut line = vec![server.command.clone()];
        line.extend(server.args.iter().cloned());
        let has_safe_env = server
            .env
            .iter()
            .any(|(name, value)| name == "PYTHONSAFEPATH" && !value.is_empty());
        if !has_safe_env {
            check(
                &format!("MCP server {}", server.name),
                &line.join(" "),
                &line,
            )?;
        }
    }
    Ok(())
}

/// Refuses `line` when an interpreter in it loads modules from the
/// working directory (the workspace).
fn check(what: &str, command: &str, line: &[String]) -> Result<(), PlantableHook> {
    for (index, word) in line.iter().enumerate() {
        let Some(kind) = interpreter(word) else {
            continue;
        };
        let rest = line.get(index + 1..).unwrap_or_default();
        let refuse = |why: &'static str, fix: &'static str| PlantableHook {
            what: what.to_owned(),
            command: command.to_owned(),
            interpreter: word.clone(),
            why,
            fix,
        };
        match kind {
            Interpreter::Python => {
                let safe = line.iter().any(|word| word.starts_with("PYTHONSAFEPATH="))
                    || rest
                        .iter()
                        .take_while(|word| word.starts_with('-'))
                        .any(|flag| short_flags(flag).any(|c| c == 'P' || c == 'I'));
                let runs_script =
                    rest.iter()
                        .find(|word| !word.starts_with('-'))
                        .is_some_and(|_| {
                            !rest
                                .iter()
                                .take_while(|word| word.starts_with('-'))
                                .any(|flag| short_flags(flag).any(|c| c == 'c' || c == 'm'))
                        });
                if !safe && !runs_script {
                    return Err(refuse(
                        "with -c, -m or a program on stdin, Python puts the working directory first",
                        "Give it -P (or -I, or PYTHONSAFEPATH=1), or a script file.",
                    ));
                }
            }
            Interpreter::Node => {
                let evaluates = rest
                    .iter()
                    .take_while(|word| word.starts_with('-'))
                    .any(|flag| matches!(flag.as_str(), "-e" | "--eval" | "-p" | "--print"));
                if evaluates || rest.is_empty() {
                    return Err(refuse(
                        "code given with -e or on stdin resolves require() from the working directory",
                        "Give it a script file outside the workspace.",
                    ));
                }
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Interpreter {
    Python,
    Node,
}

/// The interpreter `word` starts (by its file name), if it is one whose
/// module path can hold the working directory.
fn interpreter(word: &str) -> Option<Interpreter> {
    let name = Path::new(word).file_name()?.to_str()?;
    if name.starts_with("python") || name.starts_with("pypy") {
        Some(Interpreter::Python)
    } else if name == "node" || name == "nodejs" {
        Some(Interpreter::Node)
    } else {
        None
    }
}

/// The one-letter flags of `-xyz` (none for `--long` flags).
fn short_flags(flag: &str) -> impl Iterator<Item = char> + '_ {
    flag.strip_prefix('-')
        .filter(|rest| !rest.starts_with('-'))
        .unwrap_or_default()
        .chars()
}

/// The words of a shell command line: split at blanks and shell operators,
/// quotes removed (enough to find the files it names; nothing is run).
fn words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    for c in command.chars() {
        match (quote, c) {
            (Some(open), c) if c == open => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => quote = Some(c),
            (None, c) if c.is_whitespace() || ";&|()<>`".contains(c) => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            (None, c) => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// The file `word` names, when it names one that exists (absolute, or
/// relative to the workspace, where hooks and servers start); `$VAR/…`
/// of the workspace variables is the workspace.
fn named_file(word: &str, workspace: &Path) -> Option<PathBuf> {
    let word = word.split_once('=').map_or(word, |(_, value)| value);
    let word = [
        "$CLAUDE_PROJECT_DIR",
        "${CLAUDE_PROJECT_DIR}",
        "$SUBLOOP_WORKSPACE",
        "${SUBLOOP_WORKSPACE}",
    ]
    .iter()
    .find_map(|var| word.strip_prefix(var).map(|rest| format!(".{rest}")))
    .unwrap_or_else(|| word.to_owned());
    if word.is_empty() || word.starts_with('-') {
        return None;
    }
    let path = workspace.join(&word);
    path.symlink_metadata().is_ok().then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Vec<String> {
        words(text)
    }

    #[test]
    fn python_with_c_or_m_is_refused_unless_safe_path() {
        for bad in [
            "python3 -c 'import json'",
            "/usr/bin/python3 -m json.tool",
            "echo x | python3",
            "python3 -u -c 'print(1)'",
        ] {
            assert!(check("hook", bad, &line(bad)).is_err(), "{bad}");
        }
        for good in [
            "python3 -P -c 'import json'",
            "python3 -I -m json.tool",
            "PYTHONSAFEPATH=1 python3 -c 'import json'",
            "python3 /opt/hooks/guard.py",
            "./hooks/guard.sh",
            "jq .tool_name",
        ] {
            assert!(check("hook", good, &line(good)).is_ok(), "{good}");
        }
        let err = check("hook", "python3 -c x", &line("python3 -c x"))
            .err()
            .map(|err| err.to_string())
            .unwrap_or_default();
        assert!(err.contains("-P"), "{err}");
    }

    #[test]
    fn node_eval_is_refused() {
        assert!(check("hook", "node -e 'x'", &line("node -e 'x'")).is_err());
        assert!(check("hook", "node /opt/h.js", &line("node /opt/h.js")).is_ok());
    }

    #[test]
    fn words_split_like_a_shell_for_paths() {
        assert_eq!(
            words("sh ./hooks/a.sh && python3 'hooks/b c.py' >/dev/null"),
            ["sh", "./hooks/a.sh", "python3", "hooks/b c.py", "/dev/null"]
        );
    }
}
