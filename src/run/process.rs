//! Programs subloop starts (`run_main`, MCP servers, command hooks) run
//! each in a process group of its own, led by a watchdog: a forked
//! process that kills the group once subloop is gone, even by `SIGKILL`.
//! [`ProcessGroups`] lists the groups running now so that a host can kill
//! them on its way out (from a signal handler too), and [`Programs`] is the
//! handle a runner keeps them in.
//!
//! This is process plumbing shared by the layers above (`tools`, `policy`);
//! it holds no policy of its own.

use std::os::fd::FromRawFd;
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

/// Waits for `child` (the leader of process group `group`) to exit until
/// `deadline` ([`wait_until`]); past it, or when waiting fails, the whole
/// group is killed and the child reaped. Gives its status and whether the
/// deadline came first.
pub(crate) fn wait_or_kill(
    child: &mut std::process::Child,
    group: libc::pid_t,
    deadline: std::time::Instant,
) -> (std::io::Result<std::process::ExitStatus>, bool) {
    match wait_until(child, deadline) {
        Ok(Some(status)) => (Ok(status), false),
        Ok(None) => {
            kill_group(group);
            (child.wait(), true)
        }
        Err(err) => {
            kill_group(group);
            let _ = child.wait();
            (Err(err), false)
        }
    }
}

/// Waits for `child` to exit until `deadline`: a timed wait on the
/// child's pidfd (`poll(2)` with the time left), woken by the exit itself.
/// `Ok(None)` when the deadline came first. Where the kernel has no pidfd
/// (before Linux 5.3), it looks again every few milliseconds instead.
pub(crate) fn wait_until(
    child: &mut std::process::Child,
    deadline: std::time::Instant,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let pid = libc::pid_t::try_from(child.id()).unwrap_or(0);
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new
    // descriptor, which the OwnedFd below owns.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let pidfd = i32::try_from(fd).ok().filter(|fd| *fd >= 0).map(|fd| {
        // SAFETY: a descriptor just returned to us, owned by nothing else.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
    });
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        match &pidfd {
            Some(pidfd) => {
                let mut poll = libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(pidfd),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // Rounded up, so the wait never ends just short of the deadline.
                let millis = left.as_micros().div_ceil(1000);
                let timeout = libc::c_int::try_from(millis).unwrap_or(libc::c_int::MAX);
                // SAFETY: poll(2) on one descriptor we own; EINTR loops.
                unsafe { libc::poll(&mut poll, 1, timeout) };
            }
            None => std::thread::sleep(left.min(std::time::Duration::from_millis(5))),
        }
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

/// The cleaner's whole life: removes `dir` at once, waits (at most a
/// second) for the killed `group` to be gone, removes what a dying process
/// may have added meanwhile, exits. Async-signal-safe.
///
/// Removing first means the directory does not wait on the group: a killed
/// group's processes can linger as zombies for as long as nobody reaps
/// them (an orphan's new parent may be a subreaper that never does), and a
/// killed process writes nothing new but the one call it was making.
unsafe fn clean(group: libc::pid_t, dir: *const libc::c_char) -> ! {
    // SAFETY: plain system calls; `dir` is NUL-terminated.
    unsafe {
        remove_tree(dir);
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

/// The flags every directory is opened with: never through a symbolic link.
#[cfg(target_os = "linux")]
const DIRECTORY: libc::c_int =
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;

/// Removes `path` and everything beneath it, at any depth, following no
/// symbolic link, with no allocation and only async-signal-safe calls, so
/// that a forked cleaner can call it (and [`remove_dir_tree`] in-process).
///
/// No recursion, and no descriptor open more than two levels beneath the
/// top whatever the depth: the tree is taken a level at a time. Each
/// directory read (the top first) has its entries removed, and the
/// directories among them emptied: what they hold is removed, the
/// directories in it moved (renamed, relative to both descriptors) into a
/// queue, a directory the cleaner makes in the top, read in turn as the
/// next level. A directory is given mode 0700 before it is opened or moved
/// (a program may have left one at 000), by a call that follows no
/// symbolic link.
///
/// Linear in the entries: each is read once and removed once, each
/// directory moved into a queue once, and each queue (one per level) read
/// once, with nothing added to it while it is read. An entry that cannot
/// be removed is skipped and never read again.
#[cfg(target_os = "linux")]
unsafe fn remove_tree(path: *const libc::c_char) {
    // SAFETY: `path` is NUL-terminated; the descriptors are ours.
    unsafe {
        open_up(libc::AT_FDCWD, path);
        let top = libc::open(path, DIRECTORY);
        if top >= 0 {
            let mut queues = Queues {
                top,
                names: 0,
                next: None,
            };
            let mut level = top;
            let mut level_name = [0u8; NAME];
            // Ends: a level goes round again only when the one before put a
            // directory one level deeper in a queue, so at most once per
            // level of the tree.
            loop {
                empty_level(level, &mut queues);
                if level != top {
                    libc::close(level);
                    libc::unlinkat(top, level_name.as_ptr().cast(), libc::AT_REMOVEDIR);
                }
                let Some((next, name)) = queues.next.take() else {
                    break;
                };
                level = next;
                level_name = name;
            }
            libc::close(top);
        }
        libc::rmdir(path);
    }
}

#[cfg(not(target_os = "linux"))]
unsafe fn remove_tree(_path: *const libc::c_char) {}

/// Removes `dir` and everything beneath it, as the forked cleaner does (see
/// [`remove_tree`]): for removal in-process, after the program's group is gone.
pub(crate) fn remove_dir_tree(dir: &std::path::Path) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        if let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) {
            // SAFETY: a NUL-terminated path we own.
            unsafe { remove_tree(path.as_ptr()) }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Room for a name the cleaner makes (`.subloop-clean-N`, NUL-terminated).
#[cfg(target_os = "linux")]
const NAME: usize = 40;

/// Where the directories of the next level go.
#[cfg(target_os = "linux")]
struct Queues {
    /// The directory being removed.
    top: libc::c_int,
    /// The number in the next name to try (names only grow).
    names: u64,
    /// The next level's queue, once made: its descriptor and name in `top`.
    next: Option<(libc::c_int, [u8; NAME])>,
}

#[cfg(target_os = "linux")]
impl Queues {
    /// The next level's queue, made in `top` when first needed.
    unsafe fn next(&mut self) -> Option<libc::c_int> {
        if let Some((fd, _)) = self.next {
            return Some(fd);
        }
        let mut name = [0u8; NAME];
        // Ends: `names` only grows, so each name found taken is one more
        // entry already in `top`, of which there are finitely many.
        loop {
            if !compose(b".subloop-clean-", self.names, &mut name) {
                return None;
            }
            self.names += 1;
            // SAFETY: a NUL-terminated name; the descriptor is ours.
            unsafe {
                if libc::mkdirat(self.top, name.as_ptr().cast(), 0o700) != 0 {
                    if errno() == libc::EEXIST {
                        continue;
                    }
                    return None;
                }
                // Whatever the umask took away.
                open_up(self.top, name.as_ptr().cast());
                let fd = libc::openat(self.top, name.as_ptr().cast(), DIRECTORY);
                if fd < 0 {
                    return None;
                }
                self.next = Some((fd, name));
                return Some(fd);
            }
        }
    }

    /// Whether `name` (NUL-terminated) is the next level's queue in `top`.
    unsafe fn is_next(&self, name: *const libc::c_char) -> bool {
        let Some((_, queue)) = &self.next else {
            return false;
        };
        for (at, &byte) in queue.iter().enumerate() {
            // SAFETY: `name` is NUL-terminated and compared up to its NUL
            // (or the first byte that differs).
            if unsafe { *name.add(at) } as u8 != byte {
                return false;
            }
            if byte == 0 {
                return true;
            }
        }
        false
    }

    /// Moves the directory `name` in `from` into the next level's queue;
    /// whether it moved.
    unsafe fn enqueue(&mut self, from: libc::c_int, name: *const libc::c_char) -> bool {
        // SAFETY: as each call says.
        unsafe {
            let Some(queue) = self.next() else {
                return false;
            };
            let mut target = [0u8; NAME];
            // Ends: the queue is the cleaner's, so a name is taken only by
            // an entry moved there before, of which there are finitely many.
            loop {
                if !compose(b"", self.names, &mut target) {
                    return false;
                }
                self.names += 1;
                let target = target.as_ptr().cast::<libc::c_char>();
                // renameat2(2) with RENAME_NOREPLACE replaces nothing; where
                // the file system does not support it, renameat(2) once
                // nothing is found by that name.
                if libc::syscall(
                    libc::SYS_renameat2,
                    from,
                    name,
                    queue,
                    target,
                    libc::RENAME_NOREPLACE,
                ) == 0
                {
                    return true;
                }
                match errno() {
                    libc::EEXIST => {}
                    libc::EINVAL => {
                        let mut stat: libc::stat = std::mem::zeroed();
                        if libc::fstatat(queue, target, &mut stat, libc::AT_SYMLINK_NOFOLLOW) == 0 {
                            continue;
                        }
                        return errno() == libc::ENOENT
                            && libc::renameat(from, name, queue, target) == 0;
                    }
                    _ => return false,
                }
            }
        }
    }
}

/// Removes the entries of the open directory `level` (the top, or a
/// queue), each directory among them once emptied: what it holds is
/// removed, the directories in it moved into the next level's queue.
#[cfg(target_os = "linux")]
unsafe fn empty_level(level: libc::c_int, queues: &mut Queues) {
    // SAFETY: system calls on descriptors we own; `each_entry` hands out
    // NUL-terminated names inside its buffer.
    unsafe {
        each_entry(level, |name, kind| {
            if (level == queues.top && queues.is_next(name)) || remove_in_place(level, name, kind) {
                return;
            }
            open_up(level, name);
            let dir = libc::openat(level, name, DIRECTORY);
            if dir < 0 {
                return;
            }
            each_entry(dir, |inner, kind| {
                if !remove_in_place(dir, inner, kind) {
                    open_up(dir, inner);
                    queues.enqueue(dir, inner);
                }
            });
            libc::close(dir);
            libc::unlinkat(level, name, libc::AT_REMOVEDIR);
        });
    }
}

/// Removes `name` in `dir` when it is not a directory or an empty one;
/// false when it is a directory with something in it (or cannot be removed).
#[cfg(target_os = "linux")]
unsafe fn remove_in_place(dir: libc::c_int, name: *const libc::c_char, kind: u8) -> bool {
    // SAFETY: `name` is NUL-terminated; unlinkat(2) never follows a symlink.
    unsafe {
        if kind != libc::DT_DIR && (libc::unlinkat(dir, name, 0) == 0 || errno() != libc::EISDIR) {
            return true;
        }
        libc::unlinkat(dir, name, libc::AT_REMOVEDIR) == 0
    }
}

/// Writes `prefix`, `value` in decimal and a NUL into `out`; false when
/// they do not fit. (No allocation, no panic.)
#[cfg(target_os = "linux")]
fn compose(prefix: &[u8], value: u64, out: &mut [u8]) -> bool {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = value;
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + u8::try_from(rest % 10).unwrap_or(0);
        start -= 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let number = digits.get(start..).unwrap_or(&[]);
    if prefix.len() + number.len() + 1 > out.len() {
        return false;
    }
    for (slot, byte) in out.iter_mut().zip(prefix.iter().chain(number).chain(&[0])) {
        *slot = *byte;
    }
    true
}

/// Gives the owner every right on the directory `name` in `dir` (a program
/// may have made it unreadable), following no symbolic link: `fchmodat2`
/// with `AT_SYMLINK_NOFOLLOW`, or on a kernel without it the directory's
/// `O_PATH` descriptor, through `/proc/self/fd`.
#[cfg(target_os = "linux")]
unsafe fn open_up(dir: libc::c_int, name: *const libc::c_char) {
    // SAFETY: `name` is NUL-terminated; the descriptor opened is ours.
    unsafe {
        let done = libc::syscall(
            libc::SYS_fchmodat2,
            dir,
            name,
            0o700 as libc::c_uint,
            libc::AT_SYMLINK_NOFOLLOW,
        ) == 0;
        if done || errno() != libc::ENOSYS {
            return;
        }
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let fd = libc::openat(dir, name, flags);
        if fd < 0 {
            return;
        }
        let mut path = [0u8; 40];
        if compose(b"/proc/self/fd/", u64::try_from(fd).unwrap_or(0), &mut path) {
            libc::chmod(path.as_ptr().cast(), 0o700);
        }
        libc::close(fd);
    }
}

/// This thread's `errno` (async-signal-safe).
#[cfg(target_os = "linux")]
fn errno() -> libc::c_int {
    // SAFETY: __errno_location(3) returns this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Calls `each` with the name (NUL-terminated) and `d_type` of every entry
/// of the open directory `dir` from its current position on, `.` and `..`
/// left out: `getdents64` into a buffer on the stack, so no allocation.
#[cfg(target_os = "linux")]
unsafe fn each_entry(dir: libc::c_int, mut each: impl FnMut(*const libc::c_char, u8)) {
    // 8-byte aligned, as `struct linux_dirent64` records are.
    let mut buffer = [0u64; 512];
    // Ends: each call reads on from where the last stopped, and only the
    // cleaner adds entries (to the top, once per directory moved up).
    loop {
        // SAFETY: getdents64(2) into our buffer, of its size.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir,
                buffer.as_mut_ptr(),
                std::mem::size_of_val(&buffer),
            )
        };
        let Ok(n) = usize::try_from(n) else { return };
        if n == 0 {
            return;
        }
        let n = n.min(std::mem::size_of_val(&buffer));
        let base = buffer.as_ptr().cast::<u8>();
        let mut offset = 0;
        // Each record: `u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type;
        // char d_name[]` (NUL-terminated), within the `n` bytes filled.
        while offset + 20 <= n {
            // SAFETY: the record's fixed part lies within the `n` bytes.
            let (length, kind, name) = unsafe {
                let entry = base.add(offset);
                (
                    usize::from(std::ptr::read_unaligned(entry.add(16).cast::<u16>())),
                    *entry.add(18),
                    entry.add(19).cast::<libc::c_char>(),
                )
            };
            if length < 20 || offset + length > n {
                return;
            }
            offset += length;
            // SAFETY: the name is NUL-terminated within the record.
            let dots = unsafe {
                *name == b'.' as libc::c_char
                    && (*name.add(1) == 0
                        || (*name.add(1) == b'.' as libc::c_char && *name.add(2) == 0))
            };
            if !dots {
                each(name, kind);
            }
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

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::remove_dir_tree;
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    /// A fresh directory of this test's, holding `tree` (what the cleaner
    /// removes) and `outside` (what it must leave alone).
    fn place(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
        let base =
            std::env::temp_dir().join(format!("subloop-cleaner-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let tree = base.join("tree");
        let outside = base.join("outside");
        std::fs::create_dir_all(outside.join("dir")).unwrap();
        std::fs::write(outside.join("target.txt"), "keep").unwrap();
        std::fs::write(outside.join("dir/inner.txt"), "keep").unwrap();
        std::fs::create_dir(&tree).unwrap();
        (base, tree, outside)
    }

    /// 1,000 nested directories with files at every level, a symlink to a
    /// file and one to a directory outside at the bottom, a directory at
    /// mode 000 (with things in it) halfway down, 200 siblings a few levels
    /// deep at the top; the top itself left at mode 000.
    fn build(tree: &Path, outside: &Path) {
        for i in 0..200 {
            let sibling = tree.join(format!("wide-{i}/a/b"));
            std::fs::create_dir_all(&sibling).unwrap();
            std::fs::write(sibling.join("f"), "x").unwrap();
        }
        let mut dir = tree.to_path_buf();
        let mut locked = None;
        for depth in 0..1000 {
            dir.push("d");
            std::fs::create_dir(&dir).unwrap();
            for i in 0..3 {
                std::fs::write(dir.join(format!("file-{i}")), "x".repeat(i)).unwrap();
            }
            if depth == 500 {
                let sealed = dir.join("sealed");
                std::fs::create_dir_all(sealed.join("inner")).unwrap();
                std::fs::write(sealed.join("inner/file"), "x").unwrap();
                locked = Some(sealed);
            }
        }
        std::os::unix::fs::symlink(outside.join("target.txt"), dir.join("to-file")).unwrap();
        std::os::unix::fs::symlink(outside.join("dir"), dir.join("to-dir")).unwrap();
        if let Some(sealed) = locked {
            std::fs::set_permissions(sealed, std::fs::Permissions::from_mode(0o000)).unwrap();
        }
        std::fs::set_permissions(tree, std::fs::Permissions::from_mode(0o000)).unwrap();
    }

    fn assert_outside_intact(outside: &Path) {
        assert_eq!(
            std::fs::read_to_string(outside.join("target.txt")).unwrap(),
            "keep"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("dir/inner.txt")).unwrap(),
            "keep"
        );
    }

    #[test]
    fn a_tree_1000_deep_is_removed_promptly_and_nothing_outside() {
        let (base, tree, outside) = place("deep");
        build(&tree, &outside);
        let started = Instant::now();
        remove_dir_tree(&tree);
        let took = started.elapsed();
        assert!(!tree.exists(), "{} is still there", tree.display());
        assert!(took < Duration::from_secs(10), "took {took:?}");
        assert_outside_intact(&outside);
        // Again: nothing left to do.
        remove_dir_tree(&tree);
        std::fs::remove_dir_all(base).unwrap();
    }

    /// Without root's right to read any directory, a directory at mode 000
    /// is opened up first: the cleaner runs as an ordinary user in a forked
    /// child here (this test needs root to become one).
    #[test]
    fn an_ordinary_user_removes_directories_left_at_mode_000() {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // The test above covers the ordinary user.
            return;
        }
        let (base, tree, outside) = place("unprivileged");
        build(&tree, &outside);
        // Everything nobody's, outside too: only not following links keeps it.
        let nobody = 65_534;
        for path in walk(&base).into_iter().chain([base.clone()]) {
            std::os::unix::fs::lchown(&path, Some(nobody), Some(nobody)).unwrap();
        }
        // The suite's TMPDIR may be root's alone (mode 0700): the child
        // enters `base` while still root and names the tree from there.
        let base_path = std::ffi::CString::new(base.to_str().unwrap()).unwrap();
        let path = c"tree";
        let started = Instant::now();
        // SAFETY: the child makes only async-signal-safe calls (system
        // calls, and `remove_tree`, which the forked cleaner calls too).
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: in the forked child, which only exits after.
            unsafe {
                if libc::chdir(base_path.as_ptr()) != 0 {
                    libc::_exit(3);
                }
                let dropped =
                    libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == 0
                        && libc::syscall(libc::SYS_setresgid, nobody, nobody, nobody) == 0
                        && libc::syscall(libc::SYS_setresuid, nobody, nobody, nobody) == 0;
                if !dropped {
                    libc::_exit(2);
                }
                super::remove_tree(path.as_ptr());
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        assert!(!tree.exists(), "{} is still there", tree.display());
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_outside_intact(&outside);
        std::fs::remove_dir_all(base).unwrap();
    }

    /// Everything beneath `dir` (opening directories as root may, whatever
    /// their mode), symlinks not followed.
    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    stack.push(entry.path());
                }
                found.push(entry.path());
            }
        }
        found
    }
}
