//! Both providers against a real model server: llama.cpp's `llama-server`
//! running Gemma 3 270M on the CPU (`.ci/run` builds and starts it and sets
//! `SUBLOOP_LLAMA_URL`), through its OpenAI-compatible `/v1/chat/completions`
//! and its Anthropic-compatible `/v1/messages`, streamed and not. The model
//! is tiny and its answers vary: the tests hold the protocol (how the run
//! ended, every call answered once, the trace replays as reproduced and
//! keeps every invariant), never the text of an answer.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::{self, TempDir};
use subloop::record::recorded::RecordedRun;

/// The server's base URL, or `None` (and a skip) when there is none.
fn server() -> Option<String> {
    match std::env::var("SUBLOOP_LLAMA_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            common::skipped("no llama-server: SUBLOOP_LLAMA_URL is not set (.ci/run starts one)");
            None
        }
    }
}

/// The second server's base URL: the same model with a context of 2048
/// tokens (`SUBLOOP_LLAMA_SMALL_URL`), or `None` (and a skip).
fn small_server() -> Option<String> {
    match std::env::var("SUBLOOP_LLAMA_SMALL_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            common::skipped(
                "no small-context llama-server: SUBLOOP_LLAMA_SMALL_URL is not set (.ci/run starts one)",
            );
            None
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `subloop ARGS…` with the environment of `provider` pointed at `url`.
fn subloop(url: &str, provider: &str, args: &[&str]) -> Output {
    let mut command = Command::new(common::bin());
    command
        .args(args)
        .stdin(Stdio::null())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY");
    if provider == "openai" {
        command
            .env("OPENAI_BASE_URL", format!("{url}/v1"))
            .env("OPENAI_MODEL", "gemma-3-270m");
    } else {
        command
            .env("ANTHROPIC_BASE_URL", url)
            .env("ANTHROPIC_API_KEY", "local")
            .env("ANTHROPIC_MODEL", "gemma-3-270m");
    }
    command.output().expect("run subloop")
}

/// The workspace of the demo (main.py prints 42; expected.txt says 42).
fn workspace(dir: &TempDir) -> std::path::PathBuf {
    dir.write("ws/main.py", "print(6 * 7)\n");
    dir.write("ws/expected.txt", "42\n");
    dir.path().join("ws")
}

/// The run's trace holds the protocol: it ended in one of the statuses a
/// model can bring about, every call was answered exactly once (the
/// invariants, `consistent` among them, hold: `view --check`), and a replay
/// reproduces every request (under the run's own `max_calls`).
fn holds_the_protocol(
    url: &str,
    provider: &str,
    ws: &Path,
    trace: &Path,
    max_calls: &str,
    what: &str,
) -> usize {
    let recorded = std::fs::read_to_string(trace).expect("the trace");
    let run = RecordedRun::parse(&recorded).unwrap_or_else(|err| panic!("{what}: {err}"));
    let status = run
        .outcome()
        .map(|(status, _)| status.to_string())
        .unwrap_or_default();
    assert!(
        ["answered", "call_limit", "model_stopped", "protocol_error"].contains(&status.as_str()),
        "{what}: ended {status:?}"
    );
    let trace_arg = trace.to_str().expect("utf-8");
    let check = subloop(url, provider, &["view", trace_arg, "--check"]);
    assert_eq!(
        check.status.code(),
        Some(0),
        "{what}: view --check\n{}",
        text(&check.stdout)
    );
    let replay = subloop(
        url,
        provider,
        &[
            "replay",
            trace_arg,
            "--workspace",
            ws.to_str().expect("utf-8"),
            "--decision",
            "allow",
            "--max-calls",
            max_calls,
            "--quiet",
        ],
    );
    let verdict = text(&replay.stdout);
    assert!(
        verdict.starts_with("reproduced"),
        "{what}: replay\n{verdict}{}",
        text(&replay.stderr)
    );
    run.agents().map(|(agent, _)| run.tools(agent).len()).sum()
}

/// The demo and a `run` with a question, for each provider, streamed and
/// not, against the real server.
#[test]
fn both_providers_hold_the_protocol_against_a_real_model() {
    let Some(url) = server() else {
        return;
    };
    let mut tools_ran = 0;
    for provider in ["openai", "anthropic"] {
        for stream in [false, true] {
            let what = format!("{provider}{}", if stream { " streamed" } else { "" });
            let dir = TempDir::new("local-model");
            let ws = workspace(&dir);
            let ws_arg = ws.to_str().expect("utf-8").to_owned();
            let common_flags = |trace: &Path| {
                let mut flags = vec![
                    "--live".to_owned(),
                    "--provider".to_owned(),
                    provider.to_owned(),
                    "--workspace".to_owned(),
                    ws_arg.clone(),
                    "--decision".to_owned(),
                    "allow".to_owned(),
                    "--max-tokens".to_owned(),
                    "128".to_owned(),
                    "--max-calls".to_owned(),
                    "4".to_owned(),
                    "--timeout-read".to_owned(),
                    "300".to_owned(),
                    "--trace".to_owned(),
                    trace.to_str().expect("utf-8").to_owned(),
                    "--quiet".to_owned(),
                ];
                if stream {
                    flags.push("--stream".to_owned());
                }
                flags
            };
            let demo_trace = dir.path().join("demo.jsonl");
            let mut args = vec!["demo".to_owned()];
            args.extend(common_flags(&demo_trace));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = subloop(&url, provider, &args);
            assert!(
                matches!(out.status.code(), Some(0 | 1)),
                "{what} demo: {}",
                text(&out.stderr)
            );
            tools_ran += holds_the_protocol(
                &url,
                provider,
                &ws,
                &demo_trace,
                "4",
                &format!("{what} demo"),
            );

            let run_trace = dir.path().join("run.jsonl");
            let mut args = vec![
                "run".to_owned(),
                "--question".to_owned(),
                "Read main.py with read_file and say what it prints.".to_owned(),
            ];
            args.extend(common_flags(&run_trace));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = subloop(&url, provider, &args);
            assert!(
                matches!(out.status.code(), Some(0 | 1)),
                "{what} run: {}",
                text(&out.stderr)
            );
            tools_ran +=
                holds_the_protocol(&url, provider, &ws, &run_trace, "4", &format!("{what} run"));
        }
    }
    // The model's calls reached the tools, through both endpoints' parsers.
    assert!(tools_ran > 0, "no tool ran in any of the runs");
}

/// A question longer than the server's context window (8192 tokens) is
/// refused by llama.cpp with HTTP 400 `exceed_context_size_error`, on both
/// endpoints, streamed or not: the run fails `model_error` at once, and
/// the trace names the failure `context_window_exceeded`.
#[test]
fn a_question_longer_than_the_context_window_is_a_context_window_failure() {
    let Some(url) = server() else {
        return;
    };
    let question = "word ".repeat(10_000);
    for provider in ["openai", "anthropic"] {
        for stream in [false, true] {
            let what = format!("{provider}{}", if stream { " streamed" } else { "" });
            let dir = TempDir::new("local-model-context");
            let ws = workspace(&dir);
            let trace = dir.path().join("run.jsonl");
            let mut args = vec![
                "run",
                "--question",
                &question,
                "--live",
                "--provider",
                provider,
                "--workspace",
                ws.to_str().expect("utf-8"),
                "--max-calls",
                "1",
                "--trace",
                trace.to_str().expect("utf-8"),
                "--quiet",
            ];
            if stream {
                args.push("--stream");
            }
            let out = subloop(&url, provider, &args);
            assert_ne!(out.status.code(), Some(0), "{what}: {}", text(&out.stderr));
            let recorded = std::fs::read_to_string(&trace).expect("the trace");
            let failed: serde_json::Value = recorded
                .lines()
                .map(|line| serde_json::from_str(line).expect("a JSON line"))
                .find(|line: &serde_json::Value| line["kind"] == "model_failed")
                .unwrap_or_else(|| panic!("{what}: no model_failed line\n{recorded}"));
            assert_eq!(
                failed["error_type"], "context_window_exceeded",
                "{what}: {failed}"
            );
            let error = failed["error"].as_str().unwrap_or_default();
            assert!(
                error.contains("HTTP 400 exceed_context_size_error"),
                "{what}: {error}"
            );
        }
    }
}

/// A run whose files do not fit the server's context window together (a
/// 5.6 KB `main.py` against 2048 tokens, system prompt and tools
/// included): the server refuses the request that carries it, the run
/// compacts and goes on, and ends in a status a model can bring about,
/// for each provider; `view --check` holds and `replay` reproduces.
#[test]
fn a_run_whose_files_do_not_fit_compacts_against_a_small_window() {
    let Some(url) = small_server() else {
        return;
    };
    for provider in ["openai", "anthropic"] {
        let dir = TempDir::new("local-model-small");
        let mut program: Vec<String> = (0..90)
            .map(|i| format!("# step {i}: add the numbers and print the running total"))
            .collect();
        program.push("total = 0".to_owned());
        program.extend((0..60).map(|i| format!("total += {i}")));
        program.push("print(total)\n".to_owned());
        dir.write("ws/main.py", program.join("\n"));
        dir.write("ws/expected.txt", "1770\n");
        let ws = dir.path().join("ws");
        let trace = dir.path().join("run.jsonl");
        let out = subloop(
            &url,
            provider,
            &[
                "run",
                "--question",
                "Read main.py and expected.txt with read_file and say whether main.py prints what expected.txt says.",
                "--live",
                "--provider",
                provider,
                "--workspace",
                ws.to_str().expect("utf-8"),
                "--decision",
                "deny",
                "--max-calls",
                "6",
                "--trace",
                trace.to_str().expect("utf-8"),
                "--quiet",
            ],
        );
        let recorded = std::fs::read_to_string(&trace).expect("the trace");
        let compactions = recorded
            .lines()
            .filter(|line| line.contains("\"kind\":\"compaction\""))
            .count();
        assert!(
            compactions >= 1,
            "{provider}: no compaction\n{}",
            text(&out.stderr)
        );
        holds_the_protocol(&url, provider, &ws, &trace, "6", provider);
    }
}

/// The async clients, awaited as a service would, against the same real
/// server: a run with a question per provider, streamed and not, writes a
/// trace that holds the protocol and replays as reproduced.
#[test]
fn the_async_clients_hold_the_protocol_against_a_real_model() {
    use crate::clients::{Anthropic, OpenAi, Taps};
    use crate::host::{DecisionMode, Settings};
    use subloop::providers::anthropic::LiveConfig;
    use subloop::providers::openai::OpenAiConfig;

    let Some(url) = server() else {
        return;
    };
    common::with_driver(common::Driver::Async, || {
        for provider in ["openai", "anthropic"] {
            for stream in [false, true] {
                let what = format!("async {provider}{}", if stream { " streamed" } else { "" });
                let dir = TempDir::new("local-model-async");
                let ws = workspace(&dir);
                let trace = dir.path().join("run.jsonl");
                let mut settings = Settings::new(ws.clone());
                settings.question = "Read main.py with read_file and say what it prints.".into();
                settings.decision = DecisionMode::Allow;
                settings.max_calls = 4;
                settings.progress = false;
                settings.trace = Some(trace.clone());
                let read = std::time::Duration::from_secs(300);
                let report = if provider == "openai" {
                    let mut config = OpenAiConfig::new("gemma-3-270m", format!("{url}/v1"));
                    config.max_tokens = 128;
                    config.timeouts.read = read;
                    config.stream = stream;
                    OpenAi::new(config, &Taps::default()).run(&settings)
                } else {
                    let env = |name: &str| match name {
                        "ANTHROPIC_API_KEY" => Some("local".to_owned()),
                        "ANTHROPIC_BASE_URL" => Some(url.clone()),
                        _ => None,
                    };
                    let mut config =
                        LiveConfig::from_env(env, Some("gemma-3-270m".to_owned())).expect("config");
                    config.max_tokens = 128;
                    config.timeouts.read = read;
                    config.stream = stream;
                    Anthropic::new(config, &Taps::default()).run(&settings)
                };
                assert!(report.outcome.calls >= 1, "{what}: {}", report.outcome.text);
                holds_the_protocol(&url, provider, &ws, &trace, "4", &what);
            }
        }
    });
}
