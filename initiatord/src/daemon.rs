//! The daemon's state between passes: the config in force and its reload.
//!
//! A reload replaces the config only if the new file is valid as a whole;
//! otherwise the old config stays in force (never a half-applied state) and
//! the error, naming the line, is returned for the log.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::{self, Config, ConfigError};
use crate::reconcile::{reconcile, Memory, Options, Pass};
use crate::sysfs::Sysfs;

/// The running daemon, minus its signals and sleep.
#[derive(Debug)]
pub struct Daemon {
    config_path: PathBuf,
    /// The config in force.
    pub config: Config,
    /// Failure times, path-down clocks, logged notices.
    pub memory: Memory,
    /// Command-line policy.
    pub options: Options,
}

/// What a reload changed, for the log.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ReloadSummary {
    /// Volumes new in the config.
    pub added: Vec<String>,
    /// Volumes gone from the config.
    pub removed: Vec<String>,
    /// Volumes whose settings changed.
    pub changed: Vec<String>,
}

impl Daemon {
    /// Loads the config at `config_path`.
    ///
    /// # Errors
    ///
    /// The config cannot be read or is invalid.
    pub fn load(config_path: &Path, options: Options) -> Result<Self, ConfigError> {
        Ok(Self {
            config: config::load(config_path)?,
            config_path: config_path.to_owned(),
            memory: Memory::default(),
            options,
        })
    }

    /// Re-reads the config file; on error the old config stays in force.
    ///
    /// # Errors
    ///
    /// The new file cannot be read or is invalid.
    pub fn reload(&mut self) -> Result<ReloadSummary, ConfigError> {
        let new = config::load(&self.config_path)?;
        let mut summary = ReloadSummary::default();
        for volume in &new.volumes {
            match self.config.volume(&volume.name) {
                None => summary.added.push(volume.name.clone()),
                Some(old) => {
                    if !old.same_settings(volume) {
                        summary.changed.push(volume.name.clone());
                    }
                }
            }
        }
        for volume in &self.config.volumes {
            if new.volume(&volume.name).is_none() {
                summary.removed.push(volume.name.clone());
            }
        }
        self.config = new;
        Ok(summary)
    }

    /// One reconciliation pass at `now`; new notices go to `log` too.
    ///
    /// # Errors
    ///
    /// Observing sysfs failed.
    pub fn tick(
        &mut self,
        sysfs: &mut dyn Sysfs,
        now: Instant,
        log: &mut dyn FnMut(&str),
    ) -> io::Result<Pass> {
        let pass = reconcile(
            sysfs,
            &self.config,
            &mut self.memory,
            now,
            self.options,
            log,
        )?;
        for notice in self.memory.new_notices(&pass.notices) {
            log(&notice);
        }
        Ok(pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeKernel;

    #[test]
    fn test_bad_reload_keeps_the_old_config() {
        let dir =
            std::env::temp_dir().join(format!("brick-initiatord-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("initiator.toml");
        let one = "[[volumes]]\nname = \"db\"\nsession = \"s\"\ndevice_path = \"vol0\"\npaths = [\"10.0.0.1\"]\n";
        std::fs::write(&path, one).unwrap();
        let mut daemon = Daemon::load(&path, Options::default()).unwrap();
        let mut kernel = FakeKernel::new();
        kernel.export("vol0");
        kernel.export("vol1");
        let mut lines = Vec::new();
        daemon
            .tick(&mut kernel, Instant::now(), &mut |l| {
                lines.push(l.to_owned())
            })
            .unwrap();
        assert_eq!(kernel.link("db"), Some("../rnbd0"));

        // A second volume plus a duplicate name: refused as a whole.
        let bad = format!("{one}\n[[volumes]]\nname = \"logs\"\nsession = \"s\"\ndevice_path = \"vol1\"\npaths = [\"10.0.0.1\"]\n\n[[volumes]]\nname = \"db\"\nsession = \"s\"\ndevice_path = \"vol2\"\npaths = [\"10.0.0.1\"]\n");
        std::fs::write(&path, &bad).unwrap();
        let e = daemon.reload().unwrap_err();
        assert!(
            e.to_string()
                .contains(":14: volumes[2].name: expected a unique name"),
            "{e}"
        );
        assert_eq!(daemon.config.volumes.len(), 1);
        kernel.writes.clear();
        daemon
            .tick(&mut kernel, Instant::now(), &mut |_| {})
            .unwrap();
        assert!(kernel.writes.is_empty(), "{:?}", kernel.writes);

        // Fixed: applied.
        let good = bad.replace(
            "name = \"db\"\nsession = \"s\"\ndevice_path = \"vol2\"",
            "name = \"tmp\"\nsession = \"s\"\ndevice_path = \"vol2\"",
        );
        std::fs::write(&path, good).unwrap();
        let summary = daemon.reload().unwrap();
        assert_eq!(summary.added, ["logs", "tmp"]);
        assert!(summary.removed.is_empty() && summary.changed.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
