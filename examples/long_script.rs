//! Writes the long-replay benchmark's input: a workspace holding a 4 KiB
//! `data.txt`, and a script of N tool rounds that each read it.
//!
//! ```text
//! cargo run --release --example long_script -- /tmp/long 1000
//! time target/release/subloop run --quiet --workspace /tmp/long --script /tmp/long/script.json --max-calls 1001
//! ```

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "bench/long_replay.rs"]
mod long_replay;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "long-replay".to_owned()));
    let turns: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(1000);
    std::fs::create_dir_all(&dir)?;
    let line = "the quick brown fox jumps over the lazy dog, again and again and again!!\n";
    let data: String = line
        .repeat(4096 / line.len() + 1)
        .chars()
        .take(4096)
        .collect();
    std::fs::write(dir.join("data.txt"), data)?;
    let script = long_replay::long_replay_script(turns, "data.txt");
    std::fs::write(dir.join("script.json"), serde_json::to_string(&script)?)?;
    println!(
        "wrote {} and {}: {turns} turns; replay with --max-calls {}",
        dir.join("data.txt").display(),
        dir.join("script.json").display(),
        turns + 1
    );
    Ok(())
}
