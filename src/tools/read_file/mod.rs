//! `read_file {"path": string}`: a UTF-8 text file inside the workspace.
//!
//! Refused, without hanging: empty paths, paths with NUL or over 4096 bytes,
//! absolute paths, `..` that leaves the workspace, symlinks (at any level)
//! that lead outside it, missing files, and anything that is not a regular
//! file (directories, FIFOs, sockets, devices). `.` and `..` in the request
//! are applied to the text first; the rest is looked up beneath a handle on
//! the workspace directory (see `confine.rs`), so a directory swapped for a
//! symlink mid-lookup cannot lead out. The file is opened non-blocking and
//! checked on the open handle. At most `limit + 4` bytes are read, sized
//! from the file's length; a longer file is cut at a character boundary with
//! a last line saying how much is shown.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use thiserror::Error;

mod confine;

use crate::core::conversation::ToolOutput;
use crate::core::error::SetupError;
use crate::tools::{Capability, ReadOnlyTool, ToolContext, TypedTool};
pub use confine::Resolution;
use confine::Workspace;

/// The default read limit: 64 KiB.
pub(crate) const DEFAULT_READ_LIMIT: usize = 64 * 1024;

/// The largest read limit accepted: 1 GiB.
use crate::core::error::MAX_READ_LIMIT;

/// The longest path accepted, in bytes.
pub(crate) const MAX_PATH_BYTES: usize = 4096;

/// Why a file was not read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The path is empty.
    #[error("the path is empty")]
    Empty,
    /// The path holds a NUL byte.
    #[error("the path contains a NUL byte")]
    Nul,
    /// The path is longer than [`ReadFile::MAX_PATH_BYTES`].
    #[error("the path is {0} bytes long; the limit is 4096")]
    TooLong(usize),
    /// The path is absolute.
    #[error("absolute paths are refused; give a path relative to the workspace")]
    Absolute,
    /// `..` leads out of the workspace.
    #[error("the path leaves the workspace")]
    Escapes,
    /// A symlink leads out of the workspace.
    #[error("the path resolves outside the workspace (through a symlink)")]
    OutsideWorkspace,
    /// Too many levels of symlinks (a loop), or a symlink swapped in while opening.
    #[error("too many levels of symbolic links (a symlink loop?)")]
    SymlinkLoop,
    /// Nothing is there.
    #[error("no such file")]
    NotFound,
    /// Not a regular file.
    #[error("not a regular file: it is {0}")]
    NotRegular(&'static str),
    /// The content is not UTF-8.
    #[error("the file is not UTF-8 text")]
    NotUtf8,
    /// Another I/O error.
    #[error("{0}")]
    Io(String),
}

/// The `read_file` tool.
#[derive(Debug, Clone)]
pub struct ReadFile {
    root: PathBuf,
    limit: usize,
    /// The workspace directory handle every read is resolved beneath.
    workspace: Arc<Workspace>,
}

impl ReadFile {
    /// The default read limit: 64 KiB.
    pub const DEFAULT_LIMIT: usize = DEFAULT_READ_LIMIT;

    /// The largest `read_file` limit: 1 GiB.
    pub const MAX_LIMIT: usize = MAX_READ_LIMIT;

    /// The longest path accepted, in bytes.
    pub const MAX_PATH_BYTES: usize = MAX_PATH_BYTES;

    /// A reader confined to `workspace` (which must be a directory), showing at most `limit` bytes.
    pub fn new(workspace: &Path, limit: usize) -> Result<Self, SetupError> {
        Self::with_resolution(workspace, limit, Resolution::Auto)
    }

    /// Like [`ReadFile::new`], with the way paths are resolved chosen
    /// (mainly for tests of the fallback walk on kernels that have `openat2`).
    pub fn with_resolution(
        workspace: &Path,
        limit: usize,
        resolution: Resolution,
    ) -> Result<Self, SetupError> {
        let fail = |message: String| SetupError::Workspace {
            path: workspace.to_owned(),
            message,
        };
        let root = workspace_root(workspace)?;
        if !(1..=MAX_READ_LIMIT).contains(&limit) {
            return Err(SetupError::ReadLimit(limit));
        }
        let workspace = Workspace::open(&root, resolution).map_err(fail)?;
        Ok(Self {
            root,
            limit,
            workspace: Arc::new(workspace),
        })
    }

    /// The canonical workspace directory (as it was named when the reader was made).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How paths are resolved now: [`Resolution::Openat2`] or [`Resolution::Walk`].
    pub fn resolution(&self) -> Resolution {
        self.workspace.resolution()
    }

    /// Reads `path` (relative to the workspace) under every rule above.
    pub fn read(&self, path: &str) -> Result<String, ReadError> {
        let relative = normalize(path)?;
        let components: Vec<&[u8]> = relative
            .components()
            .map(|c| c.as_os_str().as_bytes())
            .collect();
        let (file, size) = self.workspace.open_file(&components)?;
        read_capped(&file, self.limit, size)
    }
}

/// Checks `path` and applies its `.` and `..` to the text: a relative path of plain names.
fn normalize(path: &str) -> Result<PathBuf, ReadError> {
    if path.is_empty() {
        return Err(ReadError::Empty);
    }
    if path.contains('\0') {
        return Err(ReadError::Nul);
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(ReadError::TooLong(path.len()));
    }
    let mut relative = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !relative.pop() {
                    return Err(ReadError::Escapes);
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err(ReadError::Absolute),
        }
    }
    if relative.as_os_str().is_empty() {
        return Err(ReadError::NotRegular("the workspace directory"));
    }
    Ok(relative)
}

/// Canonicalizes a workspace path and checks it is a directory.
pub(crate) fn workspace_root(workspace: &Path) -> Result<PathBuf, SetupError> {
    let fail = |message: String| SetupError::Workspace {
        path: workspace.to_owned(),
        message,
    };
    let root = std::fs::canonicalize(workspace).map_err(|err| fail(err.to_string()))?;
    if !root.is_dir() {
        return Err(fail("not a directory".to_owned()));
    }
    Ok(root)
}

/// Reads at most `limit + 4` bytes from `source` (whose full size is `size`).
fn read_capped(source: impl Read, limit: usize, size: u64) -> Result<String, ReadError> {
    let cap = limit.saturating_add(4);
    let buf = read_up_to(source, cap, size).map_err(|err| ReadError::Io(err.to_string()))?;
    if buf.len() <= limit {
        return String::from_utf8(buf).map_err(|_| ReadError::NotUtf8);
    }
    // Longer than the limit: keep the valid prefix, cut at a char boundary <= limit.
    let valid = match std::str::from_utf8(&buf) {
        Ok(text) => text,
        Err(err) if err.valid_up_to() >= limit => {
            std::str::from_utf8(buf.get(..err.valid_up_to()).unwrap_or_default())
                .unwrap_or_default()
        }
        Err(_) => return Err(ReadError::NotUtf8),
    };
    let mut cut = limit.min(valid.len());
    while !valid.is_char_boundary(cut) {
        cut -= 1;
    }
    let shown = valid.get(..cut).unwrap_or_default();
    let total = size.max(buf.len() as u64);
    Ok(format!(
        "{shown}\n[read_file: showing {cut} of {total} bytes; the rest is past the read limit]"
    ))
}

/// Reads at most `cap` bytes into a buffer sized from `size`: a file that is
/// still `size` bytes long takes one read when it holds `cap` bytes or more,
/// and two otherwise (the second one sees the end). The buffer is read into
/// as it is allocated (not zero-filled first), and it is the one the result
/// keeps: the text is never copied.
fn read_up_to(source: impl Read, cap: usize, size: u64) -> std::io::Result<Vec<u8>> {
    let first = usize::try_from(size)
        .unwrap_or(usize::MAX)
        .saturating_add(1)
        .min(cap);
    let mut buf = Vec::with_capacity(first);
    // `take` bounds every read by what is left of `cap`; a file that grew
    // since it was measured makes the buffer grow by doubling, so it holds
    // at most `cap` bytes in a capacity under twice that.
    source
        .take(u64::try_from(cap).unwrap_or(u64::MAX))
        .read_to_end(&mut buf)?;
    Ok(buf)
}

/// `read_file`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Path relative to the workspace root
    #[schemars(length(min = 1, max = MAX_PATH_BYTES))]
    pub path: String,
}

impl TypedTool for ReadFile {
    type Args = ReadFileArgs;

    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> &str {
        "Read a UTF-8 text file inside the workspace. The path is relative to the workspace root."
    }

    fn capability(&self) -> Capability {
        Capability::ReadOnly
    }

    fn run(&self, args: ReadFileArgs, _context: &ToolContext<'_>) -> ToolOutput {
        match self.read(&args.path) {
            Ok(text) => ToolOutput::ok(text),
            Err(err) => ToolOutput::error(format!("read_file `{}`: {err}", shorten(&args.path))),
        }
    }
}

impl ReadOnlyTool for ReadFile {}

/// The first 120 characters of `text`, for error messages, with control characters escaped.
fn shorten(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars().take(120) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if text.chars().count() > 120 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endless source that fails if asked for more than `allowed` bytes.
    struct Endless {
        served: u64,
        allowed: u64,
    }

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.served + buf.len() as u64 > self.allowed {
                return Err(std::io::Error::other(format!(
                    "asked for {} bytes past {} already served; the cap is {}",
                    buf.len(),
                    self.served,
                    self.allowed
                )));
            }
            buf.fill(b'a');
            self.served += buf.len() as u64;
            Ok(buf.len())
        }
    }

    #[test]
    fn never_reads_more_than_the_limit_plus_four_bytes() {
        for limit in [1usize, 7, 4096, 65_536] {
            let source = Endless {
                served: 0,
                allowed: limit as u64 + 4,
            };
            let text = read_capped(source, limit, 1 << 40).expect("capped read");
            let (shown, note) = text.rsplit_once('\n').expect("a note line");
            assert_eq!(shown.len(), limit);
            assert_eq!(
                note,
                format!(
                    "[read_file: showing {limit} of 1099511627776 bytes; the rest is past the read limit]"
                )
            );
        }
    }

    #[test]
    fn a_stale_size_neither_cuts_nor_pads_the_content() {
        let content = "x".repeat(10_000);
        for hint in [0u64, 1, 9_999, 10_000, 10_001, 1 << 40] {
            let read = read_up_to(content.as_bytes(), 1 << 20, hint).expect("read");
            assert_eq!(read, content.as_bytes(), "size hint {hint}");
            let capped = read_up_to(content.as_bytes(), 4_100, hint).expect("read");
            assert_eq!(capped.len(), 4_100, "size hint {hint}");
        }
    }

    #[test]
    fn error_paths_escape_only_control_characters() {
        assert_eq!(shorten("é\n\u{1b}[31m"), "é\\n\\u{1b}[31m");
    }

    #[test]
    fn read_limits_outside_one_byte_to_a_gibibyte_are_refused() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        assert!(ReadFile::new(here, 0).is_err());
        let err = ReadFile::new(here, MAX_READ_LIMIT + 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the read limit must be 1 to 1073741824 bytes (1 GiB), got 1073741825"
        );
        assert!(ReadFile::new(here, MAX_READ_LIMIT).is_ok());
    }
}
