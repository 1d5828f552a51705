//! Where a trace may be written: never onto the script, never inside the
//! workspace (a program run there could read the record, and `--trace
//! ws/main.py` would overwrite the program), never a FIFO or a socket
//! (opening one blocks). Regular files outside the workspace and character
//! devices such as `/dev/null` are fine.
//!
//! A regular trace file is locked (`flock`, exclusive) while it is written:
//! a second run given the same file, or a `--resume` of a run still going,
//! is refused instead of interleaving its lines.
//!
//! Every check happens before the file is changed: a refused path is left
//! exactly as it was (not created, not truncated). The file is opened with
//! `O_NONBLOCK`, so a path swapped for a FIFO after the checks cannot block
//! the open, and the opened handle is checked again.

use std::fs::{File, Metadata};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Which file a run writes, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRole {
    /// The JSON Lines trace (`--trace`).
    Trace,
    /// The HTML view of the run (`--view`).
    Page,
}

impl std::fmt::Display for FileRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Trace => "trace file",
            Self::Page => "view page",
        })
    }
}

/// Why a trace path (or another file a run writes) was refused.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TraceTargetError {
    /// The path names a file the run reads, such as the script.
    #[error("the {what} {path} is the {kind} {protected}: writing the {what} would overwrite it")]
    Protected {
        /// The path.
        path: PathBuf,
        /// Which file it is.
        what: FileRole,
        /// The file it is the same as.
        protected: PathBuf,
        /// What that file is (`script`, `trace file`).
        kind: &'static str,
    },
    /// The path is inside the workspace.
    #[error(
        "the {what} {path} is inside the workspace {workspace}: a program run there could read or change it; write the trace outside the workspace"
    )]
    InWorkspace {
        /// The path.
        path: PathBuf,
        /// Which file it is.
        what: FileRole,
        /// The workspace.
        workspace: PathBuf,
    },
    /// The path is not a regular file or a character device.
    #[error("the {what} {path} is {kind}: give a regular file (or /dev/null)")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// Which file it is.
        what: FileRole,
        /// What it is instead (`a FIFO`, `a socket`, ...).
        kind: &'static str,
    },
    /// The file has other names, one of which may be inside the workspace.
    #[error(
        "the {what} {path} has {links} hard links: it may be another name of a workspace file; give a fresh file"
    )]
    Linked {
        /// The path.
        path: PathBuf,
        /// Which file it is.
        what: FileRole,
        /// Its link count.
        links: u64,
    },
    /// A symbolic link that points nowhere (creating the trace would create its target).
    #[error("the {what} {path} is a dangling symbolic link")]
    Dangling {
        /// The path.
        path: PathBuf,
        /// Which file it is.
        what: FileRole,
    },
    /// The path changed between the checks and the open.
    #[error("the {what} {path} changed while it was being opened")]
    Changed {
        /// The path.
        path: PathBuf,
        /// Which file it is.
        what: FileRole,
    },
    /// Another process is writing this trace (it holds the file's lock).
    #[error(
        "the {what} {path} is being written by another run (it holds the file's lock): wait for it to finish, or give another file"
    )]
    Busy {
        /// The path.
        path: PathBuf,
        /// Which file it is.
        what: FileRole,
    },
    /// The file could not be inspected or opened.
    #[error("cannot create {what} {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Which file it is.
        what: FileRole,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What a file type is, when a trace may not be written to it.
fn refused_kind(meta: &Metadata) -> Option<&'static str> {
    let kind = meta.file_type();
    if kind.is_file() || kind.is_char_device() {
        None
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_block_device() {
        Some("a block device")
    } else {
        Some("not a regular file")
    }
}

fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Opens `path` for a trace after checking that it is none of `protected`
/// (compared by device and inode) and not inside `workspace` (compared as
/// canonical paths), and that it is a regular file or a character device.
/// A regular file is truncated only after every check passed.
pub(crate) fn open(
    path: &Path,
    workspace: &Path,
    protected: &[(&Path, &'static str)],
) -> Result<File, TraceTargetError> {
    open_at(path, Some(workspace), protected, 0, FileRole::Trace)
}

/// [`open`] for another file a run writes (the `--view` page), with the same
/// checks (the workspace one only when there is a workspace); errors name
/// it as `what`. The file is locked like a trace, so two runs cannot write
/// one page at once, and its content is kept: the writer replaces it only
/// when it has the new content (a run that fails or is killed leaves the
/// old page).
pub(crate) fn open_output(
    path: &Path,
    workspace: Option<&Path>,
    protected: &[(&Path, &'static str)],
    what: FileRole,
) -> Result<File, TraceTargetError> {
    open_at(path, workspace, protected, KEEP_ALL, what)
}

/// `keep` for a file whose content stays as it is.
const KEEP_ALL: u64 = u64::MAX;

/// Creates a fresh file for a temporary trace in the temporary directory:
/// a new name (never an existing file or link), readable by its owner only.
pub(crate) fn create_private(prefix: &str) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::OpenOptionsExt as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut last = None;
    for _ in 0..16 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{nanos}-{}.jsonl",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(_) => return Ok(path),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => last = Some(err),
            Err(err) => return Err(err),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no fresh name")))
}

/// Opens a trace about to be resumed, with the checks of
/// `TraceWriter::open` and the lock taken, but for
/// reading too and left as it is. The
/// trace is read through this file, after the lock: a second resume of the
/// same trace is refused before it reads a byte, so two resumes cannot
/// both go on from the same point.
pub fn open_to_resume(
    path: &Path,
    workspace: &Path,
    protected: &[(&Path, &'static str)],
) -> Result<File, TraceTargetError> {
    open_with(
        path,
        Some(workspace),
        protected,
        KEEP_ALL,
        FileRole::Trace,
        true,
    )
}

fn open_at(
    path: &Path,
    workspace: Option<&Path>,
    protected: &[(&Path, &'static str)],
    keep: u64,
    what: FileRole,
) -> Result<File, TraceTargetError> {
    open_with(path, workspace, protected, keep, what, false)
}

fn open_with(
    path: &Path,
    workspace: Option<&Path>,
    protected: &[(&Path, &'static str)],
    keep: u64,
    what: FileRole,
    read: bool,
) -> Result<File, TraceTargetError> {
    let io = |source| TraceTargetError::Io {
        path: path.to_owned(),
        what,
        source,
    };
    let workspace_root = match workspace {
        Some(workspace) => Some((workspace, std::fs::canonicalize(workspace).map_err(io)?)),
        None => None,
    };
    let inside = |candidate: &Path| -> Result<(), TraceTargetError> {
        let Some((workspace, root)) = &workspace_root else {
            return Ok(());
        };
        match std::fs::canonicalize(candidate) {
            Ok(real) if real.starts_with(root) => Err(TraceTargetError::InWorkspace {
                path: path.to_owned(),
                what,
                workspace: workspace.to_path_buf(),
            }),
            Ok(_) => Ok(()),
            Err(source) => Err(io(source)),
        }
    };
    let before = match std::fs::metadata(path) {
        Ok(meta) => {
            if let Some(kind) = refused_kind(&meta) {
                return Err(TraceTargetError::NotAFile {
                    path: path.to_owned(),
                    what,
                    kind,
                });
            }
            for &(file, kind) in protected {
                if std::fs::metadata(file).is_ok_and(|other| same_file(&meta, &other)) {
                    return Err(TraceTargetError::Protected {
                        path: path.to_owned(),
                        what,
                        protected: file.to_path_buf(),
                        kind,
                    });
                }
            }
            inside(path)?;
            if meta.is_file() && meta.nlink() > 1 {
                return Err(TraceTargetError::Linked {
                    path: path.to_owned(),
                    what,
                    links: meta.nlink(),
                });
            }
            Some(meta)
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(TraceTargetError::Dangling {
                    path: path.to_owned(),
                    what,
                });
            }
            let parent = match path.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent,
                _ => Path::new("."),
            };
            inside(parent)?;
            None
        }
        Err(err) => return Err(io(err)),
    };
    let file = std::fs::OpenOptions::new()
        .read(read)
        .write(true)
        .create(!read)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let opened = file.metadata().map_err(io)?;
    if let Some(kind) = refused_kind(&opened) {
        return Err(TraceTargetError::NotAFile {
            path: path.to_owned(),
            what,
            kind,
        });
    }
    match &before {
        Some(before) if !same_file(before, &opened) => {
            return Err(TraceTargetError::Changed {
                path: path.to_owned(),
                what,
            });
        }
        Some(_) => {}
        // Created just now: make sure the name did not lead into the workspace after all.
        None => {
            if let Err(err) = inside(path) {
                let _ = std::fs::remove_file(path);
                return Err(err);
            }
        }
    }
    if opened.is_file() {
        use std::io::Seek;
        // One writer per trace: a run still writing it (or a second
        // `--resume` of it) holds the lock until it ends, SIGKILL included.
        if let Err(err) = lock_soon(&file) {
            return Err(if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                TraceTargetError::Busy {
                    path: path.to_owned(),
                    what,
                }
            } else {
                io(err)
            });
        }
        let mut file = &file;
        if keep != KEEP_ALL {
            file.set_len(keep).map_err(io)?;
        }
        // A file opened to be read first is read from its start.
        if !read {
            file.seek(std::io::SeekFrom::End(0)).map_err(io)?;
        }
    }
    // Writes block as usual from here on.
    // SAFETY: fcntl(2) on a descriptor this function owns.
    unsafe {
        let fd = file.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
    }
    Ok(file)
}

/// Takes the file's lock, waiting at most a moment for it: a process this
/// one is starting holds a copy of every open file for the instant between
/// its fork and its exec, and with it the lock of a trace just closed. A
/// run that really holds the lock holds it far longer.
fn lock_soon(file: &File) -> std::io::Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
    loop {
        // SAFETY: flock(2) on a descriptor the caller owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) || std::time::Instant::now() >= until {
            return Err(err);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(test)]
mod private_tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_temporary_file_is_fresh_and_only_its_owners() {
        let a = super::create_private("subloop-unit").expect("create");
        let b = super::create_private("subloop-unit").expect("create");
        assert_ne!(a, b);
        let mode = std::fs::metadata(&a).expect("meta").permissions().mode() & 0o777;
        let _ = std::fs::remove_file(&a);
        let _ = std::fs::remove_file(&b);
        assert_eq!(mode, 0o600);
    }
}
