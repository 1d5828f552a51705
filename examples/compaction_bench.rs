//! What compaction costs a long run: a 1,000-turn scripted run (each turn
//! reads a 4 KiB file) with no compaction, and with the default compaction
//! under a context window that forces one about every 50 turns. Prints one
//! JSON line per run: wall time, peak heap, the bytes of messages the
//! first, median and last requests carried and the largest (counted as the
//! token estimate counts them, without building the JSON), how many
//! compactions, and the time ratio.
//!
//! ```text
//! cargo run --release --example compaction_bench -- 1000
//! ```

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::json;
use subloop::core::compaction::Compaction;
use subloop::core::error::ModelFailure;
use subloop::core::protocol::Request;
use subloop::policy::permission::AllowAll;
use subloop::providers::scripted::ScriptedModel;
use subloop::run::monitor::{Event, Monitor};
use subloop::tools::ReadFile;
use subloop::{AgentBuilder, Budget, Model, ModelResponse};

#[path = "bench/counting.rs"]
mod counting;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// The scripted model, measuring the messages of every request it gets.
struct Measured {
    inner: ScriptedModel,
    bytes: Arc<Mutex<Vec<usize>>>,
}

impl Model for Measured {
    fn respond(&mut self, request: &Request<'_>) -> Result<ModelResponse, ModelFailure> {
        // The estimate's count of bytes: linear, allocates nothing.
        let bytes = subloop::core::compaction::estimate_tokens(request.messages) * 4;
        self.bytes
            .lock()
            .unwrap()
            .push(usize::try_from(bytes).unwrap_or(usize::MAX));
        self.inner.respond(request)
    }
}

/// Counts the compactions.
struct Compactions(Arc<AtomicUsize>);

impl Monitor for Compactions {
    fn event(&mut self, _agent: &subloop::core::agent_id::AgentId, event: &Event<'_>) {
        if let Event::Compacted { .. } = event {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn run(dir: &std::path::Path, turns: usize, compaction: Option<Compaction>) -> serde_json::Value {
    let mut replies: Vec<Result<ModelResponse, ModelFailure>> = (0..turns)
        .map(|n| {
            Ok(ModelResponse::tool_calls([(
                format!("t{n}"),
                "read_file",
                json!({"path": "data.txt"}),
            )]))
        })
        .collect();
    replies.push(Ok(ModelResponse::answer("Read it 1,000 times.")));
    let bytes = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let mut model = Measured {
        inner: ScriptedModel::new(replies),
        bytes: Arc::clone(&bytes),
    };
    let with = compaction.is_some();
    let before = counting::reset();
    let started = Instant::now();
    let report = AgentBuilder::new(Arc::new(AllowAll))
        .compaction(compaction)
        .read_only_tool(ReadFile::new(dir, ReadFile::DEFAULT_LIMIT).unwrap())
        .unwrap()
        .monitor(Compactions(Arc::clone(&count)))
        .build()
        .run(
            "Read data.txt again and again.",
            Budget::new(u32::try_from(turns).unwrap() + 1).unwrap(),
            &mut model,
        )
        .unwrap();
    let wall = started.elapsed().as_secs_f64();
    let peak = counting::peak_above(before);
    drop(report);
    let mut sizes = bytes.lock().unwrap().clone();
    if std::env::var_os("BENCH_SIZES").is_some() {
        eprintln!("{sizes:?}");
    }
    let (first, last) = (sizes[0], *sizes.last().unwrap());
    sizes.sort_unstable();
    json!({
        "compaction": if with { "auto" } else { "off" },
        "turns": turns,
        "wall_s": (wall * 1000.0).round() / 1000.0,
        "peak_heap_mib": (peak as f64 / 1_048_576.0 * 10.0).round() / 10.0,
        "request_bytes": {"first": first, "median": sizes[sizes.len() / 2], "last": last,
                          "largest": sizes.last()},
        "compactions": count.load(Ordering::Relaxed),
    })
}

fn main() {
    let turns: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("a number of turns"))
        .unwrap_or(1000);
    let dir = std::env::temp_dir().join(format!("subloop-compaction-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let line = "the quick brown fox jumps over the lazy dog, again and again and again!!\n";
    std::fs::write(dir.join("data.txt"), line.repeat(4096 / line.len() + 1)).unwrap();
    // Each turn adds about 1,100 tokens (a 4 KiB result and its call): a
    // 70,000-token window, compacted past 80% of it, compacts about every
    // 50 turns.
    let off = run(&dir, turns, None);
    let on = run(&dir, turns, Some(Compaction::auto(Some(70_000))));
    std::fs::remove_dir_all(&dir).ok();
    let ratio = on["wall_s"].as_f64().unwrap() / off["wall_s"].as_f64().unwrap().max(1e-9);
    println!("{off}");
    println!("{on}");
    println!(
        "{}",
        json!({"time_ratio_on_over_off": (ratio * 100.0).round() / 100.0})
    );
}
