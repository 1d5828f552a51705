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
        use std::os::fd::AsRawFd;
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
            // SAFETY: in the forked child, with descriptors valid in it.
            unsafe { watch(read_fd, highest_fd) }
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
/// reaches end-of-file (or fails), kills its group, itself included.
unsafe fn watch(read_fd: libc::c_int, highest_fd: libc::c_int) -> ! {
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
            libc::kill(-libc::getpid(), libc::SIGKILL);
            libc::_exit(0);
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
