//! MCP against the official servers (`@modelcontextprotocol/server-filesystem`
//! and `@modelcontextprotocol/server-everything`, Node): `.ci/run` installs
//! them with npm into `${XDG_CACHE_HOME:-$HOME/.cache}/subloop-mcp` (or
//! `SUBLOOP_MCP_SERVERS` names their `node_modules/.bin`). Without them these
//! tests say they were skipped (and fail under `SUBLOOP_NO_SKIP`).
//!
//! A scripted parent delegates to a child whose whitelist holds
//! `mcp__fs__read_text_file` (marked read-only by the host), which reads
//! `main.py` through it; `write_file` creates nothing under `--decision
//! deny` and the file under `allow`; `server-everything`'s tools are listed
//! and called, one returning an image and one structured content.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::TempDir;
use serde_json::{Value, json};

/// The servers' `node_modules/.bin`, when they are installed.
fn servers() -> Option<PathBuf> {
    let dir = match std::env::var_os("SUBLOOP_MCP_SERVERS") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache"))
                })?;
            cache.join("subloop-mcp/node_modules/.bin")
        }
    };
    let found = dir.join("mcp-server-filesystem").is_file()
        && dir.join("mcp-server-everything").is_file()
        && Command::new("node")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
    if found {
        Some(dir)
    } else {
        common::skipped(format!(
            "the official MCP servers are not installed in {} (npm install --prefix …/subloop-mcp @modelcontextprotocol/server-filesystem @modelcontextprotocol/server-everything; .ci/run does)",
            dir.display()
        ));
        None
    }
}

fn use_block(id: &str, name: &str, input: Value) -> Value {
    json!({"content": [{"type": "tool_use", "id": id, "name": name, "input": input}], "stop_reason": "tool_use"})
}

fn answer(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"})
}

fn run(ws: &TempDir, dir: &TempDir, script: Value, flags: &[&str]) -> Output {
    let path = dir.write("script.json", script.to_string());
    Command::new(common::bin())
        .args(["run", "--json", "--workspace"])
        .arg(ws.path())
        .arg("--script")
        .arg(&path)
        .args(flags)
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

fn parsed(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|err| {
        panic!(
            "{err}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A config file for the filesystem server on `ws`, `read_text_file` marked read-only.
fn fs_config(bin: &std::path::Path, ws: &TempDir, dir: &TempDir) -> PathBuf {
    dir.write(
        "mcp.json",
        json!({"mcpServers": {"fs": {
            "command": bin.join("mcp-server-filesystem"),
            "args": [ws.path()],
            "readOnly": ["read_text_file"]
        }}})
        .to_string(),
    )
}

#[test]
fn a_child_reads_main_py_through_the_filesystem_servers_read_only_tool() {
    let Some(bin) = servers() else { return };
    let (ws, dir) = (TempDir::new("mcp-fs"), TempDir::new("mcp-fs-run"));
    ws.write("main.py", "print(6 * 7)\n");
    let config = fs_config(&bin, &ws, &dir);
    let main_py = ws.path().join("main.py");
    let script = json!({
        "parent": [use_block("p1", "task", json!({"task": "Read main.py"})), answer("the child read it")],
        "children": [[
            use_block("c1", "mcp__fs__read_text_file", json!({"path": main_py})),
            answer("main.py prints 6 * 7")
        ]]
    });
    let out = run(
        &ws,
        &dir,
        script,
        &[
            "--decision",
            "deny",
            "--mcp-config",
            config.to_str().expect("utf-8"),
            "--child-tools",
            "mcp__fs__read_text_file",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = parsed(&out);
    let tool = &report["children"][0]["tools"][0];
    assert_eq!(tool["name"], "mcp__fs__read_text_file", "{report}");
    assert_eq!(tool["decision"], "not_required", "{report}");
    assert_eq!(tool["content"], "print(6 * 7)\n", "{report}");
    assert_eq!(
        report["tools"][0]["content"],
        r#"{"status":"answered","summary":"main.py prints 6 * 7","calls":2}"#
    );
    // write_file is not read-only: a child may not hold it.
    let out = run(
        &ws,
        &dir,
        json!({"parent": [answer("x")]}),
        &[
            "--mcp-config",
            config.to_str().expect("utf-8"),
            "--child-tools",
            "mcp__fs__write_file",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn write_file_runs_only_when_allowed() {
    let Some(bin) = servers() else { return };
    for (decision, written) in [("deny", false), ("allow", true)] {
        let (ws, dir) = (
            TempDir::new("mcp-fs-write"),
            TempDir::new("mcp-fs-write-run"),
        );
        let config = fs_config(&bin, &ws, &dir);
        let target = ws.path().join("new.txt");
        let script = json!({"parent": [
            use_block("w1", "mcp__fs__write_file", json!({"path": target, "content": "written by the model"})),
            answer("done"),
        ]});
        let out = run(
            &ws,
            &dir,
            script,
            &[
                "--decision",
                decision,
                "--mcp-config",
                config.to_str().expect("utf-8"),
            ],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(target.exists(), written, "{decision}");
        let report = parsed(&out);
        if written {
            assert_eq!(
                std::fs::read_to_string(&target).expect("file"),
                "written by the model"
            );
            assert_eq!(report["tools"][0]["decision"], "allowed");
        } else {
            assert_eq!(
                report["tools"][0]["content"],
                "not executed: permission denied"
            );
        }
    }
}

#[test]
fn server_everything_tools_are_listed_and_called() {
    let Some(bin) = servers() else { return };
    let (ws, dir) = (TempDir::new("mcp-ev"), TempDir::new("mcp-ev-run"));
    let spec = format!("ev={}", bin.join("mcp-server-everything").display());
    let script = json!({"parent": [
        {"content": [
            {"type": "tool_use", "id": "a", "name": "mcp__ev__echo", "input": {"message": "hello"}},
            {"type": "tool_use", "id": "b", "name": "mcp__ev__get-tiny-image", "input": {}},
            {"type": "tool_use", "id": "c", "name": "mcp__ev__get-structured-content", "input": {"location": "Chicago"}},
            {"type": "tool_use", "id": "d", "name": "mcp__ev__get-sum", "input": {"a": 2, "b": 3}}
        ], "stop_reason": "tool_use"},
        answer("done"),
    ]});
    let out = run(&ws, &dir, script, &["--decision", "allow", "--mcp", &spec]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("[mcp] server ev: ") && stderr.contains("mcp__ev__get-tiny-image"),
        "{stderr}"
    );
    let report = parsed(&out);
    let content = |i: usize| {
        report["tools"][i]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(content(0), "Echo: hello");
    assert!(content(1).contains("[image: image/png, "), "{}", content(1));
    let weather: Value =
        serde_json::from_str(&content(2)).expect("structured content as JSON text");
    assert!(weather.get("temperature").is_some(), "{weather}");
    assert!(content(3).contains('5'), "{}", content(3));
    for i in 0..4 {
        assert_eq!(report["tools"][i]["is_error"], false, "{report}");
    }
}
