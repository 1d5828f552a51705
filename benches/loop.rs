//! `cargo bench`: the four figures of the README, each on one stable line.
//!
//! * `transitions`: `receive` + `answer_with` on generated replies (text and 1–4 calls);
//! * `long_replay`: 1000 turns reading a 4 KiB file through the real driver and
//!   tools (trace off), and the cost of the last 100 turns against the first 100;
//! * `context_economy`: bytes a delegation adds to the parent's history, against
//!   reading the same 100 KiB (5 files) directly;
//! * `memory`: peak resident memory of the long replay (in a fresh process),
//!   against 3 × the transcript's bytes + 16 MiB;
//! * `cli_replay`: `subloop run --script` on the 1000-turn script, end to end;
//! * `replay_floor`: the same `subloop run --script --json` process against a
//!   floor process that only reads the same script (serde into a minimal
//!   struct) and does the same 1000 file reads, interleaved in one run; the
//!   ratio is the figure (also against a floor that keeps what it read);
//! * `script_memory`: peak resident memory of `subloop run` loading a script
//!   of one million small replies, against the script's size;
//! * `view_page`: `subloop view TRACE -o PAGE` on the trace of the long
//!   replay and on one 4 times as long (the time should grow 4 times, not
//!   16), against `view --check` on the long one (reading and checking the
//!   trace, the floor of drawing it).
//!
//! Medians of several runs; the machine is shared, so read the figures as
//! orders of magnitude with a target, not as exact timings.

// A bench may unwrap, expect, panic and index: a panic stops the bench.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use subloop::AgentBuilder;
// The CLI's host (the binary's own module): runs wired as `subloop run` wires them.
#[allow(dead_code, unused_imports)]
#[path = "../src/host/mod.rs"]
mod host;
#[path = "../examples/bench/long_replay.rs"]
mod long_replay;

use host::{DecisionMode, Settings};
use subloop::Budget;
use subloop::Conversation;
use subloop::Hooks;
use subloop::ModelResponse;
use subloop::agent::subagent::SubagentConfig;
use subloop::core::agent_id::AgentId;
use subloop::core::conversation::AfterTools;
use subloop::core::conversation::Reply;
use subloop::core::conversation::ToolOutput;
use subloop::policy::permission::DenyAll;
use subloop::providers::scripted::Script;
use subloop::providers::scripted::ScriptedChildren;
use subloop::providers::scripted::ScriptedModel;
use subloop::run::monitor::Event;
use subloop::run::monitor::Monitor;
use subloop::tools::ReadFile;

const TURNS: usize = match option_env!("SUBLOOP_BENCH_TURNS") {
    Some(_) => 4000,
    None => 1000,
};

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn scratch(tag: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "subloop-bench-{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Replies cycling through an answer-free mix of 1–4 calls, with some text.
fn generated_replies(count: usize) -> Vec<ModelResponse> {
    (0..count)
        .map(|i| {
            let calls = i % 4 + 1;
            let mut reply = ModelResponse::tool_calls((0..calls).map(|c| {
                (
                    format!("toolu_{i}_{c}"),
                    "read_file",
                    json!({"path": "main.py"}),
                )
            }));
            if i % 3 == 0 {
                reply.content.insert(
                    0,
                    subloop::core::protocol::Block::text("Let me look.").into(),
                );
            }
            reply
        })
        .collect()
}

fn bench_transitions() {
    let replies = generated_replies(4096);
    let chain = 16;
    let mut rates = Vec::new();
    for _ in 0..7 {
        // The replies are copied before the clock starts: `receive` takes them by value.
        let batch: Vec<Vec<ModelResponse>> = replies
            .chunks(chain)
            .map(<[ModelResponse]>::to_vec)
            .collect();
        let started = Instant::now();
        let mut transitions = 0u64;
        for chunk in batch {
            let Ok(mut conversation) =
                Conversation::start("q", Budget::new(chain as u32 + 1).expect("budget"))
            else {
                return;
            };
            for reply in chunk {
                let Reply::Tools(pending) = conversation.receive(reply) else {
                    panic!("generated replies are tool rounds");
                };
                transitions += 1;
                match pending.answer_with(|_| ToolOutput::ok("print(6 * 7)")) {
                    AfterTools::Continue(next) => conversation = next,
                    AfterTools::CallLimit(_) => panic!("budget covers the chain"),
                }
                transitions += 1;
            }
        }
        rates.push(transitions as f64 / started.elapsed().as_secs_f64());
    }
    println!(
        "bench transitions: {:.2e} transitions/s on one core (median of 7; receive and answer_with each count one; target >= 1e6)",
        median(rates)
    );
}

/// Writes the long-replay workspace and script.
fn long_workspace() -> (PathBuf, Script) {
    long_workspace_of(TURNS)
}

/// The long-replay workspace and script with `turns` tool rounds.
fn long_workspace_of(turns: usize) -> (PathBuf, Script) {
    let dir = scratch("long");
    let line = "the quick brown fox jumps over the lazy dog, again and again and again!!\n";
    let data: String = line
        .repeat(4096 / line.len() + 1)
        .chars()
        .take(4096)
        .collect();
    std::fs::write(dir.join("data.txt"), data).expect("data file");
    let script = long_replay::long_replay_script(turns, "data.txt");
    let text = serde_json::to_string(&script).expect("script json");
    std::fs::write(dir.join("script.json"), &text).expect("script file");
    (dir, Script::parse(&text).expect("script parses"))
}

fn long_settings(dir: &Path) -> Settings {
    let mut settings = Settings::new(dir.to_owned());
    settings.max_calls = TURNS as u32 + 1;
    settings.decision = DecisionMode::Deny;
    settings.progress = false;
    settings
}

/// Timestamps each model request of the parent.
struct TurnClock(Arc<std::sync::Mutex<Vec<Instant>>>);

impl Monitor for TurnClock {
    fn event(&mut self, agent: &AgentId, event: &Event<'_>) {
        if matches!(agent, AgentId::Parent) && matches!(event, Event::Request { .. }) {
            self.0.lock().expect("clock").push(Instant::now());
        }
    }
}

/// The long replay as `subloop run` wires it (every tool, the plan, `task`); returns the transcript's bytes.
fn long_replay_once(dir: &Path, script: &Script) -> usize {
    let settings = long_settings(dir);
    let children: Arc<dyn subloop::run::model::ChildModels> = Arc::new(ScriptedChildren::default());
    let agent = host::build_agent(&settings, children).expect("agent");
    let mut model = ScriptedModel::from_script(script.parent.clone(), false);
    let report = agent
        .run(
            &settings.question,
            Budget::new(settings.max_calls).expect("budget"),
            &mut model,
        )
        .expect("run");
    assert_eq!(report.outcome.calls as usize, TURNS + 1);
    serde_json::to_vec(&report.outcome.messages)
        .expect("json")
        .len()
}

/// Runs the long replay with a clock on each parent request; returns the
/// total time, and the last 100 turns against the first 100 as (median
/// per-turn cost ratio, summed cost ratio).
fn per_turn_ratio(dir: &Path, script: &Script) -> (Duration, f64, f64) {
    let times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let workspace = dir.to_owned();
    let agent = AgentBuilder::new(Arc::new(DenyAll))
        .read_only_tool(ReadFile::new(&workspace, ReadFile::DEFAULT_LIMIT).expect("read_file"))
        .expect("tool")
        .plan()
        .expect("plan")
        .subagents(SubagentConfig::new(
            Arc::new(ScriptedChildren::default()),
            Hooks::none(),
        ))
        .expect("task")
        .monitor(TurnClock(times.clone()))
        .build();
    let mut model = ScriptedModel::from_script(script.parent.clone(), false);
    let started = Instant::now();
    let report = agent
        .run(
            "Read data.txt",
            Budget::new(TURNS as u32 + 1).expect("budget"),
            &mut model,
        )
        .expect("run");
    let total = started.elapsed();
    let end = Instant::now();
    assert_eq!(report.outcome.calls as usize, TURNS + 1);
    let times = times.lock().expect("clock").clone();
    let mut turns: Vec<f64> = times
        .windows(2)
        .map(|pair| (pair[1] - pair[0]).as_secs_f64())
        .collect();
    if let Some(last) = times.last() {
        turns.push((end - *last).as_secs_f64());
    }
    let first: Vec<f64> = turns.iter().take(100).copied().collect();
    let last: Vec<f64> = turns.iter().rev().take(100).copied().collect();
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    (
        total,
        median(last.clone()) / median(first.clone()),
        sum(&last) / sum(&first),
    )
}

fn bench_long_replay() {
    let (dir, script) = long_workspace();
    let mut totals = Vec::new();
    let mut ratios = Vec::new();
    let mut summed = Vec::new();
    for _ in 0..5 {
        let (total, ratio, sum_ratio) = per_turn_ratio(&dir, &script);
        totals.push(total.as_secs_f64());
        ratios.push(ratio);
        summed.push(sum_ratio);
    }
    let transcript = long_replay_once(&dir, &script);
    println!(
        "bench long_replay: {TURNS} turns in {:.1} ms; per-turn cost last 100 / first 100 = {:.2} (median turn; target <= 1.5), {:.2} (summed); transcript {} bytes (median of 5 runs)",
        median(totals) * 1000.0,
        median(ratios),
        median(summed),
        transcript
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn history_bytes(messages: &[subloop::core::protocol::Message]) -> usize {
    messages
        .iter()
        .skip(1)
        .map(|m| serde_json::to_vec(m).map(|v| v.len()).unwrap_or(0))
        .sum()
}

fn bench_context_economy() {
    let dir = scratch("economy");
    let names: Vec<String> = (1..=5).map(|i| format!("part{i}.txt")).collect();
    for name in &names {
        std::fs::write(dir.join(name), "x".repeat(20 * 1024)).expect("file");
    }
    let reads: Vec<(String, &str, serde_json::Value)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (format!("toolu_r{i}"), "read_file", json!({"path": name})))
        .collect();
    let summary = "The five parts hold 102400 bytes of the letter x and nothing else.";
    let build = |children: ScriptedChildren| {
        AgentBuilder::new(Arc::new(DenyAll))
            .read_only_tool(ReadFile::new(&dir, ReadFile::DEFAULT_LIMIT).expect("read_file"))
            .expect("tool")
            .subagents(SubagentConfig::new(Arc::new(children), Hooks::none()))
            .expect("task")
            .build()
    };
    // Delegated: one task; the child reads the five files and reports.
    let delegate = |task: &str, summary: &str| {
        let child = vec![
            Ok(ModelResponse::tool_calls(reads.clone())),
            Ok(ModelResponse::answer(summary)),
        ];
        let mut parent = ScriptedModel::new(vec![
            Ok(ModelResponse::tool_calls([(
                "toolu_task",
                "task",
                json!({"task": task}),
            )])),
            Ok(ModelResponse::answer("done")),
        ]);
        build(ScriptedChildren(vec![child]))
            .run(
                "What do the parts hold?",
                Budget::new(4).expect("budget"),
                &mut parent,
            )
            .expect("run")
    };
    let delegated = delegate(
        "Read part1.txt to part5.txt and say what they hold.",
        summary,
    );
    // The worst a delegation can add: a 600-character task and a summary at the 1200-character cap.
    let worst = delegate(&"t".repeat(600), &"s".repeat(1200));
    // Direct: the parent reads them itself.
    let mut parent = ScriptedModel::new(vec![
        Ok(ModelResponse::tool_calls(reads)),
        Ok(ModelResponse::answer("done")),
    ]);
    let direct = build(ScriptedChildren::default())
        .run(
            "What do the parts hold?",
            Budget::new(4).expect("budget"),
            &mut parent,
        )
        .expect("run");
    let child_read: usize = delegated
        .children
        .iter()
        .map(|c| history_bytes(&c.outcome.messages))
        .sum();
    println!(
        "bench context_economy: delegation adds {} bytes to the parent's history (target <= 1536 per delegation; at worst, a 600-char task and a 1200-char summary, {} bytes); reading directly adds {} bytes; the child's own history held {} bytes",
        history_bytes(&delegated.outcome.messages),
        history_bytes(&worst.outcome.messages),
        history_bytes(&direct.outcome.messages),
        child_read
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn bench_memory() {
    // A fresh process runs the long replay alone, so its peak is the replay's.
    let exe = std::env::current_exe().expect("bench executable");
    let output = std::process::Command::new(exe)
        .env("SUBLOOP_BENCH_MEMORY_CHILD", "1")
        .output()
        .expect("memory child");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut fields = text.split_whitespace();
    let (Some(peak), Some(transcript)) = (
        fields.next().and_then(|n| n.parse::<u64>().ok()),
        fields.next().and_then(|n| n.parse::<u64>().ok()),
    ) else {
        println!("bench memory: not measured ({})", text.trim());
        return;
    };
    let budget = 3 * transcript + 16 * 1024 * 1024;
    println!(
        "bench memory: long replay peak RSS {:.1} MiB for a {:.1} MiB transcript (target <= 3 x transcript + 16 MiB = {:.1} MiB)",
        peak as f64 / 1024.0 / 1024.0,
        transcript as f64 / 1024.0 / 1024.0,
        budget as f64 / 1024.0 / 1024.0
    );
}

fn memory_child() {
    let (dir, script) = long_workspace();
    let transcript = long_replay_once(&dir, &script);
    let peak = peak_rss_kib().map_or(0, |kib| kib * 1024);
    println!("{peak} {transcript}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The floor: what any replay of the script must do. Parse the same script
/// (serde into the least a replay needs: each call's `path`) and read the
/// same file once per call. Run as its own process, like `subloop`.
fn floor_child(dir: &Path) -> usize {
    #[derive(serde::Deserialize)]
    struct FloorScript {
        parent: Vec<FloorReply>,
    }
    #[derive(serde::Deserialize)]
    struct FloorReply {
        content: Vec<FloorBlock>,
    }
    #[derive(serde::Deserialize)]
    struct FloorBlock {
        #[serde(default)]
        input: Option<FloorInput>,
    }
    #[derive(serde::Deserialize)]
    struct FloorInput {
        path: String,
    }
    let text = std::fs::read(dir.join("script.json")).expect("script");
    let script: FloorScript = serde_json::from_slice(&text).expect("floor parse");
    let keep = std::env::var_os("SUBLOOP_BENCH_FLOOR_KEEP").is_some();
    let mut kept = Vec::new();
    let mut bytes = 0;
    for reply in &script.parent {
        for block in &reply.content {
            if let Some(input) = &block.input {
                let content = std::fs::read(dir.join(&input.path)).expect("read");
                bytes += content.len();
                if keep {
                    kept.push(content);
                }
            }
        }
    }
    bytes + kept.len()
}

/// One run of `subloop run --script …` on the long workspace, timed; with
/// `json`, the `--json` output (every result's full content) is written too.
fn time_subloop_replay(dir: &Path, json: bool) -> f64 {
    let started = Instant::now();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_subloop"))
        .arg("run")
        .args(json.then_some("--json"))
        .args([
            "--quiet",
            "--decision",
            "deny",
            "--max-calls",
            &(TURNS + 1).to_string(),
            "--workspace",
        ])
        .arg(dir)
        .arg("--script")
        .arg(dir.join("script.json"))
        .stdout(std::process::Stdio::null())
        .status()
        .expect("subloop run");
    assert!(status.success());
    started.elapsed().as_secs_f64()
}

/// One run of the floor process on the long workspace, timed; `keep`: the
/// floor also keeps what it read, as a replay keeps it in the history.
fn time_floor(dir: &Path, keep: bool) -> f64 {
    let exe = std::env::current_exe().expect("bench executable");
    let mut command = std::process::Command::new(exe);
    command.env("SUBLOOP_BENCH_FLOOR_CHILD", dir);
    if keep {
        command.env("SUBLOOP_BENCH_FLOOR_KEEP", "1");
    }
    let started = Instant::now();
    let status = command
        .stdout(std::process::Stdio::null())
        .status()
        .expect("floor child");
    assert!(status.success());
    started.elapsed().as_secs_f64()
}

fn bench_replay_floor() {
    let (dir, _) = long_workspace();
    let (mut whole, mut plain, mut floor, mut keeping) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Interleaved, so all four see the same machine load.
    for _ in 0..11 {
        whole.push(time_subloop_replay(&dir, true));
        plain.push(time_subloop_replay(&dir, false));
        floor.push(time_floor(&dir, false));
        keeping.push(time_floor(&dir, true));
    }
    let (whole, plain, floor, keeping) =
        (median(whole), median(plain), median(floor), median(keeping));
    println!(
        "bench replay_floor: subloop run --script --json with {TURNS} turns {:.1} ms, floor (parse the script, read the same files, in a process) {:.1} ms: ratio {:.2} (target <= 1.3); without --json {:.1} ms: ratio {:.2}; against a floor that also keeps what it read ({:.1} ms): {:.2} with --json, {:.2} without (medians of 11 interleaved)",
        whole * 1000.0,
        floor * 1000.0,
        whole / floor,
        plain * 1000.0,
        plain / floor,
        keeping * 1000.0,
        whole / keeping,
        plain / keeping
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The peak RSS (KiB) of a child process, from `wait4`.
fn run_for_peak_kib(command: &mut std::process::Command) -> Option<(bool, u64)> {
    let child = command.spawn().ok()?;
    let pid = libc::pid_t::try_from(child.id()).ok()?;
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value for `wait4` to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet reaped; both pointers are valid.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if reaped != pid {
        return None;
    }
    let success = libc::WIFEXITED(status);
    Some((success, u64::try_from(usage.ru_maxrss).ok()?))
}

fn bench_script_memory() {
    const REPLIES: usize = 1_000_000;
    let dir = scratch("script-memory");
    let mut text = String::with_capacity(REPLIES * 130);
    text.push_str(r#"{"parent":["#);
    for turn in 1..=REPLIES {
        text.push_str(&format!(
            r#"{{"content":[{{"id":"toolu_{turn}","input":{{"path":"data.txt"}},"name":"read_file","type":"tool_use"}}],"stop_reason":"tool_use"}},"#
        ));
    }
    text.push_str(r#"{"content":[{"text":"done","type":"text"}],"stop_reason":"end_turn"}]}"#);
    let script = dir.join("script.json");
    std::fs::write(&script, &text).expect("script file");
    std::fs::write(dir.join("data.txt"), "x").expect("data file");
    let size = text.len() as f64 / 1024.0 / 1024.0;
    drop(text);
    // One model call: the run stops at `call_limit` right after loading the script.
    let peak = run_for_peak_kib(
        std::process::Command::new(env!("CARGO_BIN_EXE_subloop"))
            .args(["run", "--quiet", "--decision", "deny", "--max-calls", "1"])
            .arg("--workspace")
            .arg(&dir)
            .arg("--script")
            .arg(&script)
            .stdout(std::process::Stdio::null()),
    );
    let _ = std::fs::remove_dir_all(&dir);
    match peak {
        Some((_, kib)) => {
            let peak = kib as f64 / 1024.0;
            println!(
                "bench script_memory: subloop run loading a {REPLIES}-reply script of {size:.1} MiB peaks at {peak:.1} MiB RSS ({:.1} x the script)",
                peak / size
            );
        }
        None => println!("bench script_memory: not measured"),
    }
}

fn bench_cli_replay() {
    let (dir, _) = long_workspace();
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_subloop"))
            .args([
                "run",
                "--quiet",
                "--decision",
                "deny",
                "--max-calls",
                "1001",
                "--workspace",
            ])
            .arg(&dir)
            .arg("--script")
            .arg(dir.join("script.json"))
            .stdout(std::process::Stdio::null())
            .status()
            .expect("subloop run");
        assert!(status.success());
        times.push(started.elapsed().as_secs_f64());
    }
    println!(
        "bench cli_replay: subloop run --script with {TURNS} turns takes {:.1} ms end to end (median of 5; target well under 1000 ms)",
        median(times) * 1000.0
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The trace of a `turns`-round run on the long workspace, in a scratch
/// directory of its own (a trace may not be written in the workspace).
fn long_trace(turns: usize) -> (PathBuf, PathBuf) {
    let (dir, _) = long_workspace_of(turns);
    let out = scratch("view");
    let trace = out.join("trace.jsonl");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_subloop"))
        .args(["run", "--quiet", "--decision", "deny", "--max-calls"])
        .arg((turns + 1).to_string())
        .arg("--workspace")
        .arg(&dir)
        .arg("--script")
        .arg(dir.join("script.json"))
        .arg("--trace")
        .arg(&trace)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("subloop run");
    assert!(status.success());
    let _ = std::fs::remove_dir_all(dir);
    (out, trace)
}

/// One `subloop view` of `trace` with `args`, timed.
fn time_view(trace: &Path, args: &[&str]) -> f64 {
    let started = Instant::now();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_subloop"))
        .arg("view")
        .arg(trace)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("subloop view");
    assert!(status.success());
    started.elapsed().as_secs_f64()
}

fn bench_view_page() {
    let (small_dir, small) = long_trace(TURNS);
    let (large_dir, large) = long_trace(4 * TURNS);
    let (mut page_small, mut page_large, mut check_large) = (Vec::new(), Vec::new(), Vec::new());
    let small_page = small_dir.join("page.html");
    let large_page = large_dir.join("page.html");
    let as_arg = |path: &Path| path.to_str().expect("utf-8 scratch path").to_owned();
    let (small_page, large_page) = (as_arg(&small_page), as_arg(&large_page));
    // Interleaved, so all three see the same machine load.
    for _ in 0..5 {
        page_small.push(time_view(&small, &["-o", &small_page]));
        page_large.push(time_view(&large, &["-o", &large_page]));
        check_large.push(time_view(&large, &["--check"]));
    }
    let (page_small, page_large, check_large) =
        (median(page_small), median(page_large), median(check_large));
    let bytes = std::fs::metadata(&large_page).map_or(0, |meta| meta.len());
    println!(
        "bench view_page: subloop view -o with {TURNS} turns {:.1} ms, with {} turns {:.1} ms: ratio {:.2} (linear: about 4; target <= 5); view --check on the {} turns {:.1} ms: page / check {:.2} (target <= 2); page {bytes} bytes (medians of 5 interleaved)",
        page_small * 1000.0,
        4 * TURNS,
        page_large * 1000.0,
        page_large / page_small,
        4 * TURNS,
        check_large * 1000.0,
        page_large / check_large,
    );
    let _ = std::fs::remove_dir_all(small_dir);
    let _ = std::fs::remove_dir_all(large_dir);
}

fn main() {
    if std::env::var_os("SUBLOOP_BENCH_MEMORY_CHILD").is_some() {
        memory_child();
        return;
    }
    if let Some(dir) = std::env::var_os("SUBLOOP_BENCH_FLOOR_CHILD") {
        println!("{}", floor_child(Path::new(&dir)));
        return;
    }
    // `cargo bench -- <filter>` runs only the benches whose name contains the filter.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let benches: [(&str, fn()); 8] = [
        ("transitions", bench_transitions),
        ("long_replay", bench_long_replay),
        ("context_economy", bench_context_economy),
        ("memory", bench_memory),
        ("cli_replay", bench_cli_replay),
        ("replay_floor", bench_replay_floor),
        ("script_memory", bench_script_memory),
        ("view_page", bench_view_page),
    ];
    for (name, bench) in benches {
        if wanted(name) {
            bench();
        }
    }
}
