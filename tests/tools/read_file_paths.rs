//! `read_file` on real temporary files: every hostile path is refused with an
//! error, promptly, and the read limit cuts long files at a character boundary.

use crate::common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::TempDir;
use serde_json::json;
use subloop::core::agent_id::AgentId;
use subloop::core::conversation::ToolCall;
use subloop::tools::{ReadError, ReadFile, Resolution, Tool, ToolContext};

/// A workspace `ws/` inside a temp dir, with `outside/secret.txt` next to it.
struct Fixture {
    tmp: TempDir,
}

impl Fixture {
    fn new(tag: &str) -> Self {
        let tmp = TempDir::new(tag);
        tmp.write("ws/hello.txt", "hello\n");
        tmp.write("ws/sub/inner.txt", "inner\n");
        tmp.write("outside/secret.txt", "TOP SECRET\n");
        Self { tmp }
    }

    fn ws(&self) -> std::path::PathBuf {
        self.tmp.path().join("ws")
    }

    fn outside(&self) -> std::path::PathBuf {
        self.tmp.path().join("outside")
    }

    fn reader(&self, limit: usize) -> ReadFile {
        ReadFile::new(&self.ws(), limit).expect("workspace is a directory")
    }
}

/// Reads `path` on another thread; fails the test if it takes more than 5 s.
fn read_within(reader: &ReadFile, path: &str) -> Result<String, ReadError> {
    let (tx, rx) = mpsc::channel();
    let reader = reader.clone();
    let owned = path.to_owned();
    std::thread::spawn(move || {
        let _ = tx.send(reader.read(&owned));
    });
    rx.recv_timeout(Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("read_file {path:?} did not return within 5 s"))
}

fn refused(reader: &ReadFile, path: &str) -> ReadError {
    match read_within(reader, path) {
        Ok(text) => panic!("{path:?} was read, got {} bytes", text.len()),
        Err(err) => err,
    }
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("no NUL in temp path");
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    assert_eq!(rc, 0, "mkfifo failed: {}", std::io::Error::last_os_error());
}

#[test]
fn a_plain_file_inside_is_read() {
    let fx = Fixture::new("rf-plain");
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(read_within(&reader, "hello.txt").unwrap(), "hello\n");
    assert_eq!(read_within(&reader, "./sub/inner.txt").unwrap(), "inner\n");
}

#[test]
fn absolute_paths_are_refused() {
    let fx = Fixture::new("rf-abs");
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(refused(&reader, "/etc/passwd"), ReadError::Absolute);
    // Even an absolute path that points into the workspace itself.
    let inside = fx.ws().join("hello.txt");
    assert_eq!(
        refused(&reader, inside.to_str().unwrap()),
        ReadError::Absolute
    );
}

#[test]
fn dotdot_leaving_the_workspace_is_refused() {
    let fx = Fixture::new("rf-dotdot");
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(
        refused(&reader, "../outside/secret.txt"),
        ReadError::Escapes
    );
    assert_eq!(refused(&reader, "a/../../x"), ReadError::Escapes);
    assert_eq!(
        refused(&reader, "sub/../../outside/secret.txt"),
        ReadError::Escapes
    );
    assert_eq!(refused(&reader, ".."), ReadError::Escapes);
}

#[test]
fn dotdot_that_stays_inside_is_fine() {
    let fx = Fixture::new("rf-dotdot-in");
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(read_within(&reader, "sub/../hello.txt").unwrap(), "hello\n");
    assert_eq!(
        read_within(&reader, "sub/./../sub/inner.txt").unwrap(),
        "inner\n"
    );
}

#[test]
fn a_symlink_to_a_file_outside_is_refused() {
    let fx = Fixture::new("rf-link-out");
    symlink(fx.outside().join("secret.txt"), fx.ws().join("leak.txt")).unwrap();
    // A relative symlink target too.
    symlink("../outside/secret.txt", fx.ws().join("leak2.txt")).unwrap();
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(refused(&reader, "leak.txt"), ReadError::OutsideWorkspace);
    assert_eq!(refused(&reader, "leak2.txt"), ReadError::OutsideWorkspace);
}

#[test]
fn a_symlinked_directory_pointing_outside_is_refused() {
    let fx = Fixture::new("rf-dirlink-out");
    symlink(fx.outside(), fx.ws().join("link")).unwrap();
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(
        refused(&reader, "link/secret.txt"),
        ReadError::OutsideWorkspace
    );
    // A symlink deeper in the tree as well.
    symlink(fx.outside(), fx.ws().join("sub/deep")).unwrap();
    assert_eq!(
        refused(&reader, "sub/deep/secret.txt"),
        ReadError::OutsideWorkspace
    );
}

#[test]
fn symlinks_inside_pointing_inside_are_fine() {
    let fx = Fixture::new("rf-link-in");
    symlink("hello.txt", fx.ws().join("alias.txt")).unwrap();
    symlink("sub", fx.ws().join("subalias")).unwrap();
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(read_within(&reader, "alias.txt").unwrap(), "hello\n");
    assert_eq!(
        read_within(&reader, "subalias/inner.txt").unwrap(),
        "inner\n"
    );
}

#[test]
fn directories_are_refused() {
    let fx = Fixture::new("rf-dir");
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(
        refused(&reader, "sub"),
        ReadError::NotRegular("a directory")
    );
    assert_eq!(
        refused(&reader, "sub/"),
        ReadError::NotRegular("a directory")
    );
    assert!(matches!(refused(&reader, "."), ReadError::NotRegular(_)));
}

#[test]
fn a_fifo_is_refused_without_hanging() {
    let fx = Fixture::new("rf-fifo");
    mkfifo(&fx.ws().join("pipe"));
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    let started = Instant::now();
    assert_eq!(refused(&reader, "pipe"), ReadError::NotRegular("a FIFO"));
    assert!(started.elapsed() < Duration::from_secs(5));
    // A symlink inside pointing at the FIFO is refused the same way.
    symlink("pipe", fx.ws().join("pipe-alias")).unwrap();
    assert_eq!(
        refused(&reader, "pipe-alias"),
        ReadError::NotRegular("a FIFO")
    );
}

#[test]
fn a_unix_socket_is_refused() {
    let fx = Fixture::new("rf-sock");
    let _listener = std::os::unix::net::UnixListener::bind(fx.ws().join("sock")).unwrap();
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(refused(&reader, "sock"), ReadError::NotRegular("a socket"));
}

#[test]
fn devices_are_refused() {
    let fx = Fixture::new("rf-dev");
    symlink("/dev/null", fx.ws().join("null")).unwrap();
    symlink("/dev/zero", fx.ws().join("zero")).unwrap();
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    for path in ["null", "zero"] {
        let err = refused(&reader, path);
        assert!(
            matches!(
                err,
                ReadError::OutsideWorkspace | ReadError::NotRegular("a device")
            ),
            "{path}: {err:?}"
        );
    }
    // Through the tool as well: an error result, promptly.
    let call = ToolCall::new("t1", "read_file", json!({"path": "zero"}));
    let (tx, rx) = mpsc::channel();
    let tool = reader.clone();
    std::thread::spawn(move || {
        let span = tracing::Span::none();
        let context = ToolContext::new(&AgentId::Parent, &call, &span);
        let _ = tx.send(tool.run(call.input(), &context));
    });
    let output = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("read_file on a symlink to /dev/zero did not return within 5 s");
    assert!(output.is_error, "{output:?}");
    assert!(
        output.content.starts_with("read_file `zero`: "),
        "{output:?}"
    );
}

#[test]
fn a_device_inside_the_workspace_is_refused_as_a_device() {
    // With `/dev` as the workspace, the devices are inside it: only the type check stops them.
    let reader = ReadFile::new(Path::new("/dev"), ReadFile::DEFAULT_LIMIT).unwrap();
    assert_eq!(refused(&reader, "null"), ReadError::NotRegular("a device"));
    assert_eq!(refused(&reader, "zero"), ReadError::NotRegular("a device"));
    assert_eq!(
        refused(&reader, "./urandom"),
        ReadError::NotRegular("a device")
    );
}

#[test]
fn nul_bytes_and_overlong_paths_are_refused() {
    let fx = Fixture::new("rf-nul");
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(refused(&reader, "hello.txt\0"), ReadError::Nul);
    assert_eq!(refused(&reader, "a\0/../hello.txt"), ReadError::Nul);
    let long = "a/".repeat(2100) + "hello.txt";
    assert!(long.len() > 4096);
    assert_eq!(refused(&reader, &long), ReadError::TooLong(long.len()));
    let just_over = "x".repeat(4097);
    assert_eq!(refused(&reader, &just_over), ReadError::TooLong(4097));
    assert_eq!(refused(&reader, ""), ReadError::Empty);
}

#[test]
fn missing_files_are_refused() {
    let fx = Fixture::new("rf-missing");
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(refused(&reader, "nope.txt"), ReadError::NotFound);
    assert_eq!(refused(&reader, "sub/nope/deeper.txt"), ReadError::NotFound);
    // A dangling symlink inside is missing too.
    symlink("gone.txt", fx.ws().join("dangling")).unwrap();
    assert_eq!(refused(&reader, "dangling"), ReadError::NotFound);
}

#[test]
fn non_utf8_content_is_refused() {
    let fx = Fixture::new("rf-utf8");
    fx.tmp.write("ws/latin1.txt", b"caf\xe9\n");
    fx.tmp.write("ws/bin.dat", [0xffu8, 0xfe, 0x00, 0x80]);
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    assert_eq!(refused(&reader, "latin1.txt"), ReadError::NotUtf8);
    assert_eq!(refused(&reader, "bin.dat"), ReadError::NotUtf8);
}

/// Splits a cut result into (shown text, N, M).
fn parse_cut(text: &str) -> (&str, usize, u64) {
    let (shown, last) = text
        .rsplit_once('\n')
        .unwrap_or_else(|| panic!("no last line in {text:?}"));
    let rest = last
        .strip_prefix("[read_file: showing ")
        .unwrap_or_else(|| panic!("unexpected last line {last:?}"));
    let (n, rest) = rest.split_once(" of ").expect("`of` in last line");
    let (m, rest) = rest.split_once(" bytes; ").expect("`bytes;` in last line");
    assert!(rest.ends_with(']'), "{last:?}");
    (shown, n.parse().unwrap(), m.parse().unwrap())
}

#[test]
fn a_long_file_is_cut_at_a_character_boundary() {
    let fx = Fixture::new("rf-cut");
    // 'é' is 2 bytes, '😀' is 4: with limit 10, byte 10 falls inside an emoji.
    let content = "ab\u{e9}\u{1F600}\u{1F600}\u{1F600}tail\n";
    assert_eq!(content.len(), 2 + 2 + 12 + 5);
    assert!(!content.is_char_boundary(10));
    fx.tmp.write("ws/multi.txt", content);
    let reader = fx.reader(10);
    let text = read_within(&reader, "multi.txt").unwrap();
    let (shown, n, m) = parse_cut(&text);
    assert_eq!(shown, "ab\u{e9}\u{1F600}");
    assert_eq!(n, 8);
    assert!(n <= 10);
    assert_eq!(m, content.len() as u64);
    assert!(content.starts_with(shown));

    // Every limit over the same file: a prefix that ends on a char boundary, N <= limit.
    for limit in 1..content.len() {
        let text = read_within(&fx.reader(limit), "multi.txt").unwrap();
        let (shown, n, m) = parse_cut(&text);
        assert!(n <= limit, "limit {limit}: N = {n}");
        assert_eq!(shown.len(), n, "limit {limit}");
        assert!(content.starts_with(shown), "limit {limit}: {shown:?}");
        assert!(
            content.is_char_boundary(limit) == (n == limit),
            "limit {limit}: N = {n}"
        );
        assert!(limit - n < 4, "limit {limit}: cut too much ({n})");
        assert_eq!(m, content.len() as u64);
    }
}

#[test]
fn a_file_exactly_at_the_limit_is_returned_whole() {
    let fx = Fixture::new("rf-exact");
    let content = "0123456789\u{e9}xyz\n"; // 16 bytes
    assert_eq!(content.len(), 16);
    fx.tmp.write("ws/exact.txt", content);
    assert_eq!(read_within(&fx.reader(16), "exact.txt").unwrap(), content);
    // One byte less and it is cut.
    let text = read_within(&fx.reader(15), "exact.txt").unwrap();
    let (shown, n, m) = parse_cut(&text);
    assert_eq!((shown, n, m), ("0123456789\u{e9}xyz", 15, 16));
}

#[test]
fn a_20_mb_file_with_limit_16_returns_quickly() {
    let fx = Fixture::new("rf-big");
    let size = 20 * 1024 * 1024;
    let mut content = "\u{e9}".repeat(size / 2).into_bytes(); // 'é' everywhere: boundaries on even bytes
    content.truncate(size);
    fx.tmp.write("ws/big.txt", &content);
    let reader = fx.reader(15);
    let started = Instant::now();
    let text = read_within(&reader, "big.txt").unwrap();
    let (shown, n, m) = parse_cut(&text);
    assert_eq!(shown, "\u{e9}".repeat(7));
    assert_eq!(n, 14);
    assert_eq!(m, size as u64);
    let reader = fx.reader(16);
    let text = read_within(&reader, "big.txt").unwrap();
    let (shown, n, m) = parse_cut(&text);
    assert_eq!(shown, "\u{e9}".repeat(8));
    assert_eq!((n, m), (16, size as u64));
    // Generous: reading 20 MB would still be fast, but never a few seconds.
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn errors_through_the_tool_are_error_results() {
    let fx = Fixture::new("rf-tool");
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    let run = |path: &str| {
        let call = ToolCall::new("t1", "read_file", json!({ "path": path }));
        let span = tracing::Span::none();
        let context = ToolContext::new(&AgentId::Parent, &call, &span);
        reader.run(call.input(), &context)
    };
    let out = run("../outside/secret.txt");
    assert!(out.is_error);
    assert_eq!(
        out.content,
        "read_file `../outside/secret.txt`: the path leaves the workspace"
    );
    assert!(!out.content.contains("TOP SECRET"));
    let out = run("sub");
    assert!(out.is_error);
    assert_eq!(
        out.content,
        "read_file `sub`: not a regular file: it is a directory"
    );
    let out = run("hello.txt");
    assert!(!out.is_error);
    assert_eq!(out.content, "hello\n");
    assert_eq!(reader.name(), "read_file");
}

#[test]
fn a_bad_workspace_or_zero_limit_is_a_setup_error() {
    let fx = Fixture::new("rf-setup");
    assert!(ReadFile::new(&fx.ws().join("hello.txt"), 10).is_err());
    assert!(ReadFile::new(&fx.tmp.path().join("missing"), 10).is_err());
    assert!(ReadFile::new(&fx.ws(), 0).is_err());
}

/// The readers to test: the component walk, and `openat2` where the kernel has it.
fn both_resolutions(ws: &Path) -> Vec<(Resolution, ReadFile)> {
    let mut readers = vec![(
        Resolution::Walk,
        ReadFile::with_resolution(ws, ReadFile::DEFAULT_LIMIT, Resolution::Walk).unwrap(),
    )];
    match ReadFile::with_resolution(ws, ReadFile::DEFAULT_LIMIT, Resolution::Openat2) {
        Ok(reader) => readers.push((Resolution::Openat2, reader)),
        Err(err) => common::skipped(format!("openat2 cases: {err}")),
    }
    readers
}

#[test]
fn the_walk_and_openat2_give_the_same_answers() {
    let fx = Fixture::new("rf-both");
    let ws = fx.ws();
    symlink("hello.txt", ws.join("alias.txt")).unwrap();
    symlink("alias.txt", ws.join("chain")).unwrap();
    symlink("sub", ws.join("subalias")).unwrap();
    symlink("../hello.txt", ws.join("sub/up")).unwrap();
    symlink("sub/..", ws.join("dotdir")).unwrap();
    symlink(".", ws.join("self")).unwrap();
    symlink(fx.outside().join("secret.txt"), ws.join("leak.txt")).unwrap();
    symlink("../outside/secret.txt", ws.join("leak2.txt")).unwrap();
    symlink(fx.outside(), ws.join("link")).unwrap();
    symlink("../../outside", ws.join("sub/deep")).unwrap();
    // Pointing back inside, but by leaving first: refused (see the README).
    symlink(ws.join("hello.txt"), ws.join("absolute-in")).unwrap();
    symlink("../ws/hello.txt", ws.join("round-trip")).unwrap();
    symlink("loop2", ws.join("loop1")).unwrap();
    symlink("loop1", ws.join("loop2")).unwrap();
    symlink("gone.txt", ws.join("dangling")).unwrap();
    mkfifo(&ws.join("pipe"));
    symlink("pipe", ws.join("pipe-alias")).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
    symlink("sock", ws.join("sock-alias")).unwrap();

    let hello = || Ok("hello\n".to_owned());
    let inner = || Ok("inner\n".to_owned());
    let ten_hops = "self/".repeat(10) + "hello.txt";
    let too_many_hops = "self/".repeat(41) + "hello.txt";
    let cases: Vec<(&str, Result<String, ReadError>)> = vec![
        ("hello.txt", hello()),
        ("./sub/inner.txt", inner()),
        ("sub/../hello.txt", hello()),
        ("alias.txt", hello()),
        ("chain", hello()),
        ("subalias/inner.txt", inner()),
        ("subalias/../hello.txt", hello()),
        ("sub/up", hello()),
        ("link/../hello.txt", hello()),
        (&ten_hops, hello()),
        ("leak.txt", Err(ReadError::OutsideWorkspace)),
        ("leak2.txt", Err(ReadError::OutsideWorkspace)),
        ("link/secret.txt", Err(ReadError::OutsideWorkspace)),
        ("sub/deep/secret.txt", Err(ReadError::OutsideWorkspace)),
        ("absolute-in", Err(ReadError::OutsideWorkspace)),
        ("round-trip", Err(ReadError::OutsideWorkspace)),
        ("loop1", Err(ReadError::SymlinkLoop)),
        (&too_many_hops, Err(ReadError::SymlinkLoop)),
        ("sub", Err(ReadError::NotRegular("a directory"))),
        ("dotdir", Err(ReadError::NotRegular("a directory"))),
        ("pipe", Err(ReadError::NotRegular("a FIFO"))),
        ("pipe-alias", Err(ReadError::NotRegular("a FIFO"))),
        ("sock", Err(ReadError::NotRegular("a socket"))),
        ("sock-alias", Err(ReadError::NotRegular("a socket"))),
        ("nope.txt", Err(ReadError::NotFound)),
        ("sub/nope/deeper.txt", Err(ReadError::NotFound)),
        ("dangling", Err(ReadError::NotFound)),
        (
            "hello.txt/x",
            Err(ReadError::Io(
                std::io::Error::from_raw_os_error(libc::ENOTDIR).to_string(),
            )),
        ),
        ("../outside/secret.txt", Err(ReadError::Escapes)),
        ("/etc/passwd", Err(ReadError::Absolute)),
    ];
    for (resolution, reader) in both_resolutions(&ws) {
        assert_eq!(reader.resolution(), resolution);
        for (path, expected) in &cases {
            assert_eq!(
                &read_within(&reader, path),
                expected,
                "{resolution:?}: {path}"
            );
        }
    }
}

#[test]
fn the_default_resolution_is_openat2_where_the_kernel_has_it() {
    let fx = Fixture::new("rf-default");
    let reader = fx.reader(ReadFile::DEFAULT_LIMIT);
    let kernel = ReadFile::with_resolution(&fx.ws(), 16, Resolution::Openat2).is_ok();
    let expected = if kernel {
        Resolution::Openat2
    } else {
        Resolution::Walk
    };
    assert_eq!(reader.resolution(), expected);
}

/// Makes `openat2` fail with `errno` on the calling thread (and threads it starts).
#[cfg(target_os = "linux")]
fn refuse_openat2_on_this_thread(errno: u32) {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let mut filter = [
        // Load the syscall number (offset 0 of `seccomp_data`).
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_openat2 as u32,
        },
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | errno),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: plain prctl calls; `program` points at `filter`, both alive for the call.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog
            ),
            0,
            "seccomp: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(target_os = "linux")]
#[test]
fn openat2_refused_by_seccomp_falls_back_to_the_walk_and_stays_there() {
    let fx = Fixture::new("rf-seccomp");
    symlink(fx.outside(), fx.ws().join("link")).unwrap();
    let Ok(forced) = ReadFile::with_resolution(&fx.ws(), 64, Resolution::Openat2) else {
        common::skipped("openat2 is not available here");
        return;
    };
    for errno in [libc::ENOSYS, libc::EPERM] {
        let auto = fx.reader(64);
        let forced = forced.clone();
        let ws = fx.ws();
        // The filter stays on the thread that installs it: a thread of its own.
        std::thread::spawn(move || {
            assert_eq!(auto.resolution(), Resolution::Openat2);
            refuse_openat2_on_this_thread(errno as u32);
            // The first read meets the refusal, switches and still answers.
            assert_eq!(auto.read("sub/inner.txt").as_deref(), Ok("inner\n"));
            assert_eq!(auto.resolution(), Resolution::Walk);
            assert_eq!(
                auto.read("link/secret.txt"),
                Err(ReadError::OutsideWorkspace)
            );
            assert_eq!(auto.read("hello.txt").as_deref(), Ok("hello\n"));
            // A reader made under the filter walks from the start.
            let late = ReadFile::new(&ws, 64).unwrap();
            assert_eq!(late.resolution(), Resolution::Walk);
            assert_eq!(late.read("hello.txt").as_deref(), Ok("hello\n"));
            // Forced openat2 fails closed instead.
            assert!(matches!(forced.read("hello.txt"), Err(ReadError::Io(_))));
            assert!(ReadFile::with_resolution(&ws, 64, Resolution::Openat2).is_err());
        })
        .join()
        .expect("the filtered thread");
    }
}
