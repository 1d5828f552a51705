//! Programs subloop starts (`run_main`, MCP servers, command hooks) run
//! each in a process group of its own, led by a watchdog: a forked
//! process that kills the group once subloop is gone, even by `SIGKILL`.
//! [`ProcessGroups`] lists the groups running now so that a host can kill
//! them on its way out (from a signal handler too), and [`Programs`] is the
//! handle a runner keeps them in.
//!
//! This is process plumbing shared by the layers above (`tools`, `policy`);
//! it holds no policy of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

/// A group's slot in [`ProcessGroups`], cleared when the program is done
/// or its run dropped.
pub(crate) struct Registered<'a>(pub(crate) Option<&'a AtomicI32>);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            slot.store(0, Ordering::SeqCst);
        }
    }
}

/// The process groups of the programs running right now, so that a host
/// can kill them before its process exits — from a signal handler too:
/// [`ProcessGroups::kill_all`] is async-signal-safe (atomic loads and
/// `kill`). A host that wants that makes one (a `static`, for a handler)
/// and gives it to `tools::RunMain::with_programs` (and to command hooks)
/// through [`Programs`].
#[derive(Debug)]
pub struct ProcessGroups([AtomicI32; 64]);

impl Default for ProcessGroups {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessGroups {
    /// No group yet.
    pub const fn new() -> Self {
        Self([const { AtomicI32::new(0) }; 64])
    }

    /// Remembers a running group; `None` when every slot is taken (the
    /// group is then still killed on exit and timeout, only not by
    /// [`ProcessGroups::kill_all`]).
    pub(crate) fn register(&self, group: libc::pid_t) -> Option<&AtomicI32> {
        self.0.iter().find(|slot| {
            slot.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })
    }

    /// Kills every program running now. Async-signal-safe.
    pub fn kill_all(&self) {
        for slot in &self.0 {
            let group = slot.load(Ordering::SeqCst);
            if group > 0 {
                kill_group(group);
            }
        }
    }
}

/// Where a program runner (`run_main`, command hooks) keeps the groups it runs: its own, or a host's
/// (a `static` its signal handler can reach).
#[derive(Debug, Clone)]
pub struct Programs(Groups);

#[derive(Debug, Clone)]
enum Groups {
    Own(Arc<ProcessGroups>),
    Static(&'static ProcessGroups),
}

impl Default for Programs {
    fn default() -> Self {
        Self::new()
    }
}

impl Programs {
    /// A list of its own.
    pub fn new() -> Self {
        Self(Groups::Own(Arc::new(ProcessGroups::new())))
    }

    /// The host's list.
    pub fn from_static(groups: &'static ProcessGroups) -> Self {
        Self(Groups::Static(groups))
    }

    /// The groups.
    pub fn groups(&self) -> &ProcessGroups {
        match &self.0 {
            Groups::Own(groups) => groups,
            Groups::Static(groups) => groups,
        }
    }

    /// Kills every program running now.
    pub fn kill_all(&self) {
        self.groups().kill_all();
    }
}

pub(crate) fn kill_group(group: libc::pid_t) {
    if group > 0 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
}

/// The leader of a program's process group: a forked process that kills
/// the group once the pipe it reads reaches end-of-file, that is, once
/// subloop has closed the write end or is gone.
pub(crate) struct Watchdog {
    pid: libc::pid_t,
    /// Held only by subloop (close-on-exec, so the program never gets it).
    alive: Option<std::io::PipeWriter>,
}

impl Watchdog {
    /// Forks the watchdog as the leader of a new, empty process group.
    pub(crate) fn spawn() -> std::io::Result<Self> {
        Self::fork(None)
    }

    /// [`Watchdog::spawn`], and when subloop is gone without finishing the
    /// run (a `SIGKILL`), the watchdog also has `dir` removed, with
    /// everything in it, once the group is gone: by a cleaner it forks into
    /// a group of its own just before it kills the group. (When subloop
    /// finishes the run, the group is killed before the pipe closes, so the
    /// watchdog dies without cleaning: the runner removes `dir` itself.)
    pub(crate) fn spawn_removing(dir: &std::path::Path) -> std::io::Result<Self> {
        use std::os::unix::ffi::OsStrExt;
        let dir = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        Self::fork(Some(dir))
    }

    fn fork(cleanup: Option<std::ffi::CString>) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        let cleanup_path = cleanup
            .as_ref()
            .map_or(std::ptr::null(), |dir| dir.as_ptr());
        let (reader, writer) = std::io::pipe()?;
        let read_fd = reader.as_raw_fd();
        let highest_fd = highest_fd();
        // SAFETY: fork(2); the child only makes async-signal-safe calls
        // (see `watch`) and never returns.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: in the forked child, with descriptors valid in it;
            // `cleanup_path` points to memory copied with the process.
            unsafe { watch(read_fd, highest_fd, cleanup_path) }
        }
        drop(reader);
        // The child makes itself a group leader too; doing it here as well
        // means the group exists before the program is spawned into it.
        // SAFETY: setpgid(2) on our own child.
        unsafe {
            libc::setpgid(pid, pid);
        }
        Ok(Self {
            pid,
            alive: Some(writer),
        })
    }

    /// The process group the program joins.
    pub(crate) fn group(&self) -> libc::pid_t {
        self.pid
    }

    /// Kills the whole group (the watchdog with it), then reaps the watchdog.
    pub(crate) fn finish(self) {
        drop(self);
    }
}

impl Drop for Watchdog {
    /// On every path out of a run, an unwinding one included: the group is
    /// killed first, then its leader is reaped, so the id is not reused in between.
    fn drop(&mut self) {
        kill_group(self.pid);
        self.alive = None;
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child; retried when interrupted.
        while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
    }
}

/// The highest descriptor a forked watchdog may have inherited (computed
/// before the fork: the child must not allocate).
fn highest_fd() -> libc::c_int {
    // SAFETY: sysconf(3) has no preconditions.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    libc::c_int::try_from(max.clamp(64, 65_536)).unwrap_or(65_536)
}

/// The watchdog's whole life, in the forked child: only async-signal-safe
/// calls (no allocation, no locks). Holds nothing but the pipe's read end;
/// ignores the terminal's and supervisors' polite signals; when the pipe
/// reaches end-of-file (or fails), kills its group, itself included —
/// after forking a cleaner for `cleanup` (a NUL-terminated path, or null).
unsafe fn watch(read_fd: libc::c_int, highest_fd: libc::c_int, cleanup: *const libc::c_char) -> ! {
    // SAFETY: plain system calls on this process, as documented above.
    unsafe {
        libc::setpgid(0, 0);
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        for signal in [
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGTERM,
            libc::SIGQUIT,
            libc::SIGPIPE,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
        if read_fd != 0 {
            libc::dup2(read_fd, 0);
        }
        close_from(1, highest_fd);
        let mut byte = 0u8;
        loop {
            let n = libc::read(0, (&raw mut byte).cast(), 1);
            if n > 0 {
                continue;
            }
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // End-of-file: subloop is gone (or done). The group goes.
            let group = libc::getpid();
            if !cleanup.is_null() {
                let cleaner = libc::fork();
                if cleaner == 0 {
                    libc::setpgid(0, 0);
                    clean(group, cleanup);
                }
                if cleaner > 0 {
                    // Out of the group before it is killed, from both sides.
                    libc::setpgid(cleaner, cleaner);
                }
            }
            libc::kill(-group, libc::SIGKILL);
            libc::_exit(0);
        }
    }
}

/// The cleaner's whole life: waits (at most a second) for the killed
/// `group` to be gone, removes `dir`, exits. Async-signal-safe.
unsafe fn clean(group: libc::pid_t, dir: *const libc::c_char) -> ! {
    // SAFETY: plain system calls; `dir` is NUL-terminated.
    unsafe {
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 10_000_000,
        };
        for _ in 0..100 {
            if libc::kill(-group, 0) != 0 {
                break;
            }
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
        remove_tree(dir);
        libc::_exit(0);
    }
}

/// How deep [`remove_tree`] goes (each level holds a 2 KiB buffer on the stack).
#[cfg(target_os = "linux")]
const MAX_DEPTH: u32 = 32;

/// Removes `path` and everything beneath it, following no symbolic link,
/// with no allocation (`getdents64` into a buffer on the stack).
#[cfg(target_os = "linux")]
unsafe fn remove_tree(path: *const libc::c_char) {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `path` is NUL-terminated; the descriptor is ours.
    unsafe {
        let dir = libc::open(path, flags);
        if dir >= 0 {
            remove_beneath(dir, 0);
            libc::close(dir);
        }
        libc::rmdir(path);
    }
}

#[cfg(not(target_os = "linux"))]
unsafe fn remove_tree(_path: *const libc::c_char) {}

/// Removes what the open directory `dir` holds (a few passes, since
/// removing entries while reading them may skip some).
#[cfg(target_os = "linux")]
unsafe fn remove_beneath(dir: libc::c_int, depth: u32) {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // 8-byte aligned, as `struct linux_dirent64` records are.
    let mut buffer = [0u64; 256];
    for _ in 0..4 {
        let mut found = false;
        // SAFETY: system calls on a descriptor we own, into our buffer;
        // each record lies within the `n` bytes the kernel filled:
        // `u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]`.
        unsafe {
            if libc::lseek(dir, 0, libc::SEEK_SET) < 0 {
                return;
            }
            loop {
                let n = libc::syscall(
                    libc::SYS_getdents64,
                    dir,
                    buffer.as_mut_ptr(),
                    std::mem::size_of_val(&buffer),
                );
                let Ok(n) = usize::try_from(n) else { break };
                if n == 0 {
                    break;
                }
                let base = buffer.as_ptr().cast::<u8>();
                let mut offset = 0;
                while offset + 19 < n {
                    let entry = base.add(offset);
                    let length = usize::from(std::ptr::read_unaligned(entry.add(16).cast::<u16>()));
                    if length == 0 {
                        break;
                    }
                    offset += length;
                    let name = entry.add(19).cast::<libc::c_char>();
                    let dot = *name == b'.' as libc::c_char;
                    if dot
                        && (*name.add(1) == 0
                            || (*name.add(1) == b'.' as libc::c_char && *name.add(2) == 0))
                    {
                        continue;
                    }
                    found = true;
                    let kind = *entry.add(18);
                    if kind == libc::DT_DIR || kind == libc::DT_UNKNOWN {
                        if depth < MAX_DEPTH {
                            let sub = libc::openat(dir, name, flags);
                            if sub >= 0 {
                                remove_beneath(sub, depth + 1);
                                libc::close(sub);
                            }
                        }
                        if libc::unlinkat(dir, name, libc::AT_REMOVEDIR) == 0 {
                            continue;
                        }
                    }
                    libc::unlinkat(dir, name, 0);
                }
            }
        }
        if !found {
            return;
        }
    }
}

/// Closes every descriptor from `first` on (async-signal-safe).
unsafe fn close_from(first: libc::c_int, highest_fd: libc::c_int) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: close_range(2) only closes descriptors of this process.
        let done = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                libc::c_uint::try_from(first).unwrap_or(1),
                libc::c_uint::MAX,
                0 as libc::c_uint,
            )
        } == 0;
        if done {
            return;
        }
    }
    for fd in first..=highest_fd {
        // SAFETY: closing a descriptor number of this process; EBADF is harmless.
        unsafe {
            libc::close(fd);
        }
    }
}
