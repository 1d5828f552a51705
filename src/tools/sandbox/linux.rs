//! The sandbox on Linux: a Landlock ruleset (file system, TCP, scoping)
//! and a seccomp filter (sockets, io_uring, foreign system-call ABIs),
//! built before the fork and entered by the child just before `exec`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
};

use super::namespaces::{Mode, Mounts, Plan};
use super::{DEVICES, SYSTEM_PATHS, Sandbox, SandboxError, SandboxPolicy, Support};

/// The ABI whose rights the ruleset handles (see [`super::NEEDED_LANDLOCK_ABI`]).
const ABI_NEEDED: ABI = ABI::V6;

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask the kernel for its ABI version.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The `AUDIT_ARCH_*` value of the system calls this build makes; the
/// filter kills a process that makes them under another ABI (32-bit x86
/// on x86_64, for instance), whose numbers it does not know.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00F3);
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
const AUDIT_ARCH: Option<u32> = None;

/// The system calls the filter answers with `EPERM`:
///
/// * a socket of any family (the network, and the Unix sockets of other
///   programs: Landlock before ABI 9 does not confine connecting to
///   those), and io_uring, whose operations (`IORING_OP_SOCKET`) the
///   filter could not see;
/// * the kernel's keyrings (`keyctl`, `add_key`, `request_key`);
/// * namespaces and mounts (`unshare`, `setns`, the mount API): the
///   sandbox's view of the file system stays as it was built;
/// * `memfd_create` (a program made in memory would run whatever
///   Landlock's execute rule says), `fanotify_init`, `bpf`.
const DENIED_SYSCALLS: [libc::c_long; 20] = [
    libc::SYS_socket,
    libc::SYS_io_uring_setup,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_memfd_create,
    libc::SYS_fanotify_init,
    libc::SYS_bpf,
];

/// The `CLONE_NEW*` flags: a `clone(2)` asking for any is refused
/// (`CLONE_NEWTIME`, `CLONE_NEWNS`, `CLONE_NEWCGROUP`, `CLONE_NEWUTS`,
/// `CLONE_NEWIPC`, `CLONE_NEWUSER`, `CLONE_NEWPID`, `CLONE_NEWNET`).
const CLONE_NAMESPACES: u32 = 0x7E02_0080;

/// What the child enters: the ruleset's descriptor, the filter's program
/// and the plan of its namespaces.
#[derive(Debug)]
pub(super) struct Rules {
    ruleset: OwnedFd,
    filter: Vec<libc::sock_filter>,
    plan: Plan,
}

pub(super) fn probe() -> Support {
    // SAFETY: landlock_create_ruleset(2) with a null attribute and the
    // VERSION flag only returns the ABI version; no memory is touched.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    let mut errno_action: u32 = libc::SECCOMP_RET_ERRNO;
    // SAFETY: seccomp(2) GET_ACTION_AVAIL reads one u32 we own.
    let seccomp = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0u32,
            &raw mut errno_action,
        )
    } == 0;
    let mode = Mode::current();
    Support {
        landlock_abi: u32::try_from(abi).ok().filter(|abi| *abi > 0),
        seccomp,
        known_arch: AUDIT_ARCH.is_some(),
        namespaces: super::namespaces::available(mode).map(|()| mode.describe()),
    }
}

/// The rights on the workspace for `level`.
fn workspace_access(level: Sandbox) -> BitFlags<AccessFs> {
    match level {
        Sandbox::ReadOnly => AccessFs::from_read(ABI_NEEDED),
        _ => AccessFs::from_all(ABI_NEEDED),
    }
}

pub(super) fn prepare(
    policy: &SandboxPolicy,
    workspace: &Path,
    temp: &Path,
    staging: &Path,
    protected: Vec<std::path::PathBuf>,
) -> Result<Arc<Rules>, SandboxError> {
    let mode = Mode::current();
    if mode == Mode::Root {
        super::namespaces::idmap_supported(workspace).map_err(|missing| SandboxError::Kernel {
            level: policy.level,
            missing,
        })?;
    }
    let ruleset = ruleset(policy, workspace, temp)?;
    let filter = filter().ok_or_else(|| {
        SandboxError::Rules(format!(
            "no system-call filter for {}",
            std::env::consts::ARCH
        ))
    })?;
    // Paths given to read are bound where they lead (no link is followed
    // while the new root is built).
    let read_paths: Vec<std::path::PathBuf> = policy
        .read_paths
        .iter()
        .filter(|path| path.is_absolute())
        .filter_map(|path| std::fs::canonicalize(path).ok())
        .collect();
    let system: Vec<&Path> = SYSTEM_PATHS
        .iter()
        .map(Path::new)
        .chain(read_paths.iter().map(std::path::PathBuf::as_path))
        .collect();
    let mounts = Mounts {
        system,
        devices: DEVICES.iter().map(Path::new).collect(),
        workspace: (workspace, policy.level == Sandbox::WorkspaceWrite),
        temp,
        protected,
    };
    let proc_access = (AccessFs::ReadFile | AccessFs::ReadDir).bits();
    let plan = Plan::prepare(mode, staging, &mounts, proc_access).map_err(|err| {
        SandboxError::Rules(format!("cannot plan the sandbox's file system: {err}"))
    })?;
    Ok(Arc::new(Rules {
        ruleset,
        filter,
        plan,
    }))
}

fn ruleset(policy: &SandboxPolicy, workspace: &Path, temp: &Path) -> Result<OwnedFd, SandboxError> {
    let failed = |err: &dyn std::fmt::Display| SandboxError::Rules(err.to_string());
    let read = AccessFs::from_read(ABI_NEEDED);
    let mut rules: Vec<(&Path, BitFlags<AccessFs>)> = Vec::new();
    for path in SYSTEM_PATHS {
        rules.push((Path::new(path), read));
    }
    for path in &policy.read_paths {
        rules.push((path, read));
    }
    for device in DEVICES {
        let mut access = AccessFs::ReadFile | AccessFs::IoctlDev;
        if device == "/dev/null" {
            access |= AccessFs::WriteFile | AccessFs::Truncate;
        }
        rules.push((Path::new(device), access));
    }
    rules.push((workspace, workspace_access(policy.level)));
    // The private TMPDIR: read and write, no execute.
    rules.push((temp, AccessFs::from_all(ABI_NEEDED) & !AccessFs::Execute));

    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI_NEEDED))
        .map_err(|err| failed(&err))?
        .handle_access(AccessNet::from_all(ABI_NEEDED))
        .map_err(|err| failed(&err))?
        .scope(Scope::from_all(ABI_NEEDED))
        .map_err(|err| failed(&err))?
        .create()
        .map_err(|err| failed(&err))?;
    for (path, access) in rules {
        // A path this system does not have (`/lib32`, `/nix/store`) gets no rule.
        let Ok(metadata) = std::fs::metadata(path) else {
            continue;
        };
        let access = if metadata.is_dir() {
            access
        } else {
            access & AccessFs::from_file(ABI_NEEDED)
        };
        let fd = PathFd::new(path).map_err(|err| failed(&err))?;
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|err| failed(&format!("{}: {err}", path.display())))?;
    }
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| SandboxError::Rules("the kernel made no Landlock ruleset".into()))
}

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The seccomp program: foreign ABIs are killed, the [`DENIED_SYSCALLS`]
/// (and, on x86_64, every x32 call) fail with `EPERM`, `clone3` with
/// `ENOSYS` (its flags are out of the filter's reach; C libraries then
/// use `clone`), `clone` with any [`CLONE_NAMESPACES`] flag with `EPERM`;
/// the rest is allowed.
fn filter() -> Option<Vec<libc::sock_filter>> {
    let arch = AUDIT_ARCH?;
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let equal = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    let deny = libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA);
    // struct seccomp_data: nr at 0, arch at 4.
    let mut program = vec![
        statement(load, 4),
        jump(equal, arch, 1, 0),
        statement(ret, libc::SECCOMP_RET_KILL_PROCESS),
        statement(load, 0),
    ];
    if cfg!(target_arch = "x86_64") {
        // __X32_SYSCALL_BIT: the same calls under other numbers.
        program.push(jump(
            libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
            0x4000_0000,
            0,
            1,
        ));
        program.push(statement(ret, deny));
    }
    for nr in DENIED_SYSCALLS {
        program.push(jump(equal, u32::try_from(nr).ok()?, 0, 1));
        program.push(statement(ret, deny));
    }
    let no_such_call = libc::SECCOMP_RET_ERRNO | (libc::ENOSYS as u32 & libc::SECCOMP_RET_DATA);
    program.push(jump(equal, u32::try_from(libc::SYS_clone3).ok()?, 0, 1));
    program.push(statement(ret, no_such_call));
    // clone(flags, ...): the flags' low 32 bits are at offset 16 (args[0]).
    program.push(jump(equal, u32::try_from(libc::SYS_clone).ok()?, 0, 3));
    program.push(statement(load, 16));
    program.push(jump(
        libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K,
        CLONE_NAMESPACES,
        0,
        1,
    ));
    program.push(statement(ret, deny));
    program.push(statement(ret, libc::SECCOMP_RET_ALLOW));
    Some(program)
}

/// Makes the command's forked child enter `rules` just before `exec`.
pub(super) fn install(command: &mut Command, rules: Arc<Rules>) {
    // SAFETY: the closure runs in the forked child and only makes
    // async-signal-safe system calls on memory prepared before the fork
    // (no allocation, no lock): see `Rules::enter`.
    unsafe {
        command.pre_exec(move || rules.enter());
    }
}

/// Makes the command's forked child mark every descriptor but 0, 1 and 2
/// close-on-exec (the unconfined level: no descriptor subloop inherited
/// reaches the program).
pub(super) fn close_inherited(command: &mut Command) {
    let highest = crate::run::harden::highest_fd();
    // SAFETY: async-signal-safe system calls in the forked child.
    unsafe {
        command.pre_exec(move || {
            crate::run::harden::close_inherited_fds(highest);
            Ok(())
        });
    }
}

impl Rules {
    /// The namespaces and the new root ([`Plan::enter`]; from here on
    /// this is the namespace's init); the capability bounding set emptied
    /// while root's rights still allow it; the program's user (when subloop
    /// runs as root); `no_new_privs`; no capability left (with
    /// `no_new_privs` an `exec` gives none back); the Landlock domain; the
    /// seccomp filter; then the program is forked ([`Plan::run_program`])
    /// and returns to `exec`, while the init waits for it.
    /// Async-signal-safe: system calls only, on memory prepared before the
    /// fork, and `io::Error` from an errno (which does not allocate).
    fn enter(&self) -> std::io::Result<()> {
        let program = libc::sock_fprog {
            len: u16::try_from(self.filter.len()).unwrap_or(u16::MAX),
            filter: self.filter.as_ptr().cast_mut(),
        };
        // SAFETY: plain system calls on this process; `program` points to
        // the filter, which lives as long as `self`; `enter` and
        // `run_program` run in the forked child, as they require.
        unsafe {
            let init = self.plan.enter(self.ruleset.as_raw_fd())?;
            // The bounding set while root's (or the user namespace
            // owner's) CAP_SETPCAP still allows it.
            crate::run::harden::drop_bounding_set();
            self.plan.become_program_user()?;
            // The init still holds a copy of subloop's memory and
            // environment (the API keys) and runs as the program's user:
            // not dumpable, so the program cannot read its `/proc/1/environ`
            // or `/proc/1/mem` (the program itself, after `exec`, is).
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            crate::run::harden::clear_capabilities()?;
            if libc::syscall(
                libc::SYS_landlock_restrict_self,
                self.ruleset.as_raw_fd(),
                0u32,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0u32,
                &raw const program,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            self.plan.run_program(init)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    /// The Landlock layer alone (no seccomp filter) refuses a TCP connect
    /// with `EACCES`: the network rule holds even where `socket(2)` is allowed.
    #[test]
    fn landlock_alone_refuses_tcp() {
        if probe().landlock_abi.unwrap_or(0) < 6 || !Path::new("/usr/bin/python3").exists() {
            assert!(
                std::env::var_os("SUBLOOP_NO_SKIP").is_none(),
                "skipped: needs Landlock ABI 6 and /usr/bin/python3 (SUBLOOP_NO_SKIP is set)"
            );
            eprintln!("skipped: needs Landlock ABI 6 and /usr/bin/python3");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let dir = std::env::temp_dir();
        let temp = super::super::PrivateTemp::create(&dir).unwrap();
        let policy = SandboxPolicy::default();
        let ruleset = ruleset(&policy, temp.path(), temp.path()).unwrap();
        let ruleset = Arc::new(ruleset);
        let code = format!(
            "import socket\n\
             try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n    print('connected')\n\
             except OSError as err:\n    print(err.errno)\n"
        );
        let mut command = Command::new("/usr/bin/python3");
        command
            .args(["-c", &code])
            .current_dir(temp.path())
            .stdout(std::process::Stdio::piped());
        // SAFETY: system calls only, in the forked child.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32)
                        != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        child.wait().unwrap();
        assert_eq!(out.trim(), libc::EACCES.to_string(), "{out}");
    }

    #[test]
    fn the_filter_ends_in_allow_and_denies_sockets() {
        let program = filter().expect("a known architecture");
        let last = program.last().map(|op| op.k);
        assert_eq!(last, Some(libc::SECCOMP_RET_ALLOW));
        let socket = u32::try_from(libc::SYS_socket).unwrap();
        assert!(program.iter().any(|op| op.k == socket));
    }
}
