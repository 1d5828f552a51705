//! `read_file` on real temporary files: every hostile path is refused with an
//! error, promptly, and the read limit cuts long files at a character boundary.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::TempDir;
use serde_json::json;
use subloop::tools::{DEFAULT_READ_LIMIT, ReadError, ReadFile, Tool, ToolContext};
use subloop::{AgentId, ToolCall};

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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
    assert_eq!(read_within(&reader, "hello.txt").unwrap(), "hello\n");
    assert_eq!(read_within(&reader, "./sub/inner.txt").unwrap(), "inner\n");
}

#[test]
fn absolute_paths_are_refused() {
    let fx = Fixture::new("rf-abs");
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
    assert_eq!(refused(&reader, "leak.txt"), ReadError::OutsideWorkspace);
    assert_eq!(refused(&reader, "leak2.txt"), ReadError::OutsideWorkspace);
}

#[test]
fn a_symlinked_directory_pointing_outside_is_refused() {
    let fx = Fixture::new("rf-dirlink-out");
    symlink(fx.outside(), fx.ws().join("link")).unwrap();
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
    assert_eq!(read_within(&reader, "alias.txt").unwrap(), "hello\n");
    assert_eq!(
        read_within(&reader, "subalias/inner.txt").unwrap(),
        "inner\n"
    );
}

#[test]
fn directories_are_refused() {
    let fx = Fixture::new("rf-dir");
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
    assert_eq!(refused(&reader, "sock"), ReadError::NotRegular("a socket"));
}

#[test]
fn devices_are_refused() {
    let fx = Fixture::new("rf-dev");
    symlink("/dev/null", fx.ws().join("null")).unwrap();
    symlink("/dev/zero", fx.ws().join("zero")).unwrap();
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
        let context = ToolContext {
            agent: &AgentId::Parent,
            call: &call,
        };
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
    let reader = ReadFile::new(Path::new("/dev"), DEFAULT_READ_LIMIT).unwrap();
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
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
    let reader = fx.reader(DEFAULT_READ_LIMIT);
    let run = |path: &str| {
        let call = ToolCall::new("t1", "read_file", json!({ "path": path }));
        let context = ToolContext {
            agent: &AgentId::Parent,
            call: &call,
        };
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
