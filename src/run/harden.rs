//! Hardening for the programs subloop starts, applied between the fork and
//! the exec (in a `pre_exec` closure of a `Command`):
//!
//! - [`PidNamespace`]: the program becomes pid 1 of a new PID namespace, so
//!   that when it ends the kernel kills every process it left behind, even
//!   one that left its process group and session with `setsid`;
//! - [`close_inherited_fds`]: no descriptor beyond stdin, stdout and stderr
//!   reaches the program;
//! - [`drop_privileges`]: `no_new_privs`, and no capability in any set.
//!
//! Everything that runs in the forked child is async-signal-safe: no
//! allocation, no lock. What needs allocating is prepared before the fork.

use std::ffi::CString;
use std::io;

/// The highest descriptor a forked child may have inherited, for the
/// fallback of [`close_inherited_fds`] (computed before the fork: the child
/// must not allocate or ask much).
pub(crate) fn highest_fd() -> libc::c_int {
    // SAFETY: sysconf(3) has no preconditions.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    libc::c_int::try_from(max.clamp(64, 65_536)).unwrap_or(65_536)
}

/// A user namespace's maps, written by the child itself after `unshare`.
#[derive(Debug)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct Maps {
    /// `U U 1`: the current effective uid mapped to itself.
    uid_map: CString,
    /// `G G 1`: the current effective gid mapped to itself.
    gid_map: CString,
}

/// A new PID namespace for one program. Prepared before the fork (it
/// allocates); entered in a `pre_exec` closure (async-signal-safe).
///
/// [`PidNamespace::enter`] unshares the namespace, then forks: the new
/// child is pid 1 of the namespace and goes on to exec the program; the
/// process std forked stays outside, waits for it and exits as it did. When
/// pid 1 ends, the kernel kills every other process of the namespace. The
/// inner child keeps the outer one's process group, so killing the group
/// still kills both (and the outer one's death kills the inner one, by
/// `PR_SET_PDEATHSIG`).
#[derive(Debug)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) struct PidNamespace {
    /// `CLONE_NEWPID`, the caller's extra flags, and `CLONE_NEWUSER` when
    /// not root.
    flags: libc::c_int,
    /// The maps to write, when a user namespace is unshared too.
    maps: Option<Maps>,
    /// For the fallback of closing descriptors in the outer process.
    highest_fd: libc::c_int,
}

#[cfg(target_os = "linux")]
impl PidNamespace {
    /// `extra` = further `CLONE_NEW*` flags to unshare together with
    /// `CLONE_NEWPID` (e.g. `CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET`).
    /// When `geteuid() != 0` it also unshares `CLONE_NEWUSER`, mapping the
    /// current uid/gid to themselves (writes `deny` to
    /// `/proc/self/setgroups`, then uid_map `U U 1`, gid_map `G G 1`).
    pub(crate) fn prepare(extra: libc::c_int) -> io::Result<Self> {
        let mut flags = libc::CLONE_NEWPID | extra;
        // SAFETY: geteuid(2) and getegid(2) cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let maps = if uid == 0 {
            None
        } else {
            flags |= libc::CLONE_NEWUSER;
            let map = |id: u32| {
                CString::new(format!("{id} {id} 1"))
                    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
            };
            Some(Maps {
                uid_map: map(uid)?,
                gid_map: map(gid)?,
            })
        };
        Ok(Self {
            flags,
            maps,
            highest_fd: highest_fd(),
        })
    }

    /// `unshare(2)`, then the maps of a new user namespace.
    unsafe fn unshare_and_map(&self) -> io::Result<()> {
        // SAFETY: plain system calls on this process, on strings allocated
        // before the fork.
        unsafe {
            if libc::unshare(self.flags) != 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(maps) = &self.maps {
                // Missing before Linux 3.19, where the gid map needs no `deny`.
                match write_proc(c"/proc/self/setgroups", c"deny") {
                    Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
                    _ => {}
                }
                write_proc(c"/proc/self/uid_map", &maps.uid_map)?;
                write_proc(c"/proc/self/gid_map", &maps.gid_map)?;
            }
        }
        Ok(())
    }

    /// Unshares the namespaces (and, when not root, writes the user
    /// namespace's maps) in this process, without forking: the first step
    /// of [`PidNamespace::enter`], for a caller that forks its own way.
    /// Async-signal-safe.
    ///
    /// # Safety
    ///
    /// Only in a forked child (a `pre_exec` closure): it changes the
    /// namespaces of the calling process.
    pub(crate) unsafe fn unshare(&self) -> io::Result<()> {
        // SAFETY: plain system calls on this process; the strings were
        // allocated before the fork and live as long as `self`.
        unsafe {
            // A process that is not dumpable (the CLI makes itself so) has
            // /proc/self owned by root and could not write its own maps:
            // dumpable just for that, then not again (this process still
            // holds a copy of subloop's memory).
            let maps = self.maps.is_some();
            if maps {
                libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            }
            let entered = self.unshare_and_map();
            if maps {
                libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            }
            entered
        }
    }

    /// Call in a pre_exec closure, in the forked child. unshare(2)s, then
    /// fork(2)s: the new child (pid 1 of the namespace) sets
    /// `PR_SET_PDEATHSIG(SIGKILL)` and returns `Ok(())` so the rest of
    /// pre_exec and the exec happen in it; the original forked process
    /// (outside the namespace) never returns: it closes every descriptor
    /// from 3 on (so std's exec-error pipe is held only by the inner child),
    /// waits for the inner child (retrying `EINTR`) and exits mirroring its
    /// status: `_exit(code)` for an exit, and for a death by signal S it
    /// resets S to `SIG_DFL`, unblocks it and `kill(getpid(), S)` (falling
    /// back to `_exit(128+S)`). Errors before the fork are returned as
    /// `io::Error` from errno. Only async-signal-safe calls.
    ///
    /// # Safety
    ///
    /// Only in a freshly forked child about to exec (a `pre_exec` closure):
    /// in any other process the caller's process would exit in it.
    pub(crate) unsafe fn enter(&self) -> io::Result<()> {
        // SAFETY: plain system calls on this process; the strings were
        // allocated before the fork and live as long as `self`.
        unsafe {
            self.unshare()?;
            let pid = libc::fork();
            if pid < 0 {
                return Err(io::Error::last_os_error());
            }
            if pid == 0 {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                return Ok(());
            }
            close_from(3, self.highest_fd);
            mirror(pid)
        }
    }

    /// Whether this machine allows it (fork a child that tries the unshare
    /// and reports; cached).
    pub(crate) fn available() -> bool {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(probe)
    }
}

/// Elsewhere than on Linux there is no PID namespace.
#[cfg(not(target_os = "linux"))]
impl PidNamespace {
    /// Not available on this system.
    pub(crate) fn prepare(_extra: libc::c_int) -> io::Result<Self> {
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Not available on this system.
    ///
    /// # Safety
    ///
    /// None needed: it does nothing.
    pub(crate) unsafe fn enter(&self) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Never.
    pub(crate) fn available() -> bool {
        false
    }
}

/// Forks a child that enters a namespace and exits 0 from inside it.
#[cfg(target_os = "linux")]
fn probe() -> bool {
    let Ok(namespace) = PidNamespace::prepare(0) else {
        return false;
    };
    // SAFETY: fork(2); the child only makes async-signal-safe calls and
    // never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return false;
    }
    if pid == 0 {
        // SAFETY: in the forked child; it exits either way.
        unsafe {
            let code = match namespace.enter() {
                // Pid 1 of the new namespace (the outer process mirrors it).
                Ok(()) if libc::getpid() == 1 => 0,
                _ => 1,
            };
            libc::_exit(code);
        }
    }
    let mut status = 0;
    // waitpid(2) on our own child; retried when interrupted.
    loop {
        // SAFETY: `pid` is our own child and `status` a live local the call writes to.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        if waited == pid {
            break;
        }
        if waited < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

/// Writes `text` to the file at `path` (a `/proc` file) in one write.
/// Async-signal-safe.
#[cfg(target_os = "linux")]
unsafe fn write_proc(path: &std::ffi::CStr, text: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: NUL-terminated strings; the descriptor is ours.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let bytes = text.to_bytes();
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let result = if written < 0 {
            Err(io::Error::last_os_error())
        } else if usize::try_from(written).ok() != Some(bytes.len()) {
            Err(io::Error::from_raw_os_error(libc::EIO))
        } else {
            Ok(())
        };
        libc::close(fd);
        result
    }
}

/// The outer process's life after the fork: waits for `pid` and exits as
/// it did. Async-signal-safe.
#[cfg(target_os = "linux")]
unsafe fn mirror(pid: libc::pid_t) -> ! {
    // SAFETY: plain system calls on this process and its child.
    unsafe {
        let mut status = 0;
        loop {
            let waited = libc::waitpid(pid, &mut status, 0);
            if waited == pid {
                break;
            }
            if waited < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(127);
            }
        }
        exit_as(status)
    }
}

/// Exits as the wait status `status` says: with its exit code, or killed
/// by the same signal (falling back to `128 + signal`). Async-signal-safe.
///
/// # Safety
///
/// Ends the calling process: only in a forked child.
#[cfg(target_os = "linux")]
pub(crate) unsafe fn exit_as(status: libc::c_int) -> ! {
    // SAFETY: plain system calls in a process that is ending.
    unsafe {
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(127)
    }
}

/// Closes every descriptor from `first` on. Async-signal-safe.
#[cfg(target_os = "linux")]
unsafe fn close_from(first: libc::c_int, highest: libc::c_int) {
    // SAFETY: close_range(2) only closes descriptors of this process.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            libc::c_uint::try_from(first).unwrap_or(3),
            libc::c_uint::MAX,
            0 as libc::c_uint,
        )
    } == 0;
    if done {
        return;
    }
    for fd in first..=highest {
        // SAFETY: closing a descriptor number of this process; EBADF is harmless.
        unsafe {
            libc::close(fd);
        }
    }
}

/// Marks every descriptor >= 3 close-on-exec
/// (`close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`, falling back to `fcntl`
/// `FD_CLOEXEC` on each descriptor up to `highest`, computed before the
/// fork with [`highest_fd`]). Async-signal-safe.
pub(crate) fn close_inherited_fds(highest: libc::c_int) {
    // SAFETY: close_range(2) and fcntl(2) only change this process's
    // descriptor flags; EBADF on a closed number is harmless.
    unsafe {
        #[cfg(target_os = "linux")]
        if libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) == 0
        {
            return;
        }
        for fd in 3..=highest {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// capget(2)/capset(2)'s header.
#[cfg(target_os = "linux")]
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// One half of capset(2)'s data (version 3 takes two).
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`.
#[cfg(target_os = "linux")]
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `no_new_privs`, drop the capability bounding set (best effort, needs
/// `CAP_SETPCAP`), clear the ambient set, capset(2) every set to empty.
/// Async-signal-safe.
#[cfg(target_os = "linux")]
pub(crate) fn drop_privileges() -> io::Result<()> {
    // SAFETY: prctl(2) with integer arguments, on this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    drop_bounding_set();
    clear_capabilities()
}

/// Empties the capability bounding set where this process may change it
/// (it needs `CAP_SETPCAP`; `EINVAL` past the last capability: best
/// effort, as with `no_new_privs` the emptied sets of
/// [`clear_capabilities`] are what counts) and the ambient set.
/// Async-signal-safe.
#[cfg(target_os = "linux")]
pub(crate) fn drop_bounding_set() {
    // SAFETY: prctl(2) with integer arguments, on this process.
    unsafe {
        for capability in 0..64 {
            libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
    }
}

/// capset(2): the effective, permitted and inheritable sets emptied.
/// Async-signal-safe.
#[cfg(target_os = "linux")]
pub(crate) fn clear_capabilities() -> io::Result<()> {
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let none = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset(2) reads `header` and the two `none` halves we own.
    if unsafe { libc::syscall(libc::SYS_capset, &raw const header, none.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Elsewhere than on Linux there are no capabilities and no
/// `no_new_privs` to set: nothing to do.
#[cfg(not(target_os = "linux"))]
pub(crate) fn drop_privileges() -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;
    use std::process::{Command, Stdio};

    /// `sh -c script` with `harden` run in its `pre_exec`; its stdout.
    fn hardened(
        script: &str,
        harden: impl FnMut() -> io::Result<()> + Send + Sync + 'static,
    ) -> String {
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg(script).stdout(Stdio::piped());
        // SAFETY: the closures below only make async-signal-safe calls.
        unsafe {
            command.pre_exec(harden);
        }
        let output = command.output().expect("run sh");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    #[test]
    fn a_program_in_a_pid_namespace_is_pid_1_and_takes_its_descendants_along() {
        if !PidNamespace::available() {
            eprintln!("skipped: PID namespaces are not available here");
            return;
        }
        let marker = format!("subloop-harden-marker-{}", std::process::id());
        let namespace = PidNamespace::prepare(0).expect("prepare");
        // A descendant that leaves the group and the session, holding no pipe.
        let script = format!(
            "echo $$; setsid sh -c 'sleep 30; : {marker}' </dev/null >/dev/null 2>&1 & sleep 0.2"
        );
        // SAFETY: async-signal-safe, in the forked child.
        let out = hardened(&script, move || unsafe { namespace.enter() });
        assert_eq!(out.trim(), "1");
        let started = std::time::Instant::now();
        loop {
            let left = std::fs::read_dir("/proc")
                .expect("/proc")
                .filter_map(Result::ok)
                .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
                .any(|cmdline| String::from_utf8_lossy(&cmdline).contains(&marker));
            if !left {
                break;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "a descendant outlived pid 1 of its namespace"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn the_exit_status_of_pid_1_is_mirrored() {
        if !PidNamespace::available() {
            return;
        }
        use std::os::unix::process::ExitStatusExt as _;
        for (script, code) in [("exit 7", 7), ("true", 0)] {
            let namespace = PidNamespace::prepare(0).expect("prepare");
            let mut command = Command::new("/bin/sh");
            command.arg("-c").arg(script);
            // SAFETY: async-signal-safe, in the forked child.
            unsafe {
                command.pre_exec(move || namespace.enter());
            }
            let status = command.status().expect("run sh");
            assert_eq!(status.code(), Some(code), "{script}");
        }
        // Pid 1 killed by a signal (SIGKILL: it ignores any other signal it
        // has no handler for): the outer process dies by it too.
        let namespace = PidNamespace::prepare(0).expect("prepare");
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg("sleep 30");
        // SAFETY: async-signal-safe, in the forked child.
        unsafe {
            command.pre_exec(move || namespace.enter());
        }
        let mut child = command.spawn().expect("run sh");
        let outer = child.id();
        let children = format!("/proc/{outer}/task/{outer}/children");
        let started = std::time::Instant::now();
        let inner = loop {
            let listed = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(pid) = listed.split_whitespace().next() {
                break pid.parse::<libc::pid_t>().expect("pid");
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "no inner child"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        // SAFETY: kill(2) on our grandchild.
        unsafe {
            libc::kill(inner, libc::SIGKILL);
        }
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        // An exec that fails is reported by the inner child.
        let namespace = PidNamespace::prepare(0).expect("prepare");
        let mut command = Command::new("/nonexistent/program");
        // SAFETY: async-signal-safe, in the forked child.
        unsafe {
            command.pre_exec(move || namespace.enter());
        }
        let err = command.status().expect_err("no such program");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn no_inherited_descriptor_reaches_the_program() {
        let file = std::fs::File::open("/proc/self/status").expect("open");
        use std::os::fd::AsRawFd as _;
        let fd = file.as_raw_fd();
        let highest = highest_fd();
        let out = hardened("ls /proc/self/fd", move || {
            // Like a descriptor subloop inherited: not close-on-exec.
            // SAFETY: dup2(2) in the forked child.
            unsafe {
                libc::dup2(fd, 9);
            }
            close_inherited_fds(highest);
            Ok(())
        });
        let mut listed: Vec<&str> = out.split_whitespace().collect();
        listed.sort_unstable();
        // `ls` opens the directory it lists: 3.
        assert_eq!(listed, ["0", "1", "2", "3"], "{out}");
    }

    #[test]
    fn a_hardened_program_has_no_capability_and_no_new_privileges() {
        let out = hardened("cat /proc/self/status", drop_privileges);
        let field = |name: &str| {
            out.lines()
                .find_map(|line| line.strip_prefix(name))
                .map(str::trim)
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(field("NoNewPrivs:"), "1", "{out}");
        assert_eq!(field("CapEff:"), "0000000000000000", "{out}");
        assert_eq!(field("CapPrm:"), "0000000000000000", "{out}");
        assert_eq!(field("CapInh:"), "0000000000000000", "{out}");
        assert_eq!(field("CapAmb:"), "0000000000000000", "{out}");
    }
}
