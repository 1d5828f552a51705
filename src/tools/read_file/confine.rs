//! Opening a file beneath a workspace directory handle, with no path string
//! checks and no `/proc`.
//!
//! The workspace is opened once as a directory descriptor. Each request is
//! resolved relative to that descriptor, either by the kernel
//! (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, Linux ≥ 5.6) or
//! by walking the path one component at a time with
//! `openat(…, O_NOFOLLOW | O_DIRECTORY)`, reading every symlink met on the way
//! with `readlinkat` and following it only while it stays beneath the
//! workspace. Either way no component is ever looked up by a name outside
//! the workspace, so swapping a directory for a symlink mid-lookup can only
//! make the read fail, never leave. Every check that cannot be completed
//! refuses the read.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
#[cfg(target_os = "linux")]
use std::sync::atomic::{AtomicBool, Ordering};

use super::ReadError;

/// How `read_file` resolves a path beneath the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// `openat2` where the kernel has it (probed once; a later `ENOSYS` or
    /// `EPERM` from a seccomp filter switches to the walk for good), the walk
    /// elsewhere.
    Auto,
    /// Always `openat2` (Linux ≥ 5.6); refused at construction where it is
    /// unavailable, and a read fails if it becomes unavailable later.
    Openat2,
    /// Always the component walk, even where `openat2` exists.
    Walk,
}

/// At most this many symlinks are followed in one lookup (the kernel's limit too).
const MAX_HOPS: usize = 40;

/// Flags for the final open: read-only, never blocking on a FIFO or device,
/// never taking a controlling terminal.
const FILE_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

/// Flags for directories on the way: search permission is enough on Linux.
#[cfg(target_os = "linux")]
const DIR_FLAGS: libc::c_int = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
#[cfg(not(target_os = "linux"))]
const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;

/// A workspace directory handle that files are opened beneath.
#[derive(Debug)]
pub(crate) struct Workspace {
    dir: OwnedFd,
    /// As asked for; only Linux has a choice to make.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    resolution: Resolution,
    /// Under [`Resolution::Auto`]: whether `openat2` is (still) usable.
    #[cfg(target_os = "linux")]
    kernel: AtomicBool,
}

impl Workspace {
    /// Opens `root` (a directory) as the handle; `Err` says why not.
    pub(crate) fn open(root: &Path, resolution: Resolution) -> Result<Self, String> {
        let path = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| "the workspace path contains a NUL byte".to_owned())?;
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        let fd = unsafe { libc::open(path.as_ptr(), DIR_FLAGS) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        // SAFETY: `fd` was just returned by `open` and nothing else owns it.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        #[cfg(target_os = "linux")]
        {
            let kernel = match resolution {
                Resolution::Walk => false,
                Resolution::Auto | Resolution::Openat2 => {
                    let probe = openat2(
                        dir.as_raw_fd(),
                        c".",
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    );
                    match probe {
                        Ok(_) => true,
                        Err(errno) if resolution == Resolution::Openat2 => {
                            return Err(format!(
                                "openat2 is not available: {}",
                                std::io::Error::from_raw_os_error(errno)
                            ));
                        }
                        Err(_) => false,
                    }
                }
            };
            Ok(Self {
                dir,
                resolution,
                kernel: AtomicBool::new(kernel),
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            if resolution == Resolution::Openat2 {
                return Err("openat2 exists only on Linux".to_owned());
            }
            Ok(Self { dir, resolution })
        }
    }

    /// The strategy in use now: [`Resolution::Openat2`] or [`Resolution::Walk`].
    pub(crate) fn resolution(&self) -> Resolution {
        #[cfg(target_os = "linux")]
        if self.resolution != Resolution::Walk && self.kernel.load(Ordering::Relaxed) {
            return Resolution::Openat2;
        }
        Resolution::Walk
    }

    /// Opens the file at `components` (plain names: no `.`, `..` or empty
    /// ones) beneath the workspace and checks it is a regular file; returns
    /// it with its size.
    pub(crate) fn open_file(&self, components: &[&[u8]]) -> Result<(File, u64), ReadError> {
        let fd = self.open_beneath(components)?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(io_error)?;
        if let Some(what) = not_regular(meta.file_type()) {
            return Err(ReadError::NotRegular(what));
        }
        Ok((file, meta.len()))
    }

    fn open_beneath(&self, components: &[&[u8]]) -> Result<OwnedFd, ReadError> {
        #[cfg(target_os = "linux")]
        if self.resolution != Resolution::Walk && self.kernel.load(Ordering::Relaxed) {
            let joined = CString::new(components.join(&b'/')).map_err(|_| ReadError::Nul)?;
            match openat2(self.dir.as_raw_fd(), &joined, FILE_FLAGS) {
                Ok(fd) => return Ok(fd),
                // Unknown to the kernel, or refused by a seccomp filter.
                Err(libc::ENOSYS | libc::EPERM) if self.resolution == Resolution::Auto => {
                    self.kernel.store(false, Ordering::Relaxed);
                }
                Err(libc::ENOSYS | libc::EPERM) => {
                    return Err(ReadError::Io(
                        "openat2 is no longer available (seccomp?)".to_owned(),
                    ));
                }
                // A symlink (or `..` in one) that leaves the workspace.
                Err(libc::EXDEV) => return Err(ReadError::OutsideWorkspace),
                // A socket (or a device with no driver): the walk names it.
                // `EAGAIN`: the kernel saw a rename race on a `..` and could
                // not prove it stayed beneath; the walk handles `..` itself.
                Err(libc::ENXIO | libc::EAGAIN) => {}
                Err(errno) => return Err(errno_error(errno)),
            }
        }
        self.walk(components)
    }

    /// Resolves `components` one at a time from the workspace handle.
    fn walk(&self, components: &[&[u8]]) -> Result<OwnedFd, ReadError> {
        // Names still to look up, the next one last.
        let mut todo: Vec<Vec<u8>> = components.iter().rev().map(|c| c.to_vec()).collect();
        // The directories entered so far, below the workspace handle.
        let mut dirs: Vec<OwnedFd> = Vec::new();
        let mut hops = 0;
        while let Some(name) = todo.pop() {
            match name.as_slice() {
                b"" | b"." => continue,
                b".." => {
                    // Only symlink targets hold `..` here: the request was
                    // normalized before. Above the workspace means outside.
                    if dirs.pop().is_none() {
                        return Err(ReadError::OutsideWorkspace);
                    }
                    continue;
                }
                _ => {}
            }
            let at = dirs.last().unwrap_or(&self.dir).as_raw_fd();
            let cname = CString::new(name).map_err(|_| ReadError::Nul)?;
            let last = todo.is_empty();
            let flags = if last {
                FILE_FLAGS | libc::O_NOFOLLOW
            } else {
                DIR_FLAGS | libc::O_NOFOLLOW
            };
            let errno = match openat(at, &cname, flags) {
                Ok(fd) if last => return Ok(fd),
                Ok(fd) => {
                    dirs.push(fd);
                    continue;
                }
                Err(errno) => errno,
            };
            // A symlink gives ELOOP (EMLINK on FreeBSD) with O_NOFOLLOW, or
            // ENOTDIR with O_PATH | O_DIRECTORY; so does a plain non-directory.
            if matches!(errno, libc::ELOOP | libc::EMLINK | libc::ENOTDIR) {
                match readlinkat(at, &cname)? {
                    Some(target) => {
                        hops += 1;
                        if hops > MAX_HOPS {
                            return Err(ReadError::SymlinkLoop);
                        }
                        if target.first() == Some(&b'/') {
                            return Err(ReadError::OutsideWorkspace);
                        }
                        todo.extend(target.split(|&b| b == b'/').rev().map(<[u8]>::to_vec));
                        continue;
                    }
                    None => return Err(errno_error(errno)),
                }
            }
            if last && errno == libc::ENXIO {
                // A socket cannot be opened; name what it is.
                return Err(match kind_at(at, &cname) {
                    Some(what) => ReadError::NotRegular(what),
                    None => errno_error(errno),
                });
            }
            return Err(errno_error(errno));
        }
        // The path ended on a directory (a symlink target ending in `..`).
        Err(ReadError::NotRegular("a directory"))
    }
}

/// `openat2(dir, path, flags)` confined beneath `dir`; `Err` is the errno.
#[cfg(target_os = "linux")]
fn openat2(dir: RawFd, path: &CStr, flags: libc::c_int) -> Result<OwnedFd, libc::c_int> {
    // SAFETY: `open_how` is plain integers, for which all zeroes is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = u64::try_from(flags).map_err(|_| libc::EINVAL)?;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: `path` is NUL-terminated and `how` is a valid `open_how`
        // whose size is passed; both outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if rc >= 0 {
            let fd = RawFd::try_from(rc).map_err(|_| libc::EBADF)?;
            // SAFETY: the kernel just returned `fd` and nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        match errno() {
            libc::EINTR => continue,
            e => return Err(e),
        }
    }
}

/// `openat(dir, name, flags)`; `Err` is the errno.
fn openat(dir: RawFd, name: &CStr, flags: libc::c_int) -> Result<OwnedFd, libc::c_int> {
    loop {
        // SAFETY: `name` is NUL-terminated and outlives the call; no mode is
        // needed since `flags` never holds `O_CREAT`.
        let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
        if fd >= 0 {
            // SAFETY: the kernel just returned `fd` and nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        match errno() {
            libc::EINTR => continue,
            e => return Err(e),
        }
    }
}

/// The target of the symlink `name` in `dir`, or `None` if it is not a symlink.
fn readlinkat(dir: RawFd, name: &CStr) -> Result<Option<Vec<u8>>, ReadError> {
    // One byte more than the longest target, to see a cut one.
    let mut buf = vec![0u8; super::MAX_PATH_BYTES + 1];
    // SAFETY: `name` is NUL-terminated; `buf` is writable for `buf.len()` bytes.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return match errno() {
            libc::EINVAL => Ok(None),
            e => Err(errno_error(e)),
        };
    }
    let n = usize::try_from(n).map_err(|_| ReadError::Io("readlinkat failed".to_owned()))?;
    if n >= buf.len() {
        return Err(ReadError::Io("a symlink target is too long".to_owned()));
    }
    buf.truncate(n);
    if buf.is_empty() {
        return Err(ReadError::NotFound);
    }
    Ok(Some(buf))
}

/// What `name` in `dir` is, if not a regular file (without following a symlink).
fn kind_at(dir: RawFd, name: &CStr) -> Option<&'static str> {
    // SAFETY: `stat` is plain integers, for which all zeroes is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and `st` is writable; both outlive the call.
    let rc = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc != 0 {
        return None;
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFDIR => Some("a directory"),
        libc::S_IFIFO => Some("a FIFO"),
        libc::S_IFSOCK => Some("a socket"),
        libc::S_IFBLK | libc::S_IFCHR => Some("a device"),
        _ => Some("not a regular file"),
    }
}

fn errno() -> libc::c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn errno_error(errno: libc::c_int) -> ReadError {
    io_error(std::io::Error::from_raw_os_error(errno))
}

/// Maps an I/O error to a refusal.
pub(crate) fn io_error(err: std::io::Error) -> ReadError {
    match err.kind() {
        std::io::ErrorKind::NotFound => ReadError::NotFound,
        _ if err.raw_os_error() == Some(libc::ELOOP) => ReadError::SymlinkLoop,
        _ => ReadError::Io(err.to_string()),
    }
}

/// What `kind` is, if not a regular file.
fn not_regular(kind: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_file() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_block_device() || kind.is_char_device() {
        Some("a device")
    } else {
        Some("not a regular file")
    }
}
