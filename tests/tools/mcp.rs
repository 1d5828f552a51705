//! MCP tool servers end to end, against the suite's own server
//! (`tests/mcp_server.py`, python3, no network): the tools listed across
//! pages and registered as `mcp__t__TOOL`, calls through the permission gate
//! under allow / deny / ask (the side effect happens only when allowed), a
//! child using a host-marked read-only tool and refused one that is not,
//! results of every content kind, a per-call timeout that tells the server
//! to cancel, a server that exits mid-run, a server that cannot start, the
//! server's environment, no server left after a `SIGKILL` of subloop, and
//! a server started with no inherited descriptor, no capability and
//! `no_new_privs`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::TempDir;
use serde_json::{Value, json};

/// The test server, working in `ws`.
fn server(ws: &TempDir) -> String {
    format!(
        "t=python3 {}/tests/mcp_server.py {}",
        env!("CARGO_MANIFEST_DIR"),
        ws.path().display()
    )
}

fn have_python() -> bool {
    let found = Command::new("python3")
        .arg("-c")
        .arg("import json, threading")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        common::skipped("python3 is not installed (the test MCP server is a python3 script)");
    }
    found
}

fn workspace() -> TempDir {
    let ws = TempDir::new("mcp");
    ws.write("main.py", "print(6 * 7)\n");
    ws.write("expected.txt", "42\n");
    ws
}

fn use_block(id: &str, name: &str, input: Value) -> Value {
    json!({"content": [{"type": "tool_use", "id": id, "name": name, "input": input}], "stop_reason": "tool_use"})
}

fn answer(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"})
}

/// `subloop run` on `script` in `ws` with the test server and `flags`.
fn run(ws: &TempDir, dir: &TempDir, script: Value, flags: &[&str]) -> Output {
    let path = dir.write("script.json", script.to_string());
    let server = server(ws);
    let mut args = vec![
        "run",
        "--json",
        "--workspace",
        ws.path().to_str().expect("utf-8"),
        "--script",
        path.to_str().expect("utf-8"),
        "--mcp",
        &server,
    ];
    args.extend_from_slice(flags);
    Command::new(common::bin())
        .args(&args)
        .env("ANTHROPIC_API_KEY", "sk-ant-must-not-reach-the-server")
        .stdin(Stdio::null())
        .output()
        .expect("run subloop")
}

/// The lines of a trace, as JSON.
fn trace_lines(trace: &Path) -> Vec<Value> {
    std::fs::read_to_string(trace)
        .expect("trace")
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("json"))
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn parsed(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}\n{}", text(&out.stdout), text(&out.stderr)))
}

/// `(name, decision, is_error, content)` of the report's parent tools.
fn tools(report: &Value) -> Vec<(String, String, bool, String)> {
    report["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|tool| {
            (
                tool["name"].as_str().unwrap_or_default().to_owned(),
                tool["decision"].as_str().unwrap_or_default().to_owned(),
                tool["is_error"].as_bool().unwrap_or_default(),
                tool["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn tools_are_listed_across_pages_and_every_result_kind_reaches_the_model() {
    if !have_python() {
        return;
    }
    let (ws, dir) = (workspace(), TempDir::new("mcp-run"));
    let trace = dir.path().join("trace.jsonl");
    let script = json!({"parent": [
        use_block("a", "mcp__t__look", json!({"text": "hi"})),
        {"content": [
            {"type": "tool_use", "id": "b", "name": "mcp__t__picture", "input": {}},
            {"type": "tool_use", "id": "c", "name": "mcp__t__structured", "input": {}},
            {"type": "tool_use", "id": "d", "name": "mcp__t__fail", "input": {}},
            {"type": "tool_use", "id": "e", "name": "mcp__t__look", "input": {"text": 5}}
        ], "stop_reason": "tool_use"},
        answer("done"),
    ]});
    let out = run(
        &ws,
        &dir,
        script,
        &[
            "--decision",
            "deny",
            "--trace",
            trace.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    // Nine tools on three pages; the one whose name breaks the API's rule is skipped, with a warning.
    assert!(err.contains("[mcp] server t: 10 tool(s): mcp__t__look, mcp__t__touch, mcp__t__slow, mcp__t__crash, mcp__t__picture, mcp__t__structured, mcp__t__fail, mcp__t__change, mcp__t__noise, mcp__t__hangchange"), "{err}");
    assert!(err.contains("tool \"has space\" skipped"), "{err}");
    assert!(
        err.contains("tool stringy skipped: its inputSchema is not of type object"),
        "{err}"
    );
    let first: Value = trace_lines(&trace)
        .into_iter()
        .find(|line| line["kind"] == "request")
        .expect("a request");
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        offered.contains(&"mcp__t__change") && offered.contains(&"read_file"),
        "{offered:?}"
    );
    // The schema goes to the model unchanged (`anyOf` included).
    let look = first["tool_definitions"]
        .as_array()
        .expect("definitions")
        .iter()
        .find(|d| d["name"] == "mcp__t__look")
        .expect("look");
    assert_eq!(
        look["input_schema"]["anyOf"],
        json!([{"required": ["text"]}])
    );
    let report = parsed(&out);
    // --json lists the servers and their tools; the trace records the start.
    assert_eq!(report["mcp_servers"][0]["name"], "t", "{report}");
    assert_eq!(
        report["mcp_servers"][0]["tools"].as_array().map(Vec::len),
        Some(10)
    );
    let started = trace_lines(&trace)
        .into_iter()
        .find(|line| line["kind"] == "mcp_server")
        .expect("an mcp_server line");
    assert_eq!(
        (&started["server"], &started["event"]),
        (&json!("t"), &json!("started"))
    );
    assert_eq!(started["tools"][0], "mcp__t__look");
    let got = tools(&report);
    let row = |name: &str, decision: &str, error: bool, content: &str| {
        (
            name.to_owned(),
            decision.to_owned(),
            error,
            content.to_owned(),
        )
    };
    // Not marked read-only: they pass the gate, which denies here; a call
    // whose arguments fail the schema is refused before the gate.
    assert_eq!(
        got[0],
        row(
            "mcp__t__look",
            "denied",
            true,
            "not executed: permission denied"
        ),
        "{got:?}"
    );
    assert_eq!(got[4].1, "invalid", "{got:?}");
    // Under allow each kind of content becomes text.
    let out = run(
        &ws,
        &dir,
        json!({"parent": [
            {"content": [
                {"type": "tool_use", "id": "b", "name": "mcp__t__picture", "input": {}},
                {"type": "tool_use", "id": "c", "name": "mcp__t__structured", "input": {}},
                {"type": "tool_use", "id": "d", "name": "mcp__t__fail", "input": {}},
                {"type": "tool_use", "id": "f", "name": "mcp__t__missing", "input": {}}
            ], "stop_reason": "tool_use"},
            answer("done"),
        ]}),
        &["--decision", "allow"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let got = tools(&parsed(&out));
    assert_eq!(
        got,
        vec![
            row(
                "mcp__t__picture",
                "allowed",
                false,
                "[image: image/png, 5 bytes]"
            ),
            row("mcp__t__structured", "allowed", false, "{\"sum\":3}"),
            row("mcp__t__fail", "allowed", true, "it failed"),
            row(
                "mcp__t__missing",
                "unregistered",
                true,
                "not executed: unregistered tool mcp__t__missing"
            ),
        ]
    );
    // The server got PATH, HOME and the locale, never the API key.
    let env = std::fs::read_to_string(ws.path().join("mcp-env.txt")).expect("env");
    assert!(!env.contains("ANTHROPIC_API_KEY"), "{env}");
    assert!(env.lines().any(|name| name == "PATH"), "{env}");
}

#[test]
fn a_tool_with_a_side_effect_runs_only_when_the_gate_allows_it() {
    if !have_python() {
        return;
    }
    for (decision, runs) in [("allow", true), ("deny", false), ("ask", false)] {
        let (ws, dir) = (workspace(), TempDir::new("mcp-gate"));
        let script = json!({"parent": [
            use_block("a", "mcp__t__touch", json!({"name": "marker.txt"})),
            answer("done"),
        ]});
        let out = run(&ws, &dir, script, &["--decision", decision]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{decision}: {}",
            text(&out.stderr)
        );
        assert_eq!(ws.path().join("marker.txt").exists(), runs, "{decision}");
        let got = tools(&parsed(&out));
        if runs {
            assert_eq!(got[0].3, "touched marker.txt");
        } else {
            assert_eq!(got[0].3, "not executed: permission denied", "{decision}");
        }
        if decision == "ask" {
            // The prompt names the server, the tool and the arguments.
            let err = text(&out.stderr);
            assert!(
                err.contains("MCP server t tool touch with arguments {\"name\":\"marker.txt\"}"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_child_may_use_a_host_marked_read_only_tool_and_no_other() {
    if !have_python() {
        return;
    }
    let (ws, dir) = (workspace(), TempDir::new("mcp-child"));
    let script = json!({
        "parent": [use_block("p1", "task", json!({"task": "look at hi"})), answer("done")],
        "children": [[use_block("c1", "mcp__t__look", json!({"text": "from the child"})), answer("the child looked")]]
    });
    let out = run(
        &ws,
        &dir,
        script.clone(),
        &[
            "--decision",
            "deny",
            "--mcp-read-only",
            "t:look",
            "--child-tools",
            "read_file,mcp__t__look",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = parsed(&out);
    let child = &report["children"][0];
    assert_eq!(child["tools"][0]["name"], "mcp__t__look", "{report}");
    assert_eq!(child["tools"][0]["decision"], "not_required", "{report}");
    assert_eq!(
        child["tools"][0]["content"], "looked: from the child",
        "{report}"
    );
    // Not marked read-only (the server's readOnlyHint is not the host's
    // decision unless the host trusts annotations): a setup error.
    for flags in [
        &["--child-tools", "read_file,mcp__t__look"][..],
        &[
            "--child-tools",
            "mcp__t__touch",
            "--mcp-read-only",
            "t:look",
        ][..],
        &["--child-tools", "mcp__t__nothing"][..],
    ] {
        let out = run(&ws, &dir, script.clone(), flags);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flags:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("child whitelist names"), "{err}");
    }
    // With trustAnnotations the server's readOnlyHint counts.
    let config = dir.write(
        "mcp.json",
        json!({"mcpServers": {"u": {
            "command": "python3",
            "args": [format!("{}/tests/mcp_server.py", env!("CARGO_MANIFEST_DIR")), ws.path()],
            "trustAnnotations": true
        }}})
        .to_string(),
    );
    let script = json!({
        "parent": [use_block("p1", "task", json!({"task": "look"})), answer("done")],
        "children": [[use_block("c1", "mcp__u__look", json!({"text": "x"})), answer("ok")]]
    });
    let out = run(
        &ws,
        &dir,
        script,
        &[
            "--mcp-config",
            config.to_str().expect("utf-8"),
            "--child-tools",
            "mcp__u__look",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        parsed(&out)["children"][0]["tools"][0]["content"],
        "looked: x"
    );
}

#[test]
fn a_slow_call_times_out_and_the_server_is_told_to_cancel_it() {
    if !have_python() {
        return;
    }
    let (ws, dir) = (workspace(), TempDir::new("mcp-slow"));
    let script = json!({"parent": [
        use_block("a", "mcp__t__slow", json!({"seconds": 30})),
        use_block("b", "mcp__t__slow", json!({"seconds": 0.3})),
        answer("done"),
    ]});
    let started = Instant::now();
    let out = run(
        &ws,
        &dir,
        script,
        &["--decision", "allow", "--mcp-timeout", "1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the timeout did not stop the call"
    );
    let got = tools(&parsed(&out));
    assert_eq!(
        (got[0].2, got[0].3.as_str()),
        (
            true,
            "mcp__t__slow: MCP server t did not answer within 1 s; the call was cancelled"
        )
    );
    assert_eq!(got[1].3, "slept");
    // notifications/cancelled reached the server.
    assert!(
        ws.path().join("mcp-cancelled.txt").exists(),
        "the server was not told to cancel"
    );
}

#[test]
fn a_server_that_exits_mid_run_answers_not_executed_and_the_run_goes_on() {
    if !have_python() {
        return;
    }
    let (ws, dir) = (workspace(), TempDir::new("mcp-exit"));
    let script = json!({"parent": [
        use_block("a", "mcp__t__crash", json!({})),
        use_block("b", "mcp__t__look", json!({"text": "still there?"})),
        use_block("c", "read_file", json!({"path": "expected.txt"})),
        answer("done"),
    ]});
    let trace = dir.path().join("trace.jsonl");
    let out = run(
        &ws,
        &dir,
        script,
        &[
            "--decision",
            "allow",
            "--trace",
            trace.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The exit is on record, with the server's last stderr lines.
    let exit = trace_lines(&trace)
        .into_iter()
        .find(|line| line["kind"] == "mcp_server" && line["event"] == "exited")
        .expect("an exited line");
    assert_eq!(
        exit["how"],
        "exit status: 3; its last stderr lines: about to crash: goodbye"
    );
    let report = parsed(&out);
    let got = tools(&report);
    let exited = "not executed: MCP server t exited (exit status: 3); its last stderr lines: about to crash: goodbye";
    assert_eq!(got[0].3, exited, "{got:?}");
    assert_eq!(got[1].3, exited, "{got:?}");
    assert_eq!(got[2].3, "42\n");
    assert_eq!(report["status"], "answered");
}

#[test]
fn a_server_that_cannot_start_stops_the_run_before_any_model_call() {
    if !have_python() {
        return;
    }
    let (ws, dir) = (workspace(), TempDir::new("mcp-nostart"));
    let script = dir.write(
        "script.json",
        json!({"parent": [answer("never")]}).to_string(),
    );
    for (spec, says) in [
        (
            "t=subloop-no-such-program-xyz",
            "cannot start `subloop-no-such-program-xyz`",
        ),
        (
            "t=python3 -c 'import sys; sys.stderr.write(\"no luck\\n\"); sys.exit(4)'",
            "no luck",
        ),
        ("t=sleep 30", "did not start within 1 s"),
    ] {
        let started = Instant::now();
        let out = Command::new(common::bin())
            .args([
                "run",
                "--workspace",
                ws.path().to_str().expect("utf-8"),
                "--script",
            ])
            .arg(&script)
            .args(["--mcp", spec, "--mcp-timeout", "1"])
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{spec}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{spec}: {err}");
        assert!(!err.contains("model call"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "{spec}");
    }
    // Bad configuration is a usage error too.
    for flags in [
        &["--mcp", "no-equals-sign"][..],
        &["--mcp", "a__b=python3"][..],
        &["--mcp-read-only", "nobody:look"][..],
        &["--mcp-config", "/nonexistent/mcp.json"][..],
    ] {
        let out = Command::new(common::bin())
            .args([
                "run",
                "--workspace",
                ws.path().to_str().expect("utf-8"),
                "--script",
            ])
            .arg(&script)
            .args(flags)
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flags:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn ctrl_c_cancels_a_call_in_flight_and_tells_the_server() {
    if !have_python() {
        return;
    }
    let (ws, dir) = (workspace(), TempDir::new("mcp-ctrl-c"));
    let script: PathBuf = dir.write(
        "script.json",
        json!({"parent": [use_block("a", "mcp__t__slow", json!({"seconds": 60})), answer("never")]}).to_string(),
    );
    let child = Command::new(common::bin())
        .args([
            "run",
            "--json",
            "--decision",
            "allow",
            "--workspace",
            ws.path().to_str().expect("utf-8"),
            "--script",
        ])
        .arg(&script)
        .args(["--mcp", &server(&ws), "--mcp-timeout", "120"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    read_pid(&ws.path().join("mcp-server.pid"), Duration::from_secs(20))
        .expect("the server started");
    std::thread::sleep(Duration::from_millis(700));
    let started = Instant::now();
    // SAFETY: signals the child we spawned.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let out = child.wait_with_output().expect("wait");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "Ctrl-C did not end the call"
    );
    let report = parsed(&out);
    assert_eq!(report["status"], "cancelled", "{report}");
    assert!(
        report["tools"][0]["content"]
            .as_str()
            .is_some_and(|text| text.starts_with(
                "not executed: the run was cancelled while MCP server t was running slow"
            )),
        "{report}"
    );
    assert!(
        ws.path().join("mcp-cancelled.txt").exists(),
        "notifications/cancelled did not reach the server"
    );
}

#[test]
fn a_changed_tool_list_is_offered_and_dispatched_from_the_next_turn_on() {
    if !have_python() {
        return;
    }
    let (ws, dir) = (workspace(), TempDir::new("mcp-changed"));
    let trace = dir.path().join("trace.jsonl");
    let script = json!({"parent": [
        use_block("a", "mcp__t__extra", json!({})),
        use_block("b", "mcp__t__change", json!({})),
        use_block("c", "mcp__t__extra", json!({})),
        answer("done"),
    ]});
    let out = run(
        &ws,
        &dir,
        script,
        &[
            "--decision",
            "allow",
            "--trace",
            trace.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = parsed(&out);
    let got = tools(&report);
    // Before the change `extra` is not there; after it, it is offered and runs.
    assert_eq!(got[0].1, "unregistered", "{got:?}");
    assert_eq!(got[1].3, "changed");
    assert_eq!(
        (got[2].1.as_str(), got[2].3.as_str()),
        ("allowed", "extra ran"),
        "{got:?}"
    );
    assert!(
        report["warnings"]
            .to_string()
            .contains("the tools changed: now "),
        "{report}"
    );
    // The trace carries the new definitions, and the run checks clean.
    let lines: Vec<Value> = trace_lines(&trace);
    let requests: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "request").collect();
    assert!(!requests[1]["tools"].to_string().contains("mcp__t__extra"));
    assert!(requests[2]["tools"].to_string().contains("mcp__t__extra"));
    assert!(
        requests[2]["tool_definitions"]
            .to_string()
            .contains("Added later.")
    );
    assert!(
        requests[3]["tool_definitions"].is_null(),
        "definitions again only when they change"
    );
    let out = Command::new(common::bin())
        .args(["view", "--check"])
        .arg(&trace)
        .output()
        .expect("view");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    // The page's full request of call 3 offers that call's own tools.
    let page = dir.path().join("page.html");
    let out = Command::new(common::bin())
        .arg("view")
        .arg(&trace)
        .arg("-o")
        .arg(&page)
        .output()
        .expect("view -o");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let html = std::fs::read_to_string(&page).expect("page");
    let start = html.find("id=\"subloop-run\">").expect("data") + 17;
    let end = start + html[start..].find("</script>").expect("end");
    let data: Value = serde_json::from_str(&html[start..end]).expect("json");
    let calls = &data["lanes"][0]["calls"];
    assert!(calls[1]["own_tools"].is_null());
    assert!(
        calls[2]["own_tools"].to_string().contains("mcp__t__extra"),
        "{}",
        calls[2]
    );
}

#[test]
fn a_relisting_that_never_answers_keeps_the_tools_and_stderr_noise_is_harmless() {
    if !have_python() {
        return;
    }
    let (ws, dir) = (workspace(), TempDir::new("mcp-hanglist"));
    let script = json!({"parent": [
        use_block("a", "mcp__t__noise", json!({})),
        use_block("b", "mcp__t__hangchange", json!({})),
        use_block("c", "mcp__t__look", json!({"text": "still"})),
        answer("done"),
    ]});
    let started = Instant::now();
    let out = run(
        &ws,
        &dir,
        script,
        &["--decision", "allow", "--mcp-timeout", "2"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the re-listing was not bounded"
    );
    let report = parsed(&out);
    let got = tools(&report);
    // Bytes that are not UTF-8 and a 200 kB stderr line did not end the server.
    assert_eq!(got[0].3, "noisy", "{got:?}");
    assert_eq!(got[2].3, "looked: still", "{got:?}");
    assert!(
        report["warnings"].to_string().contains("the tool list could not be read again (tools/list did not answer within 2 s); its tools are kept"),
        "{report}"
    );
}

/// A changed tool list outlives the run that saw the change: a second
/// agent on the same servers (a host that runs again) offers the new list.
#[test]
fn a_changed_tool_list_holds_for_the_next_agent_on_the_same_servers() {
    use std::sync::Arc;
    use subloop::tools::mcp::config;
    use subloop::tools::mcp::tool::{McpSettings, McpTools};
    if !have_python() {
        return;
    }
    let ws = workspace();
    let servers = vec![config::ServerConfig::parse_flag(&server(&ws)).expect("spec")];
    let tools = McpTools::start(&servers, &McpSettings::new(65536, Duration::from_secs(20)))
        .expect("started");
    let agent = |replies: Vec<Value>| {
        let mut builder =
            subloop::AgentBuilder::new(Arc::new(subloop::policy::permission::AllowAll));
        for source in &tools.sources {
            let source: Arc<dyn subloop::tools::ToolSource> = source.clone();
            builder = builder.tool_source(source).expect("source");
        }
        let mut model = subloop::providers::scripted::ScriptedModel::new(
            replies
                .into_iter()
                .map(|reply| Ok(subloop::ModelResponse::from_value(reply).expect("reply")))
                .collect(),
        );
        builder
            .build()
            .run("q", subloop::Budget::new(4).expect("budget"), &mut model)
            .expect("run")
    };
    let first = agent(vec![
        use_block("a", "mcp__t__change", json!({})),
        answer("one"),
    ]);
    assert_eq!(first.tools[0].content, "changed");
    let second = agent(vec![
        use_block("b", "mcp__t__extra", json!({})),
        answer("two"),
    ]);
    assert_eq!(second.tools[0].content, "extra ran", "{:?}", second.tools);
}

/// Orphans of our descendants are reparented to this process.
fn become_subreaper() {
    // SAFETY: prctl(2) with an integer argument; affects only this process.
    let done = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(done, 0, "PR_SET_CHILD_SUBREAPER");
}

fn read_pid(path: &Path, limit: Duration) -> Option<libc::pid_t> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn no_server_outlives_a_sigkill_of_subloop() {
    if !have_python() {
        return;
    }
    become_subreaper();
    let (ws, dir) = (workspace(), TempDir::new("mcp-kill"));
    let script: PathBuf = dir.write(
        "script.json",
        json!({"parent": [use_block("a", "mcp__t__slow", json!({"seconds": 60})), answer("never")]}).to_string(),
    );
    let mut child = Command::new(common::bin())
        .args([
            "run",
            "--quiet",
            "--decision",
            "allow",
            "--workspace",
            ws.path().to_str().expect("utf-8"),
            "--script",
        ])
        .arg(&script)
        .args(["--mcp", &server(&ws), "--mcp-timeout", "120"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = read_pid(&ws.path().join("mcp-server.pid"), Duration::from_secs(20))
        .expect("the server started");
    // SAFETY: getpgid(2) of a process we know.
    let group = unsafe { libc::getpgid(pid) };
    assert!(
        group > 0 && group != pid,
        "the server runs in a group of its own, led by the watchdog"
    );
    // Let the call reach the server, then kill subloop.
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signals the child we spawned.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
    }
    let _ = child.wait();
    let started = Instant::now();
    let gone = loop {
        // SAFETY: reap whatever of the server's group has exited (we are a
        // subreaper); only that group, not the children of other tests.
        unsafe {
            let mut status = 0;
            while libc::waitpid(-group, &mut status, libc::WNOHANG) > 0 {}
        }
        // SAFETY: signal 0 only checks whether the group exists.
        let alive = unsafe { libc::kill(-group, 0) } == 0;
        if !alive {
            break true;
        }
        if started.elapsed() > Duration::from_secs(2) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if !gone {
        // SAFETY: kill(2) of the group this test started, so nothing is left.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
    assert!(
        gone,
        "the MCP server's group outlived a SIGKILL of subloop by 2 s"
    );
}

/// The threads of this process.
fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .expect("status")
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a thread count")
}

/// In an async run the servers are tasks of the run's own runtime (no
/// thread and no runtime per server), their calls are awaited on the run's
/// task, dropping the run in the middle of a call tells the server to
/// cancel it, and a changed tool list is offered once read.
#[test]
fn in_async_runs_servers_are_tasks_and_a_dropped_call_is_cancelled() {
    use std::sync::Arc;
    use subloop::tools::mcp::config;
    use subloop::tools::mcp::tool::{McpSettings, McpTools};
    if !have_python() {
        return;
    }
    let ws = workspace();
    let servers = vec![config::ServerConfig::parse_flag(&server(&ws)).expect("spec")];
    let settings = McpSettings::new(65536, Duration::from_secs(20));
    let runtime = common::runtime();
    runtime.block_on(async {
        let before = threads();
        let tools = McpTools::start_async(&servers, &settings)
            .await
            .expect("started");
        assert_eq!(threads(), before, "a server started a thread");
        let agent = |replies: Vec<Value>| {
            let mut builder =
                subloop::AgentBuilder::new(Arc::new(subloop::policy::permission::AllowAll));
            for source in &tools.sources {
                let source: Arc<dyn subloop::tools::ToolSource> = source.clone();
                builder = builder.tool_source(source).expect("source");
            }
            let model = subloop::providers::scripted::ScriptedModel::new(
                replies
                    .into_iter()
                    .map(|reply| Ok(subloop::ModelResponse::from_value(reply).expect("reply")))
                    .collect(),
            );
            (builder.build(), subloop::run::model::Blocking(model))
        };
        let budget = || subloop::Budget::new(4).expect("budget");

        // A call in flight when the run is dropped: the server is told.
        let (run, mut model) = agent(vec![
            use_block("a", "mcp__t__slow", json!({"seconds": 30})),
            answer("never"),
        ]);
        let dropped = tokio::time::timeout(
            Duration::from_millis(800),
            run.run_async("q", budget(), &mut model),
        )
        .await;
        assert!(dropped.is_err(), "the call was still in flight");
        let told = ws.path().join("mcp-cancelled.txt");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !told.exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(told.exists(), "the server was not told to cancel");

        // The list changes; once read, the next run offers the new tool.
        let (run, mut model) = agent(vec![
            use_block("b", "mcp__t__change", json!({})),
            answer("one"),
        ]);
        let first = run.run_async("q", budget(), &mut model).await.expect("run");
        assert_eq!(first.tools[0].content, "changed");
        let source = Arc::clone(&tools.sources[0]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !subloop::tools::ToolSource::current(source.as_ref())
            .1
            .iter()
            .any(|entry| entry.name() == "mcp__t__extra")
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (run, mut model) = agent(vec![
            use_block("c", "mcp__t__extra", json!({})),
            answer("two"),
        ]);
        let second = run.run_async("q", budget(), &mut model).await.expect("run");
        assert_eq!(second.tools[0].content, "extra ran", "{:?}", second.tools);
        assert_eq!(threads(), before);
    });
}

#[test]
fn a_server_starts_with_no_inherited_descriptor_no_capability_and_no_new_privileges() {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::process::CommandExt as _;
    if !have_python() {
        return;
    }
    let (ws, dir) = (workspace(), TempDir::new("mcp-hardened"));
    let fds = dir.path().join("fds.txt");
    let status = dir.path().join("status.txt");
    let outside = dir.path().join("outside.txt");
    // The server, started through a shell that looks at what it got first.
    let wrapper = dir.write(
        "server.sh",
        format!(
            "ls /proc/self/fd > '{}'\ngrep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status > '{}'\necho leaked >&7\nexec python3 {}/tests/mcp_server.py {}\n",
            fds.display(),
            status.display(),
            env!("CARGO_MANIFEST_DIR"),
            ws.path().display()
        ),
    );
    let script = dir.write(
        "script.json",
        json!({"parent": [use_block("a", "mcp__t__look", json!({"text": "hi"})), answer("done")]})
            .to_string(),
    );
    // subloop runs with descriptor 7 open on a file, not close-on-exec (as
    // `subloop run ... 7>>outside.txt` would).
    let file = std::fs::File::create(&outside).expect("outside.txt");
    let fd = file.as_raw_fd();
    let mut command = Command::new(common::bin());
    command
        .args(["run", "--json", "--decision", "allow", "--workspace"])
        .arg(ws.path())
        .arg("--script")
        .arg(&script)
        .arg("--mcp")
        .arg(format!("t=sh {}", wrapper.display()))
        .stdin(Stdio::null());
    // SAFETY: dup2(2) in the forked child, before the exec.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(fd, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = command.output().expect("run subloop");
    drop(file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(tools(&parsed(&out))[0].3, "looked: hi");
    common::assert_started_hardened(&fds, &outside, &status);
}
