//! What `run_main`'s sandbox costs per run: preparing it (the private
//! `TMPDIR`, the Landlock ruleset, the seccomp filter, the environment) and
//! entering it in the child, against an unsandboxed spawn.
//!
//! `cargo run --release --example sandbox_cost [RUNS]` prints the median
//! and the mean of each step, in microseconds (200 runs by default).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use subloop::tools::sandbox::Support;
use subloop::tools::{RunMain, RunSettings, Sandbox, SandboxPolicy};

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

fn measure(runs: usize, mut step: impl FnMut()) -> (f64, f64) {
    step(); // warm up
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            step();
            started.elapsed()
        })
        .collect();
    summary(&mut samples)
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

    row(
        "prepare: TMPDIR + ruleset + filter + env (and remove)",
        measure(runs, || {
            drop(policy.confine(&workspace).expect("confined"));
        }),
    );
    row(
        "spawn /bin/true, unsandboxed",
        measure(runs, || spawn_true(&mut Command::new("/bin/true"))),
    );
    row(
        "spawn /bin/true, fork path (a no-op pre_exec)",
        measure(runs, || {
            let mut command = Command::new("/bin/true");
            // SAFETY: the closure does nothing.
            unsafe {
                command.pre_exec(|| Ok(()));
            }
            spawn_true(&mut command);
        }),
    );
    let confinement = policy.confine(&workspace).expect("confined");
    row(
        "spawn /bin/true, entering a prepared sandbox",
        measure(runs, || {
            let mut command = Command::new("/bin/true");
            confinement.apply(&mut command);
            spawn_true(&mut command);
        }),
    );
    drop(confinement);
    row(
        "spawn /bin/true, prepare + enter (a whole sandboxed start)",
        measure(runs, || {
            let confinement = policy.confine(&workspace).expect("confined");
            let mut command = Command::new("/bin/true");
            confinement.apply(&mut command);
            spawn_true(&mut command);
        }),
    );
    let settings = RunSettings {
        command: vec!["/bin/true".into()],
        ..RunSettings::default()
    };
    for level in [Sandbox::Off, Sandbox::WorkspaceWrite] {
        let tool = RunMain::new(&workspace, settings.clone())
            .expect("run_main")
            .with_sandbox(SandboxPolicy::new(level));
        row(
            &format!("run_main on /bin/true, --sandbox {level}"),
            measure(runs, || assert!(!tool.execute().is_error)),
        );
    }
    let _ = std::fs::remove_dir_all(Path::new(&workspace));
}
