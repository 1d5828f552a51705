//! `read_file` against a workspace writer racing it: a thread swaps a middle
//! directory with a symlink to an outside directory (`renameat2` with
//! `RENAME_EXCHANGE`) in a tight loop while thousands of reads go through the
//! swapped name. Not one read may return the outside file's content.
//!
//! Case A puts the outside file at a real path longer than 4096 bytes (the
//! old `/proc/self/fd` check failed open there, since `readlink` gives
//! `ENAMETOOLONG`); case B is a plain outside directory. Both cases run
//! against each resolution strategy: `openat2` (when the kernel has it) and
//! the component walk used where it does not, so the walk is covered even
//! where `openat2` exists. Neither strategy uses `/proc` (see
//! `read_file_syscalls.rs`), so these runs stand for "no `/proc`" as well.

// A test may unwrap, expect, panic and index: a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(target_os = "linux")]

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::TempDir;
use subloop::tools::{ReadError, ReadFile, Resolution};

/// How many reads each race makes.
const READS: usize = 5000;

const INSIDE: &str = "inside content\n";
const SECRET: &str = "OUTSIDE SECRET\n";

fn cstr(text: &[u8]) -> CString {
    CString::new(text).expect("no NUL in test names")
}

fn last_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Opens `name` under `dir` as a directory.
fn open_dir_at(dir: &OwnedFd, name: &[u8]) -> OwnedFd {
    let name = cstr(name);
    // SAFETY: `name` is NUL-terminated and `dir` is an open descriptor.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0, "{}", last_error("openat"));
    // SAFETY: `fd` was just returned by `openat` and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn open_dir(path: &Path) -> OwnedFd {
    let path = cstr(path.as_os_str().as_bytes());
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0, "{}", last_error("open"));
    // SAFETY: `fd` was just returned by `open` and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn mkdir_at(dir: &OwnedFd, name: &[u8]) {
    let name = cstr(name);
    // SAFETY: `name` is NUL-terminated and `dir` is an open descriptor.
    let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) };
    assert_eq!(rc, 0, "{}", last_error("mkdirat"));
}

fn symlink_at(target: &[u8], dir: &OwnedFd, name: &[u8]) {
    let (target, name) = (cstr(target), cstr(name));
    // SAFETY: both strings are NUL-terminated and `dir` is an open descriptor.
    let rc = unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) };
    assert_eq!(rc, 0, "{}", last_error("symlinkat"));
}

fn write_at(dir: &OwnedFd, name: &[u8], content: &str) {
    let name = cstr(name);
    // SAFETY: `name` is NUL-terminated and `dir` is an open descriptor.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    assert!(fd >= 0, "{}", last_error("openat for writing"));
    // SAFETY: `fd` was just returned by `openat` and is owned by nobody else.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    std::io::Write::write_all(&mut &file, content.as_bytes()).expect("write");
}

/// Swaps `a` and `b` (both in `dir`) atomically.
fn exchange(dir: &OwnedFd, a: &CString, b: &CString) -> bool {
    // SAFETY: both names are NUL-terminated and `dir` is an open descriptor;
    // renameat2 takes (olddirfd, oldpath, newdirfd, newpath, flags).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            dir.as_raw_fd(),
            a.as_ptr(),
            dir.as_raw_fd(),
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    rc == 0
}

/// A temp dir holding `ws/` (with `ws/d/file.txt` and a symlink `ws/l` to an
/// outside directory that holds `file.txt` with the secret).
struct Race {
    tmp: TempDir,
    /// The outside directory's real path length in bytes.
    outside_len: usize,
}

impl Race {
    /// The outside directory is `outside/`, a short path.
    fn plain() -> Self {
        let tmp = TempDir::new("rf-race-plain");
        tmp.write("ws/d/file.txt", INSIDE);
        tmp.write("outside/file.txt", SECRET);
        let ws = open_dir(&tmp.path().join("ws"));
        symlink_at(b"../outside", &ws, b"l");
        let outside_len = tmp.path().join("outside").as_os_str().len();
        Self { tmp, outside_len }
    }

    /// The outside directory is 18 levels of 250-byte names deep: its real
    /// path is over 4096 bytes, so no single path string can name it. The
    /// symlink reaches it through two hops whose targets are each under 4096.
    fn long_path() -> Self {
        let tmp = TempDir::new("rf-race-long");
        tmp.write("ws/d/file.txt", INSIDE);
        let top = open_dir(tmp.path());
        mkdir_at(&top, b"deep");
        let name = vec![b'n'; 250];
        let mut dir = open_dir_at(&top, b"deep");
        let mut hop1 = b"deep".to_vec();
        let mut hop2 = Vec::new();
        let mut middle = None;
        for level in 0..18 {
            mkdir_at(&dir, &name);
            dir = open_dir_at(&dir, &name);
            let hop = if level < 9 { &mut hop1 } else { &mut hop2 };
            if !hop.is_empty() {
                hop.push(b'/');
            }
            hop.extend_from_slice(&name);
            if level == 8 {
                middle = Some(dir.try_clone().expect("dup"));
            }
        }
        write_at(&dir, b"file.txt", SECRET);
        // `hop1` (at the top) names the middle directory, which holds `hop2`
        // naming the bottom one, relative to itself.
        symlink_at(&hop2, &middle.expect("18 levels"), b"hop2");
        symlink_at(&hop1, &top, b"hop1");
        let ws = open_dir(&tmp.path().join("ws"));
        symlink_at(b"../hop1/hop2", &ws, b"l");
        let outside_len = tmp.path().join("deep").as_os_str().len() + 18 * 251;
        assert!(outside_len > 4096);
        Self { tmp, outside_len }
    }

    fn ws(&self) -> std::path::PathBuf {
        self.tmp.path().join("ws")
    }

    /// Races `READS` reads of `d/file.txt` against the swapping thread;
    /// returns (leaks, reads that saw the inside file, refusals, swaps), or
    /// `None` when the file system cannot exchange names.
    fn run(&self, reader: &ReadFile) -> Option<(usize, usize, usize, usize)> {
        // Before the race: the outside file is reachable through `l` by the
        // kernel (so a leak is possible), and `read_file` refuses it.
        let direct = std::fs::read_to_string(self.ws().join("l/file.txt"));
        assert_eq!(direct.as_deref().ok(), Some(SECRET), "setup: {direct:?}");
        assert_eq!(reader.read("l/file.txt"), Err(ReadError::OutsideWorkspace));
        assert_eq!(reader.read("d/file.txt").as_deref(), Ok(INSIDE));

        let ws = Arc::new(open_dir(&self.ws()));
        let (d, l) = (cstr(b"d"), cstr(b"l"));
        if !exchange(&ws, &d, &l) {
            common::skipped(last_error("renameat2(RENAME_EXCHANGE)"));
            return None;
        }
        assert!(exchange(&ws, &d, &l), "{}", last_error("renameat2"));
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicUsize::new(0));
        let swapper = {
            let (ws, stop, swaps) = (Arc::clone(&ws), Arc::clone(&stop), Arc::clone(&swaps));
            std::thread::spawn(move || {
                let (d, l) = (cstr(b"d"), cstr(b"l"));
                while !stop.load(Ordering::Relaxed) {
                    if exchange(&ws, &d, &l) {
                        swaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // Leave the tree as it was (an even number of swaps).
                if swaps.load(Ordering::Relaxed) % 2 == 1 {
                    assert!(exchange(&ws, &d, &l), "{}", last_error("renameat2"));
                }
            })
        };
        let (mut leaks, mut inside, mut refused) = (0, 0, 0);
        for _ in 0..READS {
            match reader.read("d/file.txt") {
                Ok(text) if text.contains("SECRET") => leaks += 1,
                Ok(text) => {
                    assert_eq!(text, INSIDE);
                    inside += 1;
                }
                Err(_) => refused += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().expect("the swapping thread");
        Some((leaks, inside, refused, swaps.load(Ordering::Relaxed)))
    }
}

fn check(race: &Race, reader: &ReadFile, label: &str) {
    let Some((leaks, inside, refused, swaps)) = race.run(reader) else {
        return;
    };
    eprintln!(
        "{label} (outside directory: {} bytes): {READS} reads, {leaks} leaks, {inside} inside, \
         {refused} refused, {swaps} swaps",
        race.outside_len
    );
    assert!(swaps > 0, "{label}: the swapping thread never swapped");
    assert_eq!(
        leaks, 0,
        "{label}: {leaks} of {READS} reads returned the outside file"
    );
}

fn reader(race: &Race, resolution: Resolution) -> Option<ReadFile> {
    match ReadFile::with_resolution(&race.ws(), ReadFile::DEFAULT_LIMIT, resolution) {
        Ok(reader) => Some(reader),
        Err(err) if resolution == Resolution::Openat2 => {
            common::skipped(format!("openat2 is not available here ({err})"));
            None
        }
        Err(err) => panic!("{err}"),
    }
}

#[test]
fn a_swapped_directory_never_leaks_an_outside_file_with_a_long_real_path() {
    let race = Race::long_path();
    let reader = ReadFile::new(&race.ws(), ReadFile::DEFAULT_LIMIT).unwrap();
    check(&race, &reader, "long path, default resolution");
}

#[test]
fn a_swapped_directory_never_leaks_an_outside_file() {
    let race = Race::plain();
    let reader = ReadFile::new(&race.ws(), ReadFile::DEFAULT_LIMIT).unwrap();
    check(&race, &reader, "plain, default resolution");
}

#[test]
fn the_walk_never_leaks_with_a_long_real_path() {
    let race = Race::long_path();
    let reader = reader(&race, Resolution::Walk).unwrap();
    check(&race, &reader, "long path, walk");
}

#[test]
fn the_walk_never_leaks() {
    let race = Race::plain();
    let reader = reader(&race, Resolution::Walk).unwrap();
    check(&race, &reader, "plain, walk");
}

#[test]
fn openat2_never_leaks_with_a_long_real_path() {
    let race = Race::long_path();
    if let Some(reader) = reader(&race, Resolution::Openat2) {
        check(&race, &reader, "long path, openat2");
    }
}

#[test]
fn openat2_never_leaks() {
    let race = Race::plain();
    if let Some(reader) = reader(&race, Resolution::Openat2) {
        check(&race, &reader, "plain, openat2");
    }
}
