//! The API key is never recorded nor printed: an endpoint that echoes it in
//! a successful reply (its text, a tool call's input, streamed text) and a
//! program that prints it leave it nowhere in the trace, the `--json`
//! output, the progress lines or the text streamed to the terminal.

use crate::common;
use crate::mock_api;
use crate::mock_openai;

use std::process::{Command, Output, Stdio};

use mock_api::{MockServer, Recorded, Reply, message_events};
use serde_json::{Value, json};
use subloop::ModelResponse;

const KEY: &str = "sk-test-ECHOED-0123456789";

/// A message as the Messages API sends it.
fn message(n: usize, content: Value, stop_reason: &str) -> Value {
    json!({
        "id": format!("msg_echo_{n}"), "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "content": content, "stop_reason": stop_reason,
        "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 5}
    })
}

/// The two replies of an endpoint that echoes the key: first one whose
/// text and tool inputs hold it (`read_file` of a path holding it,
/// `run_main` of a program that prints it), then an answer that quotes it.
fn echoed(count: usize) -> Value {
    if count == 1 {
        message(
            count,
            json!([
                {"type": "text", "text": format!("Your key is {KEY}; running the program.")},
                {"type": "tool_use", "id": "toolu_01", "name": "read_file",
                 "input": {"path": format!("{KEY}.txt")}},
                {"type": "tool_use", "id": "toolu_02", "name": "run_main", "input": {}}
            ]),
            "tool_use",
        )
    } else {
        message(
            count,
            json!([{"type": "text", "text": format!("Done. The key was {KEY}, and {KEY} again.")}]),
            "end_turn",
        )
    }
}

/// The Messages API endpoint that echoes the key, streaming or not.
fn echoing(stream: bool) -> impl FnMut(&Recorded) -> Reply + Send + 'static {
    let mut count = 0;
    move |_recorded| {
        count += 1;
        let reply = echoed(count);
        if stream {
            Reply::sse(&message_events(&reply))
        } else {
            Reply::json(200, reply)
        }
    }
}

/// The Chat Completions endpoint that echoes the key, streaming when asked.
fn echoing_openai() -> impl FnMut(&Recorded) -> Reply + Send + 'static {
    let mut count = 0;
    move |recorded| {
        count += 1;
        let reply = ModelResponse::from_value(echoed(count)).expect("a reply");
        let completion =
            mock_openai::completion(&reply, &format!("chatcmpl-{count}"), &json!("local-model"));
        if recorded.json()["stream"] == true {
            mock_openai::sse(&mock_openai::chunks(&completion))
        } else {
            Reply::json(200, completion)
        }
    }
}

/// `subloop run --live` against `server` with a trace, `extra` flags added.
fn run(server: &MockServer, dir: &common::TempDir, extra: &[&str]) -> (Output, String) {
    let trace = dir.path().join(format!("trace-{}.jsonl", extra.join("")));
    let mut command = Command::new(common::bin());
    command
        .args(["run", "--live", "--decision", "allow", "--sandbox", "off"])
        .arg("--workspace")
        .arg(dir.path().join("ws"))
        .arg("--trace")
        .arg(&trace)
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("ANTHROPIC_MODEL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    if extra.contains(&"openai") {
        command
            .env("OPENAI_API_KEY", KEY)
            .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
            .env("OPENAI_MODEL", "local-model");
    } else {
        command
            .env("ANTHROPIC_API_KEY", KEY)
            .env("ANTHROPIC_BASE_URL", &server.url);
    }
    let output = command.output().expect("run binary");
    let text = std::fs::read_to_string(&trace).expect("trace written");
    (output, text)
}

fn assert_nowhere(output: &Output, trace: &str) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!trace.contains(KEY), "the key reached the trace: {trace}");
    assert!(!stdout.contains(KEY), "the key reached stdout: {stdout}");
    assert!(!stderr.contains(KEY), "the key reached stderr: {stderr}");
    // The echoes were there, hidden.
    assert!(trace.contains("Your key is ***;"), "{trace}");
    assert!(trace.contains("***.txt"), "{trace}");
    assert!(
        trace.contains("printed ***"),
        "the program's output: {trace}"
    );
}

#[test]
fn a_key_echoed_by_the_endpoint_or_printed_by_a_tool_is_never_recorded_nor_printed() {
    let dir = common::TempDir::new("secrets");
    dir.write(
        "ws/main.py",
        "import os\nprint('printed', os.environ.get('ANTHROPIC_API_KEY') or os.environ['OPENAI_API_KEY'])\n",
    );
    let server = MockServer::start(echoing(false));
    let (output, trace) = run(&server, &dir, &["--json"]);
    assert_nowhere(&output, &trace);
    let report: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(report["text"], "Done. The key was ***, and *** again.");
    // What went back to the model holds no echo either: only the header has the key.
    let recorded = server.recorded();
    assert_eq!(recorded.len(), 2);
    for request in &recorded {
        assert!(!String::from_utf8_lossy(&request.body).contains(KEY));
        assert_eq!(request.header("x-api-key"), Some(KEY));
    }

    // Streamed, with the progress lines and the text shown as it arrives.
    let server = MockServer::start(echoing(true));
    let (output, trace) = run(&server, &dir, &["--stream"]);
    assert_nowhere(&output, &trace);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Your key is ***;"), "{stderr}");

    // The same through an OpenAI-compatible server, streamed and not.
    for extra in [
        &["--provider", "openai", "--json"][..],
        &["--provider", "openai", "--stream"][..],
    ] {
        let server = MockServer::start(echoing_openai());
        let (output, trace) = run(&server, &dir, extra);
        assert_nowhere(&output, &trace);
        for request in &server.recorded() {
            assert!(!String::from_utf8_lossy(&request.body).contains(KEY));
        }
    }
}
