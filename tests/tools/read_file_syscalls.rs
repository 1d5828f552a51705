//! The system calls of one `read_file`, counted with `strace` (skipped, and
//! saying so, where `strace` is not installed or cannot trace): a small file
//! costs at most six (open, fstat, one or two reads, close), and nothing
//! looks at `/proc`, with either resolution strategy.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::TempDir;
use subloop::tools::{ReadFile, Resolution};

/// Set (to the workspace) when this binary runs under `strace`.
const CHILD_ENV: &str = "SUBLOOP_TRACED_READS_WORKSPACE";

/// A failing lookup whose path marks a point in the trace.
fn marker(name: &str) {
    let _ = std::fs::symlink_metadata(format!("/subloop-strace-marker/{name}"));
}

/// The reads that are traced: each between a `begin-…` and an `end-…` marker.
#[test]
#[ignore = "run under strace by reads_take_few_syscalls_and_never_touch_proc"]
fn traced_reads() {
    let Some(ws) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let ws = Path::new(&ws);
    for resolution in [Resolution::Openat2, Resolution::Walk] {
        marker(&format!("begin-setup-{resolution:?}"));
        let made = ReadFile::with_resolution(ws, ReadFile::DEFAULT_LIMIT, resolution);
        marker(&format!("end-setup-{resolution:?}"));
        let Ok(reader) = made else {
            continue;
        };
        for (path, content) in [
            ("hello.txt", "hello\n"),
            ("sub/inner.txt", "inner\n"),
            ("page.txt", &"x".repeat(4096)),
        ] {
            marker(&format!("begin-{path}-{resolution:?}"));
            let text = reader.read(path);
            marker(&format!("end-{path}-{resolution:?}"));
            assert_eq!(text.as_deref(), Ok(content));
        }
    }
}

/// The system call names made by the marking thread between two markers.
fn between(log: &str, begin: &str, end: &str) -> Option<Vec<String>> {
    let begin = format!("/subloop-strace-marker/{begin}\"");
    let end = format!("/subloop-strace-marker/{end}\"");
    let mut lines = log.lines();
    let start = lines.find(|line| line.contains(&begin))?;
    let pid = start.split_whitespace().next()?;
    let mut calls = Vec::new();
    for line in lines {
        if line.contains(&end) {
            return Some(calls);
        }
        let Some(rest) = line.strip_prefix(pid).map(str::trim_start) else {
            continue;
        };
        if rest.starts_with("+++") || rest.starts_with("---") || rest.starts_with("<...") {
            continue;
        }
        if let Some((name, _)) = rest.split_once('(') {
            calls.push(name.to_owned());
        }
    }
    None
}

/// Calls that are not the read's own: memory management (an allocator may
/// or may not make them), and in debug builds the `fcntl(fd, F_GETFD)` with
/// which the standard library checks that a descriptor it closes is open.
fn is_overhead(name: &str) -> bool {
    matches!(
        name,
        "brk" | "mmap" | "munmap" | "mremap" | "madvise" | "mprotect"
    ) || (cfg!(debug_assertions) && name == "fcntl")
}

#[test]
fn reads_take_few_syscalls_and_never_touch_proc() {
    if Command::new("strace").arg("-V").output().is_err() {
        common::skipped("strace not installed");
        return;
    }
    let tmp = TempDir::new("rf-strace");
    tmp.write("ws/hello.txt", "hello\n");
    tmp.write("ws/sub/inner.txt", "inner\n");
    tmp.write("ws/page.txt", "x".repeat(4096));
    let log_path = tmp.path().join("strace.log");
    let out = Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&log_path)
        .arg("--")
        .arg(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "read_file_syscalls::traced_reads",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, tmp.path().join("ws"))
        .output()
        .expect("run strace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("ptrace") {
        common::skipped(format!("strace cannot trace here: {stderr}"));
        return;
    }
    assert!(
        out.status.success(),
        "traced run failed: {stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let log = std::fs::read_to_string(&log_path).expect("the strace log");

    let openat2 = between(&log, "begin-hello.txt-Openat2", "end-hello.txt-Openat2").is_some();
    let mut strategies = vec![Resolution::Walk];
    if openat2 {
        strategies.push(Resolution::Openat2);
    } else {
        eprintln!("openat2 not available: only the walk was traced");
    }
    for resolution in strategies {
        let setup = between(
            &log,
            &format!("begin-setup-{resolution:?}"),
            &format!("end-setup-{resolution:?}"),
        )
        .expect("setup markers");
        eprintln!("{resolution:?} setup: {} calls: {setup:?}", setup.len());
        // (path, directories on the way): the walk opens each directory.
        for (path, depth) in [("hello.txt", 0), ("sub/inner.txt", 1), ("page.txt", 0)] {
            let calls = between(
                &log,
                &format!("begin-{path}-{resolution:?}"),
                &format!("end-{path}-{resolution:?}"),
            )
            .unwrap_or_else(|| panic!("no markers for {path} ({resolution:?})"));
            let io: Vec<&String> = calls.iter().filter(|c| !is_overhead(c)).collect();
            eprintln!("{resolution:?} {path}: {} calls: {calls:?}", calls.len());
            let allowed = match resolution {
                Resolution::Walk => 6 + 2 * depth,
                _ => 6,
            };
            assert!(
                io.len() <= allowed,
                "{resolution:?} {path}: {} calls, at most {allowed} wanted: {io:?}",
                io.len()
            );
            let reads = io.iter().filter(|c| c.as_str() == "read").count();
            assert!(
                (1..=2).contains(&reads),
                "{resolution:?} {path}: {reads} reads"
            );
        }
    }
    // From the first marker to the last, nothing names /proc.
    let first = log.find("/subloop-strace-marker/begin-").expect("a marker");
    let last = log.rfind("/subloop-strace-marker/end-").expect("a marker");
    let traced = log.get(first..last).unwrap_or_default();
    assert!(
        !traced.contains("/proc"),
        "a traced read looked at /proc:\n{}",
        traced
            .lines()
            .filter(|l| l.contains("/proc"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
