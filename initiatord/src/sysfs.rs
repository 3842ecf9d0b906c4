//! The daemon's window on the kernel: sysfs, `/proc/mounts` and `/dev/brick`.
//!
//! Everything the reconciler reads or writes goes through [`Sysfs`], so the
//! logic is tested against the tests' fake kernel (module `fake`) and runs
//! against [`HostSysfs`] (the real file system under a root, `/` in
//! production).
//! Paths are absolute, as on the host (`/sys/block/rnbd0/rnbd/state`).
//!
//! The files and their meaning are in `docs/protocol/rnbd.md` §5 and
//! `docs/protocol/rtrs.md` §8.

use std::io;
use std::path::{Path, PathBuf};

/// The rnbd client's control directory (`/sys/class/rnbd-client/ctl` is a
/// link to it).
pub const RNBD_CTL: &str = "/sys/devices/virtual/rnbd-client/ctl";
/// Block devices.
pub const SYS_BLOCK: &str = "/sys/block";
/// RTRS client sessions.
pub const RTRS_CLIENT: &str = "/sys/class/rtrs-client";
/// The stable names the daemon maintains.
pub const DEV_BRICK: &str = "/dev/brick";
/// Mounted file systems (to refuse unmapping a mounted device).
pub const PROC_MOUNTS: &str = "/proc/mounts";
/// The kernel module that provides [`RNBD_CTL`] (pulls in `rtrs-client`).
pub const RNBD_MODULE: &str = "rnbd-client";

/// File operations on the kernel's interfaces.
///
/// Reads return the file's text (sysfs values end in `\n`; callers trim).
/// A missing file or directory is `io::ErrorKind::NotFound`. A write is one
/// `write(2)` of the whole value, as sysfs stores expect, and its error is
/// the kernel's answer (for example `EBUSY` from `unmap_device`).
pub trait Sysfs {
    /// The text of a file.
    ///
    /// # Errors
    ///
    /// As `read(2)`: `NotFound` when the file does not exist.
    fn read(&self, path: &str) -> io::Result<String>;

    /// Writes `value` to an existing file in one call.
    ///
    /// # Errors
    ///
    /// The kernel's refusal, or `NotFound`.
    fn write(&mut self, path: &str, value: &str) -> io::Result<()>;

    /// The names in a directory, sorted.
    ///
    /// # Errors
    ///
    /// `NotFound` when the directory does not exist.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;

    /// Whether `path` exists (following links).
    fn exists(&self, path: &str) -> bool;

    /// The target of a symbolic link, as stored.
    ///
    /// # Errors
    ///
    /// `NotFound`, or `InvalidInput` if `path` is not a link.
    fn read_link(&self, path: &str) -> io::Result<String>;

    /// Creates (or replaces) the symbolic link `link` -> `target`, creating
    /// the link's directory if needed.
    ///
    /// # Errors
    ///
    /// As `symlink(2)`/`rename(2)`.
    fn symlink(&mut self, target: &str, link: &str) -> io::Result<()>;

    /// Removes a file or link.
    ///
    /// # Errors
    ///
    /// As `unlink(2)`.
    fn remove(&mut self, path: &str) -> io::Result<()>;

    /// Loads a kernel module (`modprobe NAME`).
    ///
    /// # Errors
    ///
    /// `modprobe` could not run or failed.
    fn load_module(&mut self, name: &str) -> io::Result<()>;
}

/// The real file system, with every absolute path taken under `root`
/// (`/` in production; a scratch directory in tests of this type).
#[derive(Clone, Debug)]
pub struct HostSysfs {
    root: PathBuf,
}

impl HostSysfs {
    /// The host's own file system.
    pub fn new() -> Self {
        Self::with_root("/")
    }

    /// A file system rooted elsewhere (paths are joined under `root`).
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn resolve(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

impl Default for HostSysfs {
    fn default() -> Self {
        Self::new()
    }
}

impl Sysfs for HostSysfs {
    fn read(&self, path: &str) -> io::Result<String> {
        std::fs::read_to_string(self.resolve(path))
    }

    fn write(&mut self, path: &str, value: &str) -> io::Result<()> {
        use std::io::Write;
        // No create, no truncate: a sysfs attribute exists or the path is wrong.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(self.resolve(path))?;
        let written = file.write(value.as_bytes())?;
        if written != value.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {written} of {} bytes", value.len()),
            ));
        }
        Ok(())
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(self.resolve(dir))? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &str) -> bool {
        self.resolve(path).exists()
    }

    fn read_link(&self, path: &str) -> io::Result<String> {
        Ok(std::fs::read_link(self.resolve(path))?
            .to_string_lossy()
            .into_owned())
    }

    fn symlink(&mut self, target: &str, link: &str) -> io::Result<()> {
        let link = self.resolve(link);
        if let Some(dir) = link.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // Replace atomically: a reader never sees the name missing.
        let file_name = link
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = link.with_file_name(format!(".{file_name}.new"));
        let _ = std::fs::remove_file(&temporary);
        std::os::unix::fs::symlink(Path::new(target), &temporary)?;
        std::fs::rename(&temporary, &link)
    }

    fn remove(&mut self, path: &str) -> io::Result<()> {
        std::fs::remove_file(self.resolve(path))
    }

    fn load_module(&mut self, name: &str) -> io::Result<()> {
        let status = std::process::Command::new("modprobe").arg(name).status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("modprobe {name}: {status}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_host_sysfs_under_root() {
        let root = std::env::temp_dir().join(format!("brick-initiatord-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("sys/block/rnbd0/rnbd")).unwrap();
        std::fs::write(root.join("sys/block/rnbd0/rnbd/state"), "open\n").unwrap();
        let mut sysfs = HostSysfs::with_root(&root);
        assert_eq!(sysfs.list("/sys/block").unwrap(), ["rnbd0"]);
        assert_eq!(sysfs.read("/sys/block/rnbd0/rnbd/state").unwrap(), "open\n");
        sysfs.write("/sys/block/rnbd0/rnbd/state", "x").unwrap();
        // No create: a wrong attribute name is an error, not a new file.
        let missing = sysfs.write("/sys/block/rnbd0/rnbd/nope", "1").unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        sysfs.symlink("../rnbd0", "/dev/brick/db").unwrap();
        sysfs.symlink("../rnbd1", "/dev/brick/db").unwrap();
        assert_eq!(sysfs.read_link("/dev/brick/db").unwrap(), "../rnbd1");
        assert_eq!(sysfs.list("/dev/brick").unwrap(), ["db"]);
        sysfs.remove("/dev/brick/db").unwrap();
        assert!(!sysfs.exists("/dev/brick/db"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
