//! The sandbox `run_main` starts its program in, usable by any tool that
//! runs programs: a [`SandboxPolicy`] (a [`Sandbox`] level, the environment
//! variables to pass through) turned, once per run, into a [`Confinement`]
//! that is applied to a [`std::process::Command`] before it is spawned.
//!
//! On Linux, a confined program and everything it starts
//!
//! * may read, write and execute in the workspace ([`Sandbox::WorkspaceWrite`];
//!   only read and execute with [`Sandbox::ReadOnly`]) and in a private
//!   temporary directory made for the run (its `TMPDIR`, mode 0700, removed
//!   when the [`Confinement`] is dropped);
//! * may read and execute [`SandboxPolicy::SYSTEM_PATHS`], read `/proc` and use
//!   `/dev/null`, `/dev/zero`, `/dev/urandom` and `/dev/random`, and touch nothing else of the file system (Landlock);
//! * opens no socket at all (seccomp: `socket(2)` fails with `EPERM` for
//!   every address family, `io_uring_setup(2)` too, and TCP `bind`/`connect`
//!   are denied by Landlock as well); `socketpair(2)` still works;
//! * signals, traces and reads `/proc/PID/environ` of no process outside its
//!   own sandbox (Landlock's scoping);
//! * runs with `no_new_privs` (a set-uid program gains nothing);
//! * sees only the environment of [`SandboxPolicy::environment`].
//!
//! The Landlock ruleset and the seccomp filter are built before the fork;
//! the forked child only makes the three system calls that enter them
//! (`prctl(PR_SET_NO_NEW_PRIVS)`, `landlock_restrict_self`, `seccomp`),
//! which are async-signal-safe. A kernel that lacks what a level needs makes
//! [`SandboxPolicy::confine`] fail ([`SandboxError::Kernel`]): the program is
//! not started, never started half-confined. Elsewhere than Linux only
//! [`Sandbox::Off`] can be used.

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
mod namespaces;
mod temp;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::run::shutdown::{Registration, Shutdown};

pub(crate) use temp::PrivateTemp;

/// How far a program started by `run_main` is confined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Sandbox {
    /// The workspace is readable and writable, the system read-only, the
    /// rest of the file system (your home) out of reach; no network. The default.
    #[default]
    WorkspaceWrite,
    /// As [`Sandbox::WorkspaceWrite`], but the workspace is read-only too:
    /// only the private temporary directory is writable.
    ReadOnly,
    /// No sandbox: the program runs with your rights and subloop's whole
    /// environment.
    Off,
}

impl Sandbox {
    /// Every level, in the order `--sandbox` lists them.
    pub const ALL: [Sandbox; 3] = [Self::WorkspaceWrite, Self::ReadOnly, Self::Off];

    /// The level's name: `workspace-write`, `read-only`, `off`.
    pub fn name(self) -> &'static str {
        match self {
            Self::WorkspaceWrite => "workspace-write",
            Self::ReadOnly => "read-only",
            Self::Off => "off",
        }
    }

    /// The level called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|level| level.name() == name)
    }

    /// Whether the level confines the program at all.
    pub fn confines(self) -> bool {
        self != Self::Off
    }
}

impl std::fmt::Display for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The directories a confined program may read and execute from (those
/// that exist): where interpreters, their libraries and the system's
/// configuration live.
pub(crate) const SYSTEM_PATHS: [&str; 9] = [
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc",
    "/opt",
    "/nix/store",
];

/// The devices a confined program may open: `/dev/null` to read and write,
/// the others to read.
pub(crate) const DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

/// The variables a confined program gets from subloop's environment when
/// they are set (`PATH` less the directories the program may not run
/// programs from; `/usr/local/bin:/usr/bin:/bin` when none is left);
/// `HOME` and `TMPDIR` are set by the sandbox (see [`SandboxPolicy::environment`]).
pub(crate) const PASSED_ENV: [&str; 3] = ["PATH", "LANG", "LC_ALL"];

/// Paths inside the workspace a confined program may never write, even at
/// [`Sandbox::WorkspaceWrite`]: what code outside the sandbox reads or runs
/// (git's configuration and hooks, agents' settings and MCP
/// configurations, shell start-up files). Those that exist are mounted
/// read-only in the program's view; those that do not and that the program
/// creates are removed when it ends ([`Confinement::remove_planted`]).
/// A host adds its own with [`SandboxPolicy::protect`].
pub(crate) const PROTECTED_PATHS: [&str; 19] = [
    ".git/config",
    ".git/hooks",
    ".git/info",
    ".claude",
    ".subloop",
    ".mcp.json",
    ".vscode",
    ".idea",
    ".envrc",
    ".gitconfig",
    ".gitmodules",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
];

/// `PATH` when subloop's environment has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What a [`Confinement`] is made from: a level, and the names of the
/// environment variables passed through besides `PATH`, `LANG` and
/// `LC_ALL`.
///
/// ```
/// use subloop::tools::sandbox::{Sandbox, SandboxPolicy};
/// let policy = SandboxPolicy::new(Sandbox::ReadOnly).pass_env("PYTHONPATH");
/// assert_eq!(policy.level(), Sandbox::ReadOnly);
/// assert_eq!(SandboxPolicy::default().level(), Sandbox::WorkspaceWrite);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxPolicy {
    level: Sandbox,
    pass_env: Vec<String>,
    read_paths: Vec<PathBuf>,
    protected: Vec<PathBuf>,
}

impl SandboxPolicy {
    /// The directories a confined program may read and execute from (those
    /// that exist): where interpreters, their libraries and the system's
    /// configuration live.
    pub const SYSTEM_PATHS: [&'static str; 9] = SYSTEM_PATHS;

    /// Paths inside the workspace a confined program may never write, even
    /// at [`Sandbox::WorkspaceWrite`]: what code outside the sandbox reads
    /// or runs (git's configuration and hooks, agents' settings and MCP
    /// configurations, shell start-up files). Those that exist are mounted
    /// read-only in the program's view; those that do not and that the
    /// program creates are removed when it ends
    /// ([`Confinement::remove_planted`]). A host adds its own with
    /// [`SandboxPolicy::protect`].
    pub const PROTECTED_PATHS: [&'static str; 19] = PROTECTED_PATHS;

    /// A policy of `level`, passing only `PATH`, `LANG` and `LC_ALL`.
    pub fn new(level: Sandbox) -> Self {
        Self {
            level,
            pass_env: Vec::new(),
            read_paths: Vec::new(),
            protected: Vec::new(),
        }
    }

    /// Also keeps the program from writing `path` (absolute, or relative
    /// to the workspace), as it is kept from [`SandboxPolicy::PROTECTED_PATHS`]: a hook's
    /// script, a configuration file the host reads again. Paths outside
    /// the workspace need nothing: the program cannot write there anyway.
    pub fn protect(mut self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        if !self.protected.contains(&path) {
            self.protected.push(path);
        }
        self
    }

    /// The paths inside `workspace` (a canonical directory) the program may
    /// not write: [`SandboxPolicy::PROTECTED_PATHS`] and those of [`SandboxPolicy::protect`].
    pub fn protected_paths(&self, workspace: &Path) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = PROTECTED_PATHS
            .iter()
            .map(|name| workspace.join(name))
            .collect();
        for path in &self.protected {
            let path = if path.is_absolute() {
                path.clone()
            } else {
                workspace.join(path)
            };
            // The path as named (a symbolic link on it then refuses the
            // run: the program could replace the link) and the real path
            // of what exists (what a reader gets).
            let named = (!path
                .components()
                .any(|part| part == std::path::Component::ParentDir))
            .then(|| path.clone());
            let real = std::fs::canonicalize(&path).ok();
            for path in named.into_iter().chain(real) {
                if path.starts_with(workspace) && path != workspace && !paths.contains(&path) {
                    paths.push(path);
                }
            }
        }
        paths
    }

    /// The same policy with another level.
    pub fn with_level(mut self, level: Sandbox) -> Self {
        self.level = level;
        self
    }

    /// Also passes the variable `name` through when it is set (an API key
    /// the program needs, `PYTHONPATH`, ...). A name given here wins over
    /// the sandbox's own `HOME` and `TMPDIR`.
    pub fn pass_env(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        if !self.pass_env.contains(&name) {
            self.pass_env.push(name);
        }
        self
    }

    /// Also lets the program read and execute beneath `path`, an absolute
    /// path (an interpreter installed in your home, a data directory); a
    /// path that does not exist when a run starts is left out.
    pub fn allow_read(mut self, path: impl Into<PathBuf>) -> Self {
        self.read_paths.push(path.into());
        self
    }

    /// The level.
    pub fn level(&self) -> Sandbox {
        self.level
    }

    /// The names passed through besides `PATH`, `LANG` and `LC_ALL`.
    pub fn passed_env(&self) -> &[String] {
        &self.pass_env
    }

    /// The environment a confined program gets, from `parent` (subloop's
    /// own, for [`SandboxPolicy::confine`]): `PATH`, `LANG` and `LC_ALL` where set
    /// (`PATH` without the directories the program may not run programs
    /// from, and `/usr/local/bin:/usr/bin:/bin` when none is left), `HOME` (the
    /// workspace, or with [`Sandbox::ReadOnly`] the private temporary
    /// directory), `TMPDIR` (the private temporary directory), then every
    /// name of [`SandboxPolicy::pass_env`] that `parent` has.
    pub fn environment(
        &self,
        parent: impl IntoIterator<Item = (OsString, OsString)>,
        workspace: &Path,
        temp: &Path,
    ) -> Vec<(OsString, OsString)> {
        let parent: Vec<(OsString, OsString)> = parent.into_iter().collect();
        let lookup = |name: &str| {
            parent
                .iter()
                .rev()
                .find(|(key, _)| key.as_os_str() == OsStr::new(name))
                .map(|(_, value)| value.clone())
        };
        let mut env: Vec<(OsString, OsString)> = Vec::new();
        let mut set = |name: &str, value: OsString| {
            env.retain(|(key, _)| key.as_os_str() != OsStr::new(name));
            env.push((OsString::from(name), value));
        };
        let path = lookup("PATH")
            .map(|path| self.runnable_path(&path, workspace, temp))
            .filter(|path| !path.is_empty())
            .unwrap_or_else(|| OsString::from(DEFAULT_PATH));
        set("PATH", path);
        for name in PASSED_ENV.iter().filter(|name| **name != "PATH") {
            if let Some(value) = lookup(name) {
                set(name, value);
            }
        }
        let home = match self.level {
            Sandbox::ReadOnly => temp,
            _ => workspace,
        };
        set("HOME", home.as_os_str().to_owned());
        set("TMPDIR", temp.as_os_str().to_owned());
        for name in &self.pass_env {
            if let Some(value) = lookup(name) {
                set(name, value);
            }
        }
        env
    }

    /// `path` (a `PATH` value) without the directories the program may not
    /// run programs from: a lookup there would fail, and an interpreter
    /// that finds itself by `PATH` (Python does) would look for its library
    /// there and stop.
    fn runnable_path(&self, path: &OsStr, workspace: &Path, temp: &Path) -> OsString {
        let allowed = |dir: &Path| {
            dir.is_absolute()
                && (SYSTEM_PATHS.iter().any(|root| dir.starts_with(root))
                    || self.read_paths.iter().any(|root| dir.starts_with(root))
                    || dir.starts_with(workspace)
                    || dir.starts_with(temp))
        };
        let kept: Vec<PathBuf> = std::env::split_paths(path)
            .filter(|dir| allowed(dir))
            .collect();
        std::env::join_paths(kept).unwrap_or_default()
    }

    /// Prepares one run in `workspace` (a canonical directory) with
    /// subloop's own environment: see [`SandboxPolicy::confine_with_env`].
    pub fn confine(&self, workspace: &Path) -> Result<Confinement, SandboxError> {
        self.confine_with_env(workspace, std::env::vars_os())
    }

    /// Prepares one run in `workspace`, with `parent` as the environment
    /// the program's is chosen from: checks that this kernel can enforce
    /// the level, makes the private temporary directory, builds the
    /// Landlock ruleset and the seccomp filter. [`Sandbox::Off`] prepares
    /// nothing (the command keeps its environment, and `parent` is unused).
    pub fn confine_with_env(
        &self,
        workspace: &Path,
        parent: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Confinement, SandboxError> {
        if !self.level.confines() {
            return Ok(Confinement {
                level: self.level,
                temp: None,
                env: None,
                rules: None,
                absent: Vec::new(),
                _cleanup: None,
            });
        }
        if let Some(missing) = Support::probe().missing(self.level) {
            return Err(SandboxError::Kernel {
                level: self.level,
                missing,
            });
        }
        let private = PrivateTemp::create(&std::env::temp_dir())?;
        let temp = private.tmp_dir();
        let protected = if self.level == Sandbox::WorkspaceWrite {
            self.protected_paths(workspace)
        } else {
            Vec::new()
        };
        let absent: Vec<PathBuf> = protected
            .iter()
            .filter(|path| path.symlink_metadata().is_err())
            .cloned()
            .collect();
        let env = self.environment(parent, workspace, &temp);
        let rules = enforce::prepare(self, workspace, &temp, &private.staging_dir(), protected)?;
        Ok(Confinement {
            level: self.level,
            temp: Some(Arc::new(private)),
            env: Some(env),
            rules: Some(rules),
            absent,
            _cleanup: None,
        })
    }
}

/// One run's sandbox, ready to be applied to the command that starts the
/// program. Dropping it removes the private temporary directory (after the
/// program is done: keep it until then).
#[derive(Debug)]
pub struct Confinement {
    level: Sandbox,
    temp: Option<Arc<PrivateTemp>>,
    env: Option<Vec<(OsString, OsString)>>,
    rules: Option<Arc<enforce::Rules>>,
    /// Protected paths that did not exist when the run was prepared.
    absent: Vec<PathBuf>,
    _cleanup: Option<Registration>,
}

impl Confinement {
    /// The level in force.
    pub fn level(&self) -> Sandbox {
        self.level
    }

    /// The program's private temporary directory (its `TMPDIR`), if confined.
    pub fn temp_dir(&self) -> Option<PathBuf> {
        self.temp.as_deref().map(PrivateTemp::tmp_dir)
    }

    /// The directory that holds everything of the run that is not the
    /// workspace's (the `TMPDIR` among it), removed when this value is
    /// dropped: what a watchdog removes when subloop is killed outright.
    pub fn private_dir(&self) -> Option<&Path> {
        self.temp.as_deref().map(PrivateTemp::path)
    }

    /// Removes each protected path ([`SandboxPolicy::PROTECTED_PATHS`],
    /// [`SandboxPolicy::protect`]) that did not exist when the run was
    /// prepared and exists now, the program having made it; call once the
    /// program's group is gone. Returns the paths removed (symbolic links
    /// are removed, not followed).
    pub fn remove_planted(&self) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        for path in &self.absent {
            let Ok(metadata) = path.symlink_metadata() else {
                continue;
            };
            let gone = if metadata.is_dir() {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_file(path)
            };
            if gone.is_ok() {
                removed.push(path.clone());
            }
        }
        removed
    }

    /// The environment the program gets, if confined (else it inherits the command's).
    pub fn env(&self) -> Option<&[(OsString, OsString)]> {
        self.env.as_deref()
    }

    /// Also removes the private temporary directory when the host's
    /// `shutdown` runs (its process is ended by a signal while the program runs).
    pub fn remove_on(mut self, shutdown: &Arc<Shutdown>) -> Self {
        if let Some(temp) = &self.temp {
            let temp = Arc::clone(temp);
            self._cleanup = Some(shutdown.on_termination(move |_| temp.remove()));
        }
        self
    }

    /// Applies the sandbox to `command`: its environment is replaced, and
    /// the forked child enters the sandbox just before `exec`. For
    /// [`Sandbox::Off`] the command is left as it is. The command must be
    /// spawned while this value is alive.
    pub fn apply(&self, command: &mut Command) {
        if let Some(env) = &self.env {
            command.env_clear();
            command.envs(env.iter().map(|(key, value)| (key, value)));
        }
        match &self.rules {
            Some(rules) => enforce::install(command, Arc::clone(rules)),
            None => enforce::close_inherited(command),
        }
    }
}

/// Why a program cannot be started in its sandbox.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// This kernel (or operating system) cannot enforce the level.
    #[error("the {level} sandbox cannot be enforced here: {missing}")]
    Kernel {
        /// The level asked for.
        level: Sandbox,
        /// What is missing.
        missing: String,
    },
    /// The private temporary directory could not be made.
    #[error("cannot create a private temporary directory in {dir}: {source}")]
    Temp {
        /// Where it was to be.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The sandbox's rules could not be built.
    #[error("cannot build the sandbox's rules: {0}")]
    Rules(String),
}

/// What this machine can enforce: a report for `subloop doctor`, and the
/// check [`SandboxPolicy::confine`] makes before each run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Support {
    /// The Landlock ABI version the kernel offers (`None`: no Landlock, or
    /// not on Linux).
    pub landlock_abi: Option<u32>,
    /// Whether seccomp filters can be installed.
    pub seccomp: bool,
    /// Whether subloop knows this processor's system calls (x86_64,
    /// aarch64, riscv64).
    pub known_arch: bool,
    /// How the program gets its namespaces here (subloop as root: made
    /// directly, the program as an unprivileged user; otherwise inside a
    /// user namespace), or why it cannot.
    pub namespaces: Result<&'static str, String>,
}

/// The Landlock ABI the sandbox needs: filesystem rules with truncation
/// (ABI 3, Linux 6.2), TCP rules (ABI 4, Linux 6.7), signal and
/// abstract-socket scoping (ABI 6, Linux 6.12).
pub(crate) const NEEDED_LANDLOCK_ABI: u32 = 6;

impl Support {
    /// The Landlock ABI the sandbox needs: filesystem rules with truncation
    /// (ABI 3, Linux 6.2), TCP rules (ABI 4, Linux 6.7), signal and
    /// abstract-socket scoping (ABI 6, Linux 6.12).
    pub const NEEDED_LANDLOCK_ABI: u32 = NEEDED_LANDLOCK_ABI;

    /// Asks the kernel (a few system calls, no file is opened).
    pub fn probe() -> Self {
        enforce::probe()
    }

    /// What `level` needs that this machine lacks, said for a person
    /// (`None`: it can be enforced).
    pub fn missing(&self, level: Sandbox) -> Option<String> {
        if !level.confines() {
            return None;
        }
        if !cfg!(target_os = "linux") {
            return Some(
                "the sandbox needs Linux (Landlock and seccomp); this system has neither".into(),
            );
        }
        if !self.known_arch {
            return Some(format!(
                "the sandbox's system-call filter knows x86_64, aarch64 and riscv64, not {}",
                std::env::consts::ARCH
            ));
        }
        let needed = match self.landlock_abi {
            None => {
                return Some(
                    "this kernel has no Landlock (Linux 6.12 or later with Landlock enabled: \
                     CONFIG_SECURITY_LANDLOCK and `landlock` in the `lsm=` list)"
                        .into(),
                );
            }
            Some(abi) if abi < 3 => format!(
                "Landlock ABI {abi} cannot deny truncating files outside the workspace (ABI 3, Linux 6.2)"
            ),
            Some(abi) if abi < 4 => {
                format!("Landlock ABI {abi} cannot deny TCP connections (ABI 4, Linux 6.7)")
            }
            Some(abi) if abi < NEEDED_LANDLOCK_ABI => format!(
                "Landlock ABI {abi} cannot keep signals and abstract sockets inside the sandbox (ABI 6, Linux 6.12)"
            ),
            Some(_) => String::new(),
        };
        if !needed.is_empty() {
            return Some(needed);
        }
        if !self.seccomp {
            return Some(
                "this kernel cannot install seccomp filters (CONFIG_SECCOMP_FILTER)".into(),
            );
        }
        if let Err(missing) = &self.namespaces {
            return Some(missing.clone());
        }
        None
    }

    /// Whether `level` can be enforced here.
    pub fn enforces(&self, level: Sandbox) -> bool {
        self.missing(level).is_none()
    }
}

#[cfg(target_os = "linux")]
use linux as enforce;

/// Elsewhere than Linux: nothing can be enforced, and nothing is built.
#[cfg(not(target_os = "linux"))]
mod enforce {
    use super::{Sandbox, SandboxError, SandboxPolicy, Support};
    use std::path::Path;

    #[derive(Debug)]
    pub(super) struct Rules;

    pub(super) fn probe() -> Support {
        Support {
            landlock_abi: None,
            seccomp: false,
            known_arch: false,
            namespaces: Err("the sandbox needs Linux namespaces".into()),
        }
    }

    pub(super) fn prepare(
        policy: &SandboxPolicy,
        _workspace: &Path,
        _temp: &Path,
        _staging: &Path,
        _protected: Vec<std::path::PathBuf>,
    ) -> Result<std::sync::Arc<Rules>, SandboxError> {
        Err(SandboxError::Kernel {
            level: policy.level(),
            missing: probe().missing(Sandbox::WorkspaceWrite).unwrap_or_default(),
        })
    }

    pub(super) fn install(_command: &mut std::process::Command, _rules: std::sync::Arc<Rules>) {}

    pub(super) fn close_inherited(_command: &mut std::process::Command) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn support(abi: Option<u32>) -> Support {
        Support {
            landlock_abi: abi,
            seccomp: true,
            known_arch: true,
            namespaces: Ok("namespaces"),
        }
    }

    #[test]
    fn a_kernel_short_of_abi_6_says_what_is_missing() {
        for level in [Sandbox::WorkspaceWrite, Sandbox::ReadOnly] {
            let none = support(None).missing(level).unwrap_or_default();
            let said = if cfg!(target_os = "linux") {
                "no Landlock"
            } else {
                "needs Linux"
            };
            assert!(none.contains(said), "{none}");
            if cfg!(target_os = "linux") {
                for (abi, said) in [
                    (2, "truncating files"),
                    (3, "TCP connections (ABI 4"),
                    (5, "signals and abstract sockets inside the sandbox (ABI 6"),
                ] {
                    let missing = support(Some(abi)).missing(level).unwrap_or_default();
                    assert!(missing.contains(said), "{abi}: {missing}");
                }
                assert_eq!(support(Some(6)).missing(level), None);
                assert_eq!(support(Some(9)).missing(level), None);
                let no_seccomp = Support {
                    seccomp: false,
                    ..support(Some(7))
                };
                assert!(no_seccomp.missing(level).is_some());
                let no_namespaces = Support {
                    namespaces: Err("cannot make a user namespace".into()),
                    ..support(Some(7))
                };
                assert_eq!(
                    no_namespaces.missing(level).as_deref(),
                    Some("cannot make a user namespace")
                );
            }
        }
        // Off needs nothing, anywhere.
        assert_eq!(support(None).missing(Sandbox::Off), None);
        let err = SandboxError::Kernel {
            level: Sandbox::WorkspaceWrite,
            missing: "this kernel has no Landlock".into(),
        };
        assert_eq!(
            err.to_string(),
            "the workspace-write sandbox cannot be enforced here: this kernel has no Landlock"
        );
    }

    #[test]
    fn levels_have_names() {
        for level in Sandbox::ALL {
            assert_eq!(Sandbox::parse(level.name()), Some(level));
            assert_eq!(
                serde_json::to_value(level).ok(),
                Some(serde_json::Value::from(level.name()))
            );
        }
        assert_eq!(Sandbox::parse("none"), None);
        assert_eq!(Sandbox::default(), Sandbox::WorkspaceWrite);
    }

    #[test]
    fn the_environment_is_the_short_list_and_the_names_passed() {
        let parent = [
            (
                "PATH",
                "/home/me/.cargo/bin:/usr/local/bin:relative:/usr/bin:/opt/x/bin",
            ),
            ("LANG", "C.UTF-8"),
            ("HOME", "/home/me"),
            ("ANTHROPIC_API_KEY", "sk-ant-secret"),
            ("HTTPS_PROXY", "http://proxy"),
            ("PYTHONPATH", "/ws/lib"),
        ]
        .map(|(key, value)| (OsString::from(key), OsString::from(value)));
        let workspace = Path::new("/ws");
        let temp = Path::new("/tmp/subloop-run-x");
        let env = |policy: &SandboxPolicy| -> Vec<(String, String)> {
            policy
                .environment(parent.clone(), workspace, temp)
                .into_iter()
                .map(|(key, value)| {
                    (
                        key.to_string_lossy().into_owned(),
                        value.to_string_lossy().into_owned(),
                    )
                })
                .collect()
        };
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        };
        assert_eq!(
            env(&SandboxPolicy::default()),
            pairs(&[
                ("PATH", "/usr/local/bin:/usr/bin:/opt/x/bin"),
                ("LANG", "C.UTF-8"),
                ("HOME", "/ws"),
                ("TMPDIR", "/tmp/subloop-run-x"),
            ])
        );
        let read_only = env(&SandboxPolicy::new(Sandbox::ReadOnly).pass_env("PYTHONPATH"));
        assert!(read_only.contains(&("HOME".into(), "/tmp/subloop-run-x".into())));
        assert!(read_only.contains(&("PYTHONPATH".into(), "/ws/lib".into())));
        assert!(!read_only.iter().any(|(key, _)| key == "ANTHROPIC_API_KEY"));
        // A PATH of nothing the program may run is the default one.
        let none = SandboxPolicy::default().environment(
            [(OsString::from("PATH"), OsString::from("/home/me/bin"))],
            workspace,
            temp,
        );
        assert_eq!(
            none.first(),
            Some(&(OsString::from("PATH"), OsString::from(DEFAULT_PATH)))
        );
    }

    #[test]
    fn a_protected_link_is_kept_as_named_and_where_it_leads() {
        let dir = std::env::temp_dir().join(format!("subloop-protect-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("hooks")).unwrap();
        let dir = std::fs::canonicalize(&dir).unwrap();
        std::fs::write(dir.join("hooks/real.sh"), "").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("real.sh", dir.join("hooks/guard.sh")).unwrap();
        let paths = SandboxPolicy::default()
            .protect("./hooks/guard.sh")
            .protect("../outside")
            .protected_paths(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(paths.contains(&dir.join("hooks/guard.sh")), "{paths:?}");
        #[cfg(unix)]
        assert!(paths.contains(&dir.join("hooks/real.sh")), "{paths:?}");
        assert!(paths.contains(&dir.join(".git/config")));
        assert!(
            !paths.iter().any(|path| !path.starts_with(&dir)),
            "{paths:?}"
        );
    }

    #[test]
    fn off_prepares_nothing() {
        let confinement = SandboxPolicy::new(Sandbox::Off)
            .confine_with_env(Path::new("/nonexistent"), [])
            .ok();
        let confinement = confinement.as_ref();
        assert_eq!(confinement.map(Confinement::level), Some(Sandbox::Off));
        assert_eq!(confinement.and_then(Confinement::temp_dir), None);
        assert!(confinement.and_then(Confinement::env).is_none());
    }
}
