//! `subloop worker`, `submit`, `approve` and `pending`: durable runs on
//! Restate. They live in the `subloop-restate` binary (the workspace's
//! `restate/` crate, which depends on this library, so this binary cannot
//! link it); `subloop` hands the whole command line to it, found beside
//! `subloop` or on `PATH`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The commands that are `subloop-restate`'s.
pub const COMMANDS: [&str; 4] = ["worker", "submit", "approve", "pending"];

/// The `subloop-restate` binary: beside this one, else on `PATH`.
fn binary() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("subloop-restate")))
        .filter(|path| path.is_file());
    beside.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            // Only absolute entries: an empty one would be the current folder.
            std::env::split_paths(&path)
                .filter(|dir| dir.is_absolute())
                .map(|dir| dir.join("subloop-restate"))
                .find(|candidate| candidate.is_file())
        })
    })
}

/// Runs `subloop-restate` with `args` (the command first) in place of
/// this process; returns only if that fails.
pub fn forward(args: Vec<OsString>) -> ExitCode {
    let command = args
        .first()
        .map(|arg| arg.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some(binary) = binary() else {
        eprintln!(
            "subloop {command}: durable runs need the subloop-restate binary beside subloop or on PATH \
             (build both: cargo build --release)"
        );
        return ExitCode::from(2);
    };
    let error = Command::new(&binary).args(args).exec();
    eprintln!(
        "subloop {command}: cannot start {}: {error}",
        binary.display()
    );
    ExitCode::from(2)
}
