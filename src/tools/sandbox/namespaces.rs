//! The sandbox's namespaces on Linux: the program runs as process 2 of a
//! PID namespace of its own, with its own IPC, network and mount
//! namespaces, in a root file system made only of what it may see.
//!
//! Three processes, all forked from the `pre_exec` of the command that
//! starts the program:
//!
//! * the **outer** process (the one `std::process::Command` forked, so the
//!   one subloop waits for and times out) unshares the namespaces, forks
//!   the init, closes every other descriptor, and exits as the program
//!   did (its exit code, or the same signal);
//! * the **init** (process 1 of the new PID namespace) builds the new root
//!   (a tmpfs holding bind mounts of the system directories, read-only,
//!   the workspace, the private `TMPDIR`, four devices, a `/proc` of the
//!   namespace), pivots into it, gives up root's identity or the
//!   namespace's capabilities, enters Landlock and seccomp, forks the
//!   program, waits for it and reports its wait status to the outer
//!   process. Signals sent from inside the namespace do not reach it, and
//!   when it exits the kernel kills every process left in the namespace,
//!   those that left the process group included;
//! * the **program** (process 2) returns from `pre_exec` and `exec`s.
//!
//! Everything is prepared before the fork ([`Plan::prepare`]); the forked
//! processes only make system calls on that memory (async-signal-safe).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::run::harden::PidNamespace;

/// `OPEN_TREE_CLONE`: a detached copy of a mount tree.
const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `AT_RECURSIVE`: with the mounts beneath.
const AT_RECURSIVE: libc::c_uint = 0x8000;
/// `MOVE_MOUNT_F_EMPTY_PATH`: the source is the descriptor itself.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
/// `MOUNT_ATTR_*`.
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_IDMAP: u64 = 0x10_0000;
/// `LANDLOCK_RULE_PATH_BENEATH`.
const LANDLOCK_RULE_PATH_BENEATH: libc::c_uint = 1;

/// The namespaces every confined program gets.
const NAMESPACES: libc::c_int =
    libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWNET;

/// The user and group id a program runs as when subloop runs as root:
/// no account's, so it owns no file outside what the sandbox maps to it.
pub const SANDBOX_UID: u32 = 2_147_483_646;

/// `struct mount_attr`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `struct landlock_path_beneath_attr` (packed).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// How the program gets its namespaces and who it runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// subloop runs as root: the namespaces are made directly, and the
    /// program runs as [`SANDBOX_UID`], the workspace and `TMPDIR` mapped
    /// to it by ID-mapped mounts.
    Root,
    /// subloop runs as another user: a user namespace first, mapping that
    /// user to itself, then the others inside it.
    User,
}

impl Mode {
    /// The mode for this process (by its effective user id).
    pub fn current() -> Self {
        // SAFETY: geteuid(2) cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            Self::Root
        } else {
            Self::User
        }
    }

    /// A name for `subloop doctor`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Root => {
                "namespaces (PID, IPC, network, mount), the program as an unprivileged user"
            }
            Self::User => "namespaces (user, PID, IPC, network, mount)",
        }
    }
}

/// One bind mount of the new root.
#[derive(Debug)]
struct Bind {
    source: CString,
    target: CString,
    attr_set: u64,
    /// Mapped to the program's user (the root mode's workspace and `TMPDIR`).
    idmap: bool,
}

/// Who the program becomes.
#[derive(Debug)]
enum Identity {
    /// Root: `setresuid`/`setresgid` to [`SANDBOX_UID`]; the user namespace
    /// that maps the workspace's owner to it.
    Root { idmap: Arc<OwnedFd> },
    /// Another user: the user namespace maps that user to itself.
    User,
}

/// Everything the forked processes need, prepared before the fork.
#[derive(Debug)]
pub struct Plan {
    identity: Identity,
    /// The namespaces to unshare (with a user namespace and its maps when
    /// subloop is not root).
    namespace: PidNamespace,
    /// Where the new root's tmpfs is mounted (an empty directory of ours).
    staging: CString,
    /// Directories to create in the new root, parents first.
    dirs: Vec<CString>,
    /// Empty files to create as mount points (devices).
    files: Vec<CString>,
    binds: Vec<Bind>,
    symlinks: Vec<(CString, CString)>,
    /// The new root's `/proc`.
    proc_dir: CString,
    /// Landlock's read rights for `/proc`.
    proc_access: u64,
    /// The program's working directory after the pivot.
    workdir: CString,
    /// The highest descriptor number to mark close-on-exec where
    /// `close_range(2)` is missing.
    highest_fd: libc::c_int,
}

/// What a bind mount of `prepare` is for.
pub struct Mounts<'a> {
    /// Read and execute.
    pub system: Vec<&'a Path>,
    /// Devices (files).
    pub devices: Vec<&'a Path>,
    /// The workspace, and whether it is writable.
    pub workspace: (&'a Path, bool),
    /// The private `TMPDIR`.
    pub temp: &'a Path,
    /// Paths inside the workspace bound read-only over themselves.
    pub protected: Vec<PathBuf>,
}

fn cstring(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "a path holds a NUL byte")
    })
}

/// `staging` joined with the absolute `path`.
fn under(staging: &Path, path: &Path) -> PathBuf {
    let mut joined = staging.to_path_buf();
    for component in path.components() {
        if let Component::Normal(name) = component {
            joined.push(name);
        }
    }
    joined
}

impl Plan {
    /// Plans the new root, built in `staging` (an empty directory the
    /// program never sees), with `proc_access` the Landlock rights on `/proc`.
    pub fn prepare(
        mode: Mode,
        staging: &Path,
        mounts: &Mounts<'_>,
        proc_access: u64,
    ) -> std::io::Result<Self> {
        let (workspace, writable) = mounts.workspace;
        let identity = match mode {
            Mode::Root => {
                let owner = std::fs::metadata(workspace)?;
                Identity::Root {
                    idmap: idmap_userns(owner.uid(), owner.gid())?,
                }
            }
            Mode::User => Identity::User,
        };
        // CLONE_NEWPID and these, and CLONE_NEWUSER when not root.
        let namespace =
            PidNamespace::prepare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWNET)?;
        let idmap = mode == Mode::Root;
        let read_only = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        // (path, kind) in the new root: parents are bound before children.
        let mut binds: Vec<(PathBuf, u64, bool)> = Vec::new();
        for path in &mounts.system {
            binds.push((path.to_path_buf(), read_only, false));
        }
        let workspace_attr = if writable {
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
        } else {
            read_only
        };
        binds.push((workspace.to_path_buf(), workspace_attr, idmap));
        binds.push((
            mounts.temp.to_path_buf(),
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            idmap,
        ));
        binds.sort_by_key(|(path, _, _)| path.components().count());
        // The protected paths: each directory between the workspace and one
        // is bound over itself (a mount point cannot be renamed or removed,
        // so the path keeps leading to the protected file), then the file
        // or directory itself, read-only.
        let mut protected: Vec<(PathBuf, u64, bool)> = Vec::new();
        for path in &mounts.protected {
            let Ok(relative) = path.strip_prefix(workspace) else {
                continue;
            };
            // A symbolic link on the way would make the bind mount go
            // where the link leads, and the program could replace it:
            // refused rather than half kept.
            let mut at = workspace.to_path_buf();
            for component in relative.components() {
                at.push(component);
                if at
                    .symlink_metadata()
                    .is_ok_and(|metadata| metadata.file_type().is_symlink())
                {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!(
                            "{} is a symbolic link, and a program could replace it with one \
                             that code outside the sandbox follows; make it a file or folder, \
                             or remove it",
                            at.display()
                        ),
                    ));
                }
            }
            let mut ancestor = workspace.to_path_buf();
            let components: Vec<_> = relative.components().collect();
            for component in components.iter().take(components.len().saturating_sub(1)) {
                ancestor.push(component);
                if !protected.iter().any(|(known, _, _)| *known == ancestor) {
                    protected.push((ancestor.clone(), workspace_attr, idmap));
                }
            }
            if path.symlink_metadata().is_ok() && !protected.iter().any(|(p, _, _)| p == path) {
                protected.push((path.clone(), read_only, idmap));
            }
        }
        protected.sort_by_key(|(path, _, _)| path.components().count());
        binds.extend(protected);

        let mut dirs: Vec<PathBuf> = Vec::new();
        let add_dirs = |path: &Path, dirs: &mut Vec<PathBuf>| {
            let mut at = PathBuf::from("/");
            for component in path.components() {
                if let Component::Normal(name) = component {
                    at.push(name);
                    if !dirs.contains(&at) {
                        dirs.push(at.clone());
                    }
                }
            }
        };
        let mut files = Vec::new();
        // A system directory that is a symbolic link (`/lib` -> `usr/lib`
        // where /usr is merged) is the same link in the new root.
        let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
        binds.retain(|(path, _, _)| {
            let is_link = path
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink());
            if is_link && mounts.system.contains(&path.as_path()) {
                if let Ok(to) = std::fs::read_link(path) {
                    links.push((to, path.clone()));
                }
                return false;
            }
            true
        });
        for (_, at) in &links {
            if let Some(parent) = at.parent() {
                add_dirs(parent, &mut dirs);
            }
        }
        for (path, _, _) in &binds {
            let Ok(metadata) = path.metadata() else {
                continue;
            };
            if metadata.is_dir() {
                add_dirs(path, &mut dirs);
            } else if let Some(parent) = path.parent() {
                add_dirs(parent, &mut dirs);
                files.push(cstring(&under(staging, path))?);
            }
        }
        add_dirs(Path::new("/proc"), &mut dirs);
        add_dirs(Path::new("/dev"), &mut dirs);
        for device in &mounts.devices {
            files.push(cstring(&under(staging, device))?);
            binds.push((
                device.to_path_buf(),
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
                false,
            ));
        }
        let binds = binds
            .into_iter()
            .filter(|(path, _, _)| path.symlink_metadata().is_ok())
            .map(|(path, attr_set, idmap)| {
                Ok(Bind {
                    source: cstring(&path)?,
                    target: cstring(&under(staging, &path))?,
                    attr_set,
                    idmap,
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let symlinks = [
            ("/proc/self/fd", "/dev/fd"),
            ("/proc/self/fd/0", "/dev/stdin"),
            ("/proc/self/fd/1", "/dev/stdout"),
            ("/proc/self/fd/2", "/dev/stderr"),
        ]
        .into_iter()
        .map(|(to, at)| (PathBuf::from(to), PathBuf::from(at)))
        .chain(links)
        .map(|(to, at)| Ok((cstring(&to)?, cstring(&under(staging, &at))?)))
        .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            identity,
            namespace,
            staging: cstring(staging)?,
            dirs: dirs
                .iter()
                .map(|dir| cstring(&under(staging, dir)))
                .collect::<std::io::Result<_>>()?,
            files,
            binds,
            symlinks,
            proc_dir: cstring(&under(staging, Path::new("/proc")))?,
            proc_access,
            workdir: cstring(workspace)?,
            highest_fd: crate::run::harden::highest_fd(),
        })
    }

    /// In the forked child, before anything else of the sandbox: unshares
    /// the namespaces and forks twice (see the module's documentation).
    /// Returns in the init, process 1 of the namespace, with the new root
    /// built and entered; the caller then drops its rights, enters Landlock
    /// (`ruleset`, to which the rule for the new `/proc` is added here) and
    /// seccomp, and calls [`Plan::run_program`].
    ///
    /// # Safety
    ///
    /// Only in a forked child (a `pre_exec` closure).
    pub unsafe fn enter(&self, ruleset: libc::c_int) -> std::io::Result<Init> {
        // SAFETY: system calls on memory prepared before the fork.
        unsafe {
            self.namespace.unshare()?;
            let mut status_pipe = [0 as libc::c_int; 2];
            check(libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC))?;
            let [read_end, write_end] = status_pipe;
            let init = libc::fork();
            if init < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if init > 0 {
                outer(init, read_end, write_end);
            }
            libc::close(read_end);
            // The init dies with the outer process (a SIGKILL of the group
            // reaches both, but the init may be the one still running).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            self.build_root(ruleset)?;
            Ok(Init {
                status_fd: write_end,
            })
        }
    }

    unsafe fn build_root(&self, ruleset: libc::c_int) -> std::io::Result<()> {
        // SAFETY: system calls on memory prepared before the fork.
        unsafe {
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                self.staging.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755,size=1m".as_ptr().cast(),
            ))?;
            for dir in &self.dirs {
                libc::mkdir(dir.as_ptr(), 0o755);
            }
            for file in &self.files {
                let fd = libc::open(
                    file.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                    0o644,
                );
                if fd >= 0 {
                    libc::close(fd);
                }
            }
            for (to, at) in &self.symlinks {
                libc::symlink(to.as_ptr(), at.as_ptr());
            }
            for bind in &self.binds {
                self.bind(bind)?;
            }
            check(libc::mount(
                c"proc".as_ptr(),
                self.proc_dir.as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            // The new /proc is another file system than the one the ruleset
            // was given: its rule is added here.
            let proc_fd = check(libc::open(
                self.proc_dir.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            ))?;
            let rule = PathBeneathAttr {
                allowed_access: self.proc_access,
                parent_fd: proc_fd,
            };
            let added = libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset,
                LANDLOCK_RULE_PATH_BENEATH,
                &raw const rule,
                0u32,
            );
            libc::close(proc_fd);
            if added != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // pivot_root(".", "."): the old root is stacked beneath the new
            // one and detached at once.
            check(libc::chdir(self.staging.as_ptr()))?;
            check(
                libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as libc::c_int,
            )?;
            check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
            check(libc::chdir(c"/".as_ptr()))?;
            let read_only = MountAttr {
                attr_set: MOUNT_ATTR_RDONLY,
                attr_clr: 0,
                propagation: 0,
                userns_fd: 0,
            };
            check(libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                c"/".as_ptr(),
                0u32,
                &raw const read_only,
                std::mem::size_of::<MountAttr>(),
            ) as libc::c_int)?;
            check(libc::chdir(self.workdir.as_ptr()))?;
        }
        Ok(())
    }

    unsafe fn bind(&self, bind: &Bind) -> std::io::Result<()> {
        // SAFETY: system calls on memory prepared before the fork; the
        // descriptor is ours and closed on every path.
        unsafe {
            let tree = check(libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                bind.source.as_ptr(),
                OPEN_TREE_CLONE
                    | AT_RECURSIVE
                    | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint
                    | libc::O_CLOEXEC as libc::c_uint,
            ) as libc::c_int)?;
            let userns = match (&self.identity, bind.idmap) {
                (Identity::Root { idmap }, true) => Some(idmap.as_raw_fd()),
                _ => None,
            };
            let attr = MountAttr {
                attr_set: bind.attr_set | userns.map_or(0, |_| MOUNT_ATTR_IDMAP),
                attr_clr: 0,
                propagation: 0,
                userns_fd: userns.map_or(0, |fd| fd as u64),
            };
            let set = libc::syscall(
                libc::SYS_mount_setattr,
                tree,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
                &raw const attr,
                std::mem::size_of::<MountAttr>(),
            );
            let moved = set == 0
                && libc::syscall(
                    libc::SYS_move_mount,
                    tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    bind.target.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ) == 0;
            let err = std::io::Error::last_os_error();
            libc::close(tree);
            if moved { Ok(()) } else { Err(err) }
        }
    }

    /// In the init, once it is confined: becomes the program's identity,
    /// forks the program (which returns to `exec`), and never returns
    /// itself: it waits for the program and reports its wait status.
    ///
    /// # Safety
    ///
    /// Only in the init that [`Plan::enter`] returned in.
    pub unsafe fn run_program(&self, init_side: Init) -> std::io::Result<()> {
        // SAFETY: system calls; the init never returns from `init`.
        unsafe {
            let program = libc::fork();
            if program < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if program > 0 {
                init(program, init_side.status_fd);
            }
            // The program: every descriptor but 0, 1 and 2 goes at exec.
            crate::run::harden::close_inherited_fds(self.highest_fd);
        }
        Ok(())
    }

    /// In the init, as root: gives up root for [`SANDBOX_UID`]. Call
    /// after the capability bounding set is emptied (which needs root's
    /// capabilities) and before the remaining sets are cleared.
    ///
    /// # Safety
    ///
    /// Only in the init that [`Plan::enter`] returned in.
    pub unsafe fn become_program_user(&self) -> std::io::Result<()> {
        if let Identity::Root { .. } = self.identity {
            // SAFETY: system calls changing this process's identity.
            unsafe {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setresgid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID))?;
                check(libc::setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID))?;
            }
        }
        Ok(())
    }
}

/// The init's side of the pipe to the outer process, returned by
/// [`Plan::enter`] in the init only.
#[derive(Debug)]
pub struct Init {
    status_fd: libc::c_int,
}

/// The outer process: closes every descriptor but the status pipe (so the
/// exec-error pipe of `std::process` is held by the program alone), waits
/// for the init, and exits as the program did.
unsafe fn outer(init: libc::pid_t, read_end: libc::c_int, write_end: libc::c_int) -> ! {
    // SAFETY: system calls in a forked child that never returns.
    unsafe {
        libc::close(write_end);
        close_all_but(read_end);
        let mut reported: libc::c_int = 0;
        let mut got = 0usize;
        while got < 4 {
            let n = libc::read(
                read_end,
                (&raw mut reported).cast::<u8>().add(got).cast(),
                4 - got,
            );
            if n > 0 {
                got += n as usize;
            } else if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            } else {
                break;
            }
        }
        let mut status = 0;
        while libc::waitpid(init, &mut status, 0) < 0 && *libc::__errno_location() == libc::EINTR {}
        // The program's own status when the init reported it, else the init's.
        crate::run::harden::exit_as(if got == 4 { reported } else { status });
    }
}

/// The init: reaps every process of the namespace until the program is
/// reaped, reports the program's status to the outer process, and exits
/// (the kernel then kills what is left in the namespace).
unsafe fn init(program: libc::pid_t, status_fd: libc::c_int) -> ! {
    // SAFETY: system calls in a forked child that never returns.
    unsafe {
        close_all_but(status_fd);
        loop {
            let mut status = 0;
            let pid = libc::waitpid(-1, &mut status, 0);
            if pid == program {
                let bytes = status.to_ne_bytes();
                libc::write(status_fd, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0);
            }
            if pid < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
    }
}

/// Closes every descriptor from 3 on but `one` and `two`.
unsafe fn close_all_but_two(one: libc::c_int, two: libc::c_int) {
    let (low, high) = (one.min(two), one.max(two));
    let mut from: libc::c_int = 3;
    for keep in [low, high] {
        if keep > from {
            // SAFETY: closes descriptors of this process only.
            unsafe {
                libc::syscall(
                    libc::SYS_close_range,
                    from as libc::c_uint,
                    (keep - 1) as libc::c_uint,
                    0u32,
                );
            }
        }
        from = from.max(keep + 1);
    }
    // SAFETY: as above.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            from as libc::c_uint,
            libc::c_uint::MAX,
            0u32,
        );
    }
}

/// Closes every descriptor from 3 on but `keep`.
unsafe fn close_all_but(keep: libc::c_int) {
    // SAFETY: closes descriptors of this process only.
    unsafe {
        if keep > 3 {
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                (keep - 1) as libc::c_uint,
                0u32,
            );
        }
        libc::syscall(
            libc::SYS_close_range,
            (keep.max(2) + 1) as libc::c_uint,
            libc::c_uint::MAX,
            0u32,
        );
    }
}

fn check(result: libc::c_int) -> std::io::Result<libc::c_int> {
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// The user namespace that maps `uid`/`gid` (the workspace's owner) to
/// [`SANDBOX_UID`]: what the root mode's ID-mapped mounts use. Made for
/// each run (a fork and two writes) and closed with it, so subloop keeps
/// no descriptor between runs.
fn idmap_userns(uid: u32, gid: u32) -> std::io::Result<Arc<OwnedFd>> {
    make_userns(uid, gid).map(Arc::new)
}

fn make_userns(uid: u32, gid: u32) -> std::io::Result<OwnedFd> {
    let (ready_read, ready_write) = std::io::pipe()?;
    let (done_read, done_write) = std::io::pipe()?;
    // SAFETY: the child only makes system calls and exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: in the forked child: unshare, tell, wait, exit.
        unsafe {
            // Every descriptor but its two ends is closed: the parent's
            // ends, so the wait below ends when the parent closes its own,
            // and those of other threads (another run making its namespace
            // at the same moment waits for the end of a pipe this process
            // would otherwise hold).
            close_all_but_two(ready_write.as_raw_fd(), done_read.as_raw_fd());
            let ok = libc::unshare(libc::CLONE_NEWUSER) == 0;
            let byte = u8::from(ok);
            libc::write(ready_write.as_raw_fd(), (&raw const byte).cast(), 1);
            let mut wait = 0u8;
            libc::read(done_read.as_raw_fd(), (&raw mut wait).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_write);
    drop(done_read);
    let reap = |child: libc::pid_t| {
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
    };
    let mut byte = [0u8; 1];
    let told = std::io::Read::read(&mut &ready_read, &mut byte);
    let result = if matches!(told, Ok(1)) && byte[0] == 1 {
        Ok(())
    } else {
        Err(std::io::Error::other("cannot make a user namespace"))
    };
    let result = result.and_then(|()| {
        let proc = PathBuf::from(format!("/proc/{child}"));
        std::fs::write(proc.join("uid_map"), format!("{uid} {SANDBOX_UID} 1\n"))?;
        std::fs::write(proc.join("gid_map"), format!("{gid} {SANDBOX_UID} 1\n"))?;
        let file = std::fs::File::open(proc.join("ns/user"))?;
        Ok(OwnedFd::from(file))
    });
    drop(done_write);
    reap(child);
    result
}

/// Whether this machine lets this process make the sandbox's namespaces
/// (asked once, by a forked child that tries).
pub fn available(mode: Mode) -> Result<(), String> {
    static ASKED: OnceLock<Result<(), String>> = OnceLock::new();
    ASKED
        .get_or_init(|| {
            let flags = match mode {
                Mode::Root => NAMESPACES,
                Mode::User => libc::CLONE_NEWUSER | NAMESPACES,
            };
            // SAFETY: the child makes one system call and exits.
            let child = unsafe { libc::fork() };
            if child < 0 {
                return Err(format!("cannot fork: {}", std::io::Error::last_os_error()));
            }
            if child == 0 {
                // SAFETY: in the forked child.
                unsafe {
                    let code = if libc::unshare(flags) == 0 {
                        0
                    } else {
                        (*libc::__errno_location()).clamp(1, 255)
                    };
                    libc::_exit(code);
                }
            }
            let mut status = 0;
            // SAFETY: waitpid(2) on our own child.
            unsafe { libc::waitpid(child, &mut status, 0) };
            let code = libc::WEXITSTATUS(status);
            if libc::WIFEXITED(status) && code == 0 {
                Ok(())
            } else {
                let err = std::io::Error::from_raw_os_error(code);
                Err(match mode {
                    Mode::Root => format!("cannot make PID, IPC, network and mount namespaces ({err})"),
                    Mode::User => format!(
                        "cannot make a user namespace with PID, IPC, network and mount namespaces ({err}); \
                         unprivileged user namespaces may be turned off \
                         (kernel.unprivileged_userns_clone, user.max_user_namespaces, or an AppArmor \
                         restriction such as kernel.apparmor_restrict_unprivileged_userns)"
                    ),
                })
            }
        })
        .clone()
}

/// Whether the file system of `workspace` takes ID-mapped mounts (needed
/// in the root mode; asked by a forked child, once per file system).
pub fn idmap_supported(workspace: &Path) -> Result<(), String> {
    static ASKED: Mutex<Vec<(u64, Result<(), String>)>> = Mutex::new(Vec::new());
    let dev = std::fs::metadata(workspace)
        .map(|m| m.dev())
        .map_err(|err| err.to_string())?;
    let mut asked = ASKED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, answer)) = asked.iter().find(|(known, _)| *known == dev) {
        return answer.clone();
    }
    let answer = probe_idmap(workspace);
    asked.push((dev, answer.clone()));
    answer
}

fn probe_idmap(workspace: &Path) -> Result<(), String> {
    let owner = std::fs::metadata(workspace).map_err(|err| err.to_string())?;
    let userns = idmap_userns(owner.uid(), owner.gid()).map_err(|err| err.to_string())?;
    let path = cstring(workspace).map_err(|err| err.to_string())?;
    // SAFETY: the child makes system calls on memory prepared before the fork and exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    if child == 0 {
        // SAFETY: in the forked child.
        unsafe {
            let fail = || (*libc::__errno_location()).clamp(1, 255);
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                libc::_exit(fail());
            }
            let tree = libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                path.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
            ) as libc::c_int;
            if tree < 0 {
                libc::_exit(fail());
            }
            let attr = MountAttr {
                attr_set: MOUNT_ATTR_IDMAP,
                attr_clr: 0,
                propagation: 0,
                userns_fd: userns.as_raw_fd() as u64,
            };
            let set = libc::syscall(
                libc::SYS_mount_setattr,
                tree,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint,
                &raw const attr,
                std::mem::size_of::<MountAttr>(),
            );
            libc::_exit(if set == 0 { 0 } else { fail() });
        }
    }
    let mut status = 0;
    // SAFETY: waitpid(2) on our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(format!(
            "the file system of {} does not take ID-mapped mounts ({}), which the sandbox needs \
             when subloop runs as root, to let a program that does not run as root write there",
            workspace.display(),
            std::io::Error::from_raw_os_error(libc::WEXITSTATUS(status))
        ))
    }
}
