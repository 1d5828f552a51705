//! A confined program's private temporary directory.

use std::ffi::CString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::SandboxError;

/// A fresh directory, readable by its owner only (mode 0700, a name no
/// other process chose), removed with everything in it on drop.
#[derive(Debug)]
pub struct PrivateTemp {
    path: PathBuf,
}

impl PrivateTemp {
    /// Makes `subloop-run-XXXXXX` in `parent` (`mkdtemp(3)`: a random
    /// name, created exclusively, mode 0700).
    pub fn create(parent: &Path) -> Result<Self, SandboxError> {
        let failed = |source| SandboxError::Temp {
            dir: parent.to_path_buf(),
            source,
        };
        let mut template = parent
            .join("subloop-run-XXXXXX")
            .into_os_string()
            .into_vec();
        template.push(0);
        let template = CString::from_vec_with_nul(template).map_err(|_| {
            failed(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the temporary directory's path holds a NUL byte",
            ))
        })?;
        let mut bytes = template.into_bytes_with_nul();
        // SAFETY: mkdtemp(3) rewrites the trailing XXXXXX of a NUL-terminated
        // buffer we own in place.
        let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(failed(std::io::Error::last_os_error()));
        }
        bytes.pop();
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(&bytes));
        let made = Self { path };
        for dir in [made.tmp_dir(), made.staging_dir()] {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(failed)?;
        }
        Ok(made)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `tmp` in it: the program's `TMPDIR`.
    pub fn tmp_dir(&self) -> PathBuf {
        self.path.join("tmp")
    }

    /// `root` in it: where the sandbox's root file system is built (it
    /// stays empty outside the sandbox).
    pub fn staging_dir(&self) -> PathBuf {
        self.path.join("root")
    }

    /// Removes the directory and everything in it, at any depth,
    /// directories the program made unreadable or unwritable included,
    /// following no symbolic link; a second call finds nothing to do.
    pub fn remove(&self) {
        crate::run::process::remove_dir_tree(&self.path);
    }
}

impl Drop for PrivateTemp {
    fn drop(&mut self) {
        self.remove();
    }
}
