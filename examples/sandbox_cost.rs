//! What `run_main`'s sandbox costs per run: preparing it (the private
//! `TMPDIR`, the Landlock ruleset, the seccomp filter, the environment) and
//! entering it in the child, against an unsandboxed spawn.
//!
//! `cargo run --release --example sandbox_cost [RUNS]` prints the median
//! and the mean of each step, in microseconds (200 runs by default).

// An example may unwrap, expect, panic and index, to stay short (the library may not).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use subloop::tools::sandbox::Support;
use subloop::tools::sandbox::{Sandbox, SandboxPolicy};
use subloop::tools::{RunMain, RunSettings};

/// Median and mean of `samples`, in microseconds.
fn summary(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort_unstable();
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    let median = samples.get(samples.len() / 2).copied().map_or(0.0, micros);
    let mean = if samples.is_empty() {
        0.0
    } else {
        samples.iter().copied().map(micros).sum::<f64>() / samples.len() as f64
    };
    (median, mean)
}

/// Runs every step once per round, `runs` rounds (so that a change in
/// the machine's load touches every step alike); each step's samples.
fn measure(runs: usize, steps: &mut [&mut dyn FnMut()]) -> Vec<Vec<Duration>> {
    for step in steps.iter_mut() {
        step(); // warm up
    }
    let mut samples = vec![Vec::with_capacity(runs); steps.len()];
    for _ in 0..runs {
        for (step, times) in steps.iter_mut().zip(samples.iter_mut()) {
            let started = Instant::now();
            step();
            times.push(started.elapsed());
        }
    }
    samples
}

fn spawn_true(command: &mut Command) {
    let status = command.stdin(Stdio::null()).stdout(Stdio::null()).status();
    assert!(
        status.is_ok_and(|status| status.success()),
        "/bin/true failed"
    );
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(200);
    let support = Support::probe();
    if let Some(missing) = support.missing(Sandbox::WorkspaceWrite) {
        println!("the sandbox cannot be enforced here: {missing}");
        return;
    }
    let workspace =
        std::env::temp_dir().join(format!("subloop-sandbox-cost-{}", std::process::id()));
    std::fs::create_dir_all(&workspace).expect("a workspace");
    let workspace = std::fs::canonicalize(&workspace).expect("a canonical workspace");
    let policy = SandboxPolicy::default();
    let row = |what: &str, (median, mean): (f64, f64)| {
        println!("{what:<58} {median:>9.1} {mean:>9.1}");
    };
    println!(
        "{runs} runs each, Landlock ABI {}; microseconds",
        support.landlock_abi.unwrap_or(0)
    );
    println!("{:<58} {:>9} {:>9}", "step", "median", "mean");

    let prepared = policy.confine(&workspace).expect("confined");
    let settings = RunSettings::new(vec!["/bin/true".into()]);
    let tool = |level| {
        RunMain::new(&workspace, settings.clone())
            .expect("run_main")
            .with_sandbox(SandboxPolicy::new(level))
    };
    let (off, confined) = (tool(Sandbox::Off), tool(Sandbox::WorkspaceWrite));
    let names = [
        "prepare: TMPDIR + ruleset + filter + env (and remove)",
        "spawn /bin/true, unsandboxed",
        "spawn /bin/true, fork path (a no-op pre_exec)",
        "spawn /bin/true, entering a prepared sandbox",
        "spawn /bin/true, prepare + enter (a whole sandboxed start)",
        "run_main on /bin/true, --sandbox off",
        "run_main on /bin/true, --sandbox workspace-write",
    ];
    let samples = measure(
        runs,
        &mut [
            &mut || drop(policy.confine(&workspace).expect("confined")),
            &mut || spawn_true(&mut Command::new("/bin/true")),
            &mut || {
                let mut command = Command::new("/bin/true");
                // SAFETY: the closure does nothing.
                unsafe {
                    command.pre_exec(|| Ok(()));
                }
                spawn_true(&mut command);
            },
            &mut || {
                let mut command = Command::new("/bin/true");
                prepared.apply(&mut command);
                spawn_true(&mut command);
            },
            &mut || {
                let confinement = policy.confine(&workspace).expect("confined");
                let mut command = Command::new("/bin/true");
                confinement.apply(&mut command);
                spawn_true(&mut command);
            },
            &mut || assert!(!off.execute().is_error),
            &mut || assert!(!confined.execute().is_error),
        ],
    );
    for (name, mut times) in names.into_iter().zip(samples) {
        row(name, summary(&mut times));
    }
    drop(prepared);
    let _ = std::fs::remove_dir_all(Path::new(&workspace));
}
