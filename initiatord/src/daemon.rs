//! The daemon's state between passes: the config in force, its reload,
//! and the volumes mapped at run time.
//!
//! The config in force is the config file's volumes plus the volumes added
//! with `brick map` (run-time volumes). Run-time volumes are kept in a state
//! file ([`DEFAULT_STATE`], one `[[volumes]]` entry each, as the config file
//! writes them) so a restarted daemon keeps them; it lives under `/run`, as
//! the kernel's mappings do not outlive a reboot either. A volume meant to
//! survive reboots belongs in the config file.
//!
//! A reload or a request replaces the config in force only if the result is
//! valid as a whole; otherwise the old config stays in force (never a
//! half-applied state) and the error, naming the line, is returned. A
//! config-file volume wins over a run-time volume of the same name (the
//! run-time one is dropped, and logged).
//!
//! Requests on the control socket ([`Daemon::answer`]; the wire format
//! and its framing are the `control` crate's):
//!
//! | [`Request`] | [`Reply`] |
//! |---|---|
//! | `Status` (json / text) | the last pass's [`Status`] / its table |
//! | `List` (json / text) | volumes with origin, device and state ([`ListEntry`]) / a table |
//! | `Map { volume }` | maps one volume now, kept as a run-time volume |
//! | `Unmap { name, force }` | unmaps a run-time volume now |
//!
//! A refusal is [`Reply::Error`], its message saying what was expected and
//! what was found. The volume of a `Map` is checked exactly as the state
//! file is when the daemon starts: it is written as a `[[volumes]]` entry
//! and read back with the config file's parser ([`config::parse`]), then
//! against the volumes in force ([`config::conflict`]); errors name the
//! field (`map request: volume.paths[0]: expected an address …`).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use control::{Format, Reply, Request, VolumeSpec};
use serde::Serialize;

use crate::config::{self, Config, ConfigError, Volume};
use crate::observe::observe;
use crate::reconcile::{apply, reconcile, Action, Memory, Options, Pass};
use crate::status::{self, Status, ORIGIN_CONFIG, ORIGIN_RUNTIME};
use crate::sysfs::Sysfs;

/// One entry of the `list` reply.
pub use control::ListEntry;

/// Where run-time volumes are kept unless `--state` says otherwise.
pub const DEFAULT_STATE: &str = "/run/brick/initiatord-volumes.toml";

/// The running daemon, minus its signals and sleep.
#[derive(Debug)]
pub struct Daemon {
    config_path: PathBuf,
    /// The config file as last loaded.
    file: Config,
    /// Volumes added with `brick map`, each with its `[[volumes]]` TOML.
    runtime: Vec<RuntimeVolume>,
    /// Where `runtime` is kept; `None`: not kept (tests, `--once`).
    state_path: Option<PathBuf>,
    /// The config in force: the file's volumes, then the run-time ones.
    pub config: Config,
    /// Failure times, path-down clocks, logged notices.
    pub memory: Memory,
    /// Command-line policy.
    pub options: Options,
    /// The last pass's report (origins filled in).
    pub status: Status,
}

/// A volume added at run time.
#[derive(Clone, PartialEq, Eq, Debug)]
struct RuntimeVolume {
    volume: Volume,
    /// Its `[[volumes]]` entry, as kept in the state file.
    toml: String,
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
    /// Run-time volumes dropped because the config file now names them.
    pub superseded: Vec<String>,
}

impl Daemon {
    /// Loads the config at `config_path` (no run-time volumes yet; see
    /// [`Daemon::with_state`]).
    ///
    /// # Errors
    ///
    /// The config cannot be read or is invalid.
    pub fn load(config_path: &Path, options: Options) -> Result<Self, ConfigError> {
        let file = config::load(config_path)?;
        Ok(Self {
            config: file.clone(),
            status: status::report(&file, &Default::default(), &[]),
            file,
            runtime: Vec::new(),
            state_path: None,
            config_path: config_path.to_owned(),
            memory: Memory::default(),
            options,
        })
    }

    /// Keeps run-time volumes in `path`, loading those already there (a
    /// missing file is an empty one). Returns the names dropped because the
    /// config file names them now.
    ///
    /// # Errors
    ///
    /// The state file cannot be read, is invalid, or conflicts with the
    /// config file (a session with other paths): the daemon must not start
    /// and unmap what the file stands for.
    pub fn with_state(&mut self, path: &Path) -> Result<Vec<String>, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(ConfigError::at(
                    &path.display().to_string(),
                    "",
                    None,
                    "",
                    format!("cannot read: {e}"),
                ))
            }
        };
        let runtime = parse_state(&text, &path.display().to_string())?;
        let (config, superseded) = merge(&self.file, &runtime).map_err(|message| {
            ConfigError::at(&path.display().to_string(), "", None, "", message)
        })?;
        self.runtime = runtime
            .into_iter()
            .filter(|r| !superseded.contains(&r.volume.name))
            .collect();
        self.config = config;
        self.state_path = Some(path.to_owned());
        if !superseded.is_empty() {
            self.save_state().map_err(|e| {
                ConfigError::at(&path.display().to_string(), "", None, "", e.to_string())
            })?;
        }
        Ok(superseded)
    }

    /// Re-reads the config file; on error the old config stays in force.
    ///
    /// # Errors
    ///
    /// The new file cannot be read or is invalid, or conflicts with a
    /// run-time volume.
    pub fn reload(&mut self) -> Result<ReloadSummary, ConfigError> {
        let file = config::load(&self.config_path)?;
        let (new, superseded) = merge(&file, &self.runtime).map_err(|message| {
            ConfigError::at(
                &self.config_path.display().to_string(),
                "",
                None,
                "",
                message,
            )
        })?;
        let mut summary = ReloadSummary {
            superseded,
            ..ReloadSummary::default()
        };
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
        self.file = file;
        self.config = new;
        if !summary.superseded.is_empty() {
            self.runtime
                .retain(|r| !summary.superseded.contains(&r.volume.name));
            // The config in force no longer needs them; a failed save only
            // means a restarted daemon drops them again.
            let _ = self.save_state();
        }
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
        self.status = status::report(&self.config, &pass.observed, &pass.notices);
        for volume in &mut self.status.volumes {
            if self.runtime.iter().any(|r| r.volume.name == volume.name) {
                volume.origin = ORIGIN_RUNTIME.to_owned();
            }
        }
        Ok(pass)
    }

    /// The reply to one control-socket request (see the module docs).
    /// `map` and `unmap` act at once, through `sysfs`, and log like a pass.
    pub fn answer(
        &mut self,
        request: Request,
        sysfs: &mut dyn Sysfs,
        now: Instant,
        log: &mut dyn FnMut(&str),
    ) -> Reply {
        let result = match request {
            Request::Status {
                format: Format::Json,
            } => Ok(Reply::Status {
                status: self.status.clone(),
            }),
            Request::Status {
                format: Format::Text,
            } => Ok(Reply::Text {
                text: status::table(&self.status).trim_end().to_owned(),
            }),
            Request::List {
                format: Format::Json,
            } => Ok(Reply::List {
                volumes: self.list(),
            }),
            Request::List {
                format: Format::Text,
            } => Ok(Reply::Text {
                text: list_text(&self.list()),
            }),
            Request::Map { volume } => self
                .map(&volume, sysfs, now, log)
                .map(|volume| Reply::Mapped { volume }),
            Request::Unmap { name, force } => self
                .unmap(&name, force, sysfs, now, log)
                .map(|device| Reply::Unmapped { name, device }),
        };
        result.unwrap_or_else(Reply::error)
    }

    /// Every volume in force, with its origin and last observed state.
    pub fn list(&self) -> Vec<ListEntry> {
        self.config
            .volumes
            .iter()
            .map(|volume| {
                let seen = self.status.volumes.iter().find(|v| v.name == volume.name);
                ListEntry {
                    name: volume.name.clone(),
                    origin: if self.is_runtime(&volume.name) {
                        ORIGIN_RUNTIME
                    } else {
                        ORIGIN_CONFIG
                    }
                    .to_owned(),
                    session: volume.session.clone(),
                    device_path: volume.device_path.clone(),
                    access_mode: volume.access_mode.to_string(),
                    device: seen.and_then(|v| v.device.clone()),
                    state: match seen {
                        Some(v) => v.state.clone(),
                        None if volume.is_userspace() => "nbd export".to_owned(),
                        None => "not mapped".to_owned(),
                    },
                }
            })
            .collect()
    }

    fn is_runtime(&self, name: &str) -> bool {
        self.runtime.iter().any(|r| r.volume.name == name)
    }

    /// `map`: adds one run-time volume and maps it now; returns it as
    /// `list` shows it. A map the kernel refuses is undone (the volume is
    /// not kept); a map that has to wait (its session has no connected
    /// path) is kept and retried.
    fn map(
        &mut self,
        spec: &VolumeSpec,
        sysfs: &mut dyn Sysfs,
        now: Instant,
        log: &mut dyn FnMut(&str),
    ) -> Result<ListEntry, String> {
        let entry = runtime_volume(spec)?;
        let name = entry.volume.name.clone();
        if let Some(existing) = self.config.volume(&name) {
            return Err(if self.is_runtime(&name) {
                format!("volume {name:?} is already mapped at run time")
            } else {
                format!(
                    "volume {name:?} is in the config file {} (line {})",
                    self.config_path.display(),
                    existing.line
                )
            });
        }
        let mut runtime = self.runtime.clone();
        runtime.push(entry);
        let (config, _) = merge(&self.file, &runtime)?;
        let previous = (
            std::mem::replace(&mut self.runtime, runtime),
            std::mem::replace(&mut self.config, config),
        );
        if let Err(e) = self.save_state() {
            (self.runtime, self.config) = previous;
            return Err(format!("map {name}: cannot keep the volume: {e}"));
        }
        log(&format!("map request: volume {name:?} added at run time"));
        let pass = self
            .tick(sysfs, now, log)
            .map_err(|e| format!("map {name}: cannot read sysfs: {e}"))?;
        let refused = pass
            .applied
            .iter()
            .find_map(|(step, result)| match (&step.action, result) {
                (Action::Map { volume, .. }, Err(e)) if *volume == name => Some(e.to_string()),
                _ => None,
            });
        if let Some(error) = refused {
            self.runtime.retain(|r| r.volume.name != name);
            let (config, _) = merge(&self.file, &self.runtime)?;
            self.config = config;
            let _ = self.save_state();
            log(&format!(
                "map request: volume {name:?} dropped: the kernel refused the map: {error}"
            ));
            return Err(format!("map {name}: the kernel refused: {error}"));
        }
        self.list()
            .into_iter()
            .find(|e| e.name == name)
            .ok_or_else(|| {
                format!("map {name}: expected the volume in force after the map, found it gone")
            })
    }

    /// `unmap`: unmaps a run-time volume now and forgets it; returns the
    /// device it was mapped as, if it was. An open or mounted device is
    /// kept unless `force`.
    fn unmap(
        &mut self,
        name: &str,
        force: bool,
        sysfs: &mut dyn Sysfs,
        now: Instant,
        log: &mut dyn FnMut(&str),
    ) -> Result<Option<String>, String> {
        let Some(volume) = self.config.volume(name).cloned() else {
            return Err(format!("no volume {name:?}"));
        };
        if !self.is_runtime(name) {
            return Err(format!(
                "volume {name:?} is in the config file {} (line {}): remove it there and reload (SIGHUP)",
                self.config_path.display(),
                volume.line
            ));
        }
        let observed =
            observe(sysfs).map_err(|e| format!("unmap {name}: cannot read sysfs: {e}"))?;
        let device = observed
            .device_for(&volume.session, &volume.device_path)
            .cloned();
        if let Some(device) = &device {
            if let (Some(use_), false) = (device.in_use(), force) {
                return Err(format!(
                    "{} ({name}) is {use_}; unmount it or use --force",
                    device.name
                ));
            }
            let action = Action::Unmap {
                device: device.name.clone(),
                force,
            };
            log(&format!("{action}: unmap request for volume {name:?}"));
            apply(sysfs, &action).map_err(|e| format!("{action} failed: {e}"))?;
        }
        if observed.links.contains_key(name) {
            let action = Action::Unlink {
                name: name.to_owned(),
            };
            log(&format!("{action}: unmap request for volume {name:?}"));
            if let Err(e) = apply(sysfs, &action) {
                // The device is gone; the next pass removes a stale link.
                log(&format!("{action} failed: {e}"));
            }
        }
        self.runtime.retain(|r| r.volume.name != name);
        let (config, _) = merge(&self.file, &self.runtime)?;
        self.config = config;
        let kept = self.save_state();
        let _ = self.tick(sysfs, now, log);
        kept.map_err(|e| {
            format!("unmapped {name}, but the state file was not updated ({e}): a restarted daemon would map it again")
        })?;
        Ok(device.map(|d| d.name))
    }

    /// Writes the run-time volumes to the state file (atomically).
    fn save_state(&self) -> io::Result<()> {
        let Some(path) = &self.state_path else {
            return Ok(());
        };
        let mut text = String::from(
            "# Volumes mapped at run time with `brick map`; written by brick-initiatord.\n",
        );
        for entry in &self.runtime {
            text.push('\n');
            text.push_str(&entry.toml);
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let temporary = path.with_extension("toml.new");
        std::fs::write(&temporary, text)?;
        std::fs::rename(&temporary, path)
    }
}

/// The volume of a `map` request, checked as the state file is: written
/// as its `[[volumes]]` entry (what the state file keeps) and read back
/// with the config file's parser. Errors name the request's field.
fn runtime_volume(spec: &VolumeSpec) -> Result<RuntimeVolume, String> {
    /// A one-entry state file.
    #[derive(Serialize)]
    struct Entry<'v> {
        volumes: [&'v VolumeSpec; 1],
    }
    let origin = "map request";
    let text = toml::to_string(&Entry { volumes: [spec] }).map_err(|e| {
        format!(
            "{origin}: expected a volume that can be written as a [[volumes]] entry, found {:?}: {e}",
            spec.name
        )
    })?;
    let entries = parse_state(&text, origin).map_err(|e| {
        // `volumes[0].paths[1]` of the entry is `volume.paths[1]` of the request.
        let field = match e.path.strip_prefix("volumes[0]") {
            Some(rest) => format!("volume{rest}"),
            None => e.path.clone(),
        };
        if field.is_empty() {
            format!("{origin}: {}", e.message)
        } else {
            format!("{origin}: {field}: {}", e.message)
        }
    })?;
    let count = entries.len();
    match (entries.into_iter().next(), count) {
        (Some(entry), 1) => Ok(entry),
        // Unreachable: one entry was written.
        _ => Err(format!(
            "{origin}: expected one [[volumes]] entry, found {count}"
        )),
    }
}

/// The `list` table (format `text`).
fn list_text(entries: &[ListEntry]) -> String {
    let mut text = format!(
        "{:<16} {:<8} {:<10} {:<11} {:<4} SESSION/DEVICE_PATH",
        "NAME", "ORIGIN", "DEVICE", "STATE", "MODE"
    );
    for e in entries {
        text.push_str(&format!(
            "\n{:<16} {:<8} {:<10} {:<11} {:<4} {}/{}",
            e.name,
            e.origin,
            e.device.as_deref().unwrap_or("-"),
            e.state,
            e.access_mode,
            e.session,
            e.device_path
        ));
    }
    text
}

/// Parses `[[volumes]]` entries (a state file or a `map` request) with the
/// config file's rules; each keeps its own TOML for the state file. A
/// `[daemon]` table is refused: timings come from the config file.
fn parse_state(text: &str, file: &str) -> Result<Vec<RuntimeVolume>, ConfigError> {
    let config = config::parse(text, file)?;
    let table: toml::Table = toml::from_str(text)
        .map_err(|e| ConfigError::at(file, text, None, "", e.message().to_owned()))?;
    if table.contains_key("daemon") {
        return Err(ConfigError::at(
            file,
            text,
            None,
            "daemon",
            "expected only [[volumes]] entries; [daemon] settings belong in the config file",
        ));
    }
    let entries = match table.get("volumes") {
        Some(toml::Value::Array(entries)) => entries.clone(),
        _ => Vec::new(),
    };
    Ok(config
        .volumes
        .into_iter()
        .zip(entries)
        .map(|(volume, entry)| {
            let mut one = toml::Table::new();
            one.insert("volumes".into(), toml::Value::Array(vec![entry]));
            RuntimeVolume {
                volume,
                toml: one.to_string(),
            }
        })
        .collect())
}

/// The config in force: `file`'s volumes, then the run-time volumes whose
/// names the file does not use (those are returned as superseded).
///
/// # Errors
///
/// A run-time volume breaks a rule of the config file against the
/// volumes before it ([`config::conflict`]).
fn merge(file: &Config, runtime: &[RuntimeVolume]) -> Result<(Config, Vec<String>), String> {
    let mut config = file.clone();
    let mut superseded = Vec::new();
    for entry in runtime {
        let volume = &entry.volume;
        if file.volume(&volume.name).is_some() {
            superseded.push(volume.name.clone());
            continue;
        }
        if let Some(conflict) = config::conflict(&config.volumes, volume) {
            return Err(format!(
                "volume {:?}: {}: {}",
                volume.name, conflict.field, conflict.message
            ));
        }
        config.volumes.push(volume.clone());
    }
    Ok((config, superseded))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeKernel;

    /// A temporary directory with a config file holding `config`.
    fn setup(tag: &str, config: &str) -> (PathBuf, PathBuf, PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("brick-initiatord-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("initiator.toml");
        std::fs::write(&path, config).unwrap();
        let state = dir.join("run/volumes.toml");
        (dir, path, state)
    }

    fn request(daemon: &mut Daemon, kernel: &mut FakeKernel, request: Request) -> Reply {
        daemon.answer(request, kernel, Instant::now(), &mut |_| {})
    }

    /// The message of an error reply (panics on any other reply).
    fn refusal(reply: Reply) -> String {
        match reply {
            Reply::Error { message } => message,
            other => panic!("expected an error reply, found {other:?}"),
        }
    }

    /// The text of a text reply.
    fn text(reply: Reply) -> String {
        match reply {
            Reply::Text { text } => text,
            other => panic!("expected a text reply, found {other:?}"),
        }
    }

    /// A volume `name` of session `s` on `device_path`, path 10.0.0.1.
    fn spec(name: &str, device_path: &str) -> VolumeSpec {
        VolumeSpec {
            name: name.into(),
            session: "s".into(),
            device_path: device_path.into(),
            access_mode: None,
            port: None,
            paths: vec!["10.0.0.1".into()],
        }
    }

    fn map(volume: VolumeSpec) -> Request {
        Request::Map { volume }
    }

    fn unmap(name: &str, force: bool) -> Request {
        Request::Unmap {
            name: name.into(),
            force,
        }
    }

    /// The `logs` volume (read-only) as the config file says it.
    fn logs() -> VolumeSpec {
        VolumeSpec {
            access_mode: Some("ro".into()),
            ..spec("logs", "vol1")
        }
    }

    const DB: &str =
        "[[volumes]]\nname = \"db\"\nsession = \"s\"\ndevice_path = \"vol0\"\npaths = [\"10.0.0.1\"]\n";
    const LOGS: &str = "[[volumes]]\nname = \"logs\"\nsession = \"s\"\ndevice_path = \"vol1\"\naccess_mode = \"ro\"\npaths = [\"10.0.0.1\"]\n";

    #[test]
    fn test_map_volume_is_a_config_entry() {
        // Quotes and `@` survive the trip through the entry's TOML.
        let volume = VolumeSpec {
            name: "db".into(),
            session: "host\"1".into(),
            device_path: "vol0".into(),
            paths: vec!["10.0.0.1".into(), "ip:10.0.0.2@ip:10.0.1.1".into()],
            access_mode: Some("ro".into()),
            port: Some(1235),
        };
        let entry = runtime_volume(&volume).unwrap();
        assert_eq!(
            (
                entry.volume.name.as_str(),
                entry.volume.session.as_str(),
                entry.volume.port,
                entry.volume.paths.len(),
                entry.volume.access_mode.as_str()
            ),
            ("db", "host\"1", 1235, 2, "ro")
        );
        // The state file keeps the same entry; it parses as the config does.
        let again = config::parse(&entry.toml, "state").unwrap();
        assert!(again.volumes[0].same_settings(&entry.volume));
        // Absent fields take the config file's defaults.
        let plain = runtime_volume(&spec("x", "vol5")).unwrap();
        assert_eq!(plain.volume.port, config::DEFAULT_PORT);
        assert_eq!(plain.volume.access_mode, config::AccessMode::ReadWrite);
        assert!(!plain.toml.contains("port") && !plain.toml.contains("access_mode"));
    }

    #[test]
    fn test_map_volume_errors_name_the_field() {
        let cases = [
            (
                VolumeSpec {
                    access_mode: Some("rx".into()),
                    ..spec("x", "vol5")
                },
                "map request: volume.access_mode: expected \"ro\", \"rw\" or \"migration\", found \"rx\"",
            ),
            (
                VolumeSpec {
                    paths: vec!["10.0.0.1".into(), "10.0.0".into()],
                    ..spec("x", "vol5")
                },
                "map request: volume.paths[1]: expected an address like",
            ),
            (
                VolumeSpec {
                    paths: Vec::new(),
                    ..spec("x", "vol5")
                },
                "map request: volume.paths: expected 1..=128 paths like \"10.77.0.1\", found 0",
            ),
            (spec("a/b", "vol5"), "map request: volume.name: expected letters"),
            (
                VolumeSpec {
                    session: "a.b".into(),
                    ..spec("x", "vol5")
                },
                "map request: volume.session: expected printable ASCII",
            ),
            (
                spec("x", "../etc"),
                "map request: volume.device_path: expected no \"..\" component",
            ),
        ];
        for (volume, expected) in cases {
            let e = runtime_volume(&volume).err().unwrap_or_default();
            assert!(e.starts_with(expected), "{volume:?}: {e}");
        }
    }

    #[test]
    fn test_map_request_maps_now_and_survives_a_restart() {
        let (dir, path, state) = setup("map", DB);
        let mut kernel = FakeKernel::new();
        kernel.export("vol0");
        kernel.export("vol1");
        let mut daemon = Daemon::load(&path, Options::default()).unwrap();
        assert!(daemon.with_state(&state).unwrap().is_empty());
        daemon
            .tick(&mut kernel, Instant::now(), &mut |_| {})
            .unwrap();

        let reply = request(&mut daemon, &mut kernel, map(logs()));
        assert_eq!(
            reply,
            Reply::Mapped {
                volume: ListEntry {
                    name: "logs".into(),
                    origin: "runtime".into(),
                    session: "s".into(),
                    device_path: "vol1".into(),
                    access_mode: "ro".into(),
                    device: Some("rnbd1".into()),
                    state: "open".into(),
                }
            }
        );
        assert_eq!(kernel.link("logs"), Some("../rnbd1"));
        let kept = std::fs::read_to_string(&state).unwrap();
        assert!(kept.contains("name = \"logs\""), "{kept}");
        assert!(kept.contains("access_mode = \"ro\""), "{kept}");
        let list = text(request(
            &mut daemon,
            &mut kernel,
            Request::List {
                format: Format::Text,
            },
        ));
        assert!(
            list.contains("\ndb               config   rnbd0      open        rw   s/vol0"),
            "{list}"
        );
        assert!(
            list.contains("\nlogs             runtime  rnbd1      open        ro   s/vol1"),
            "{list}"
        );
        let Reply::Status { status } = request(
            &mut daemon,
            &mut kernel,
            Request::Status {
                format: Format::Json,
            },
        ) else {
            panic!("expected a status reply");
        };
        assert!(status.to_json().contains(
            "\"name\":\"logs\",\"session\":\"s\",\"device_path\":\"vol1\",\"origin\":\"runtime\""
        ));
        let table = text(request(
            &mut daemon,
            &mut kernel,
            Request::Status {
                format: Format::Text,
            },
        ));
        assert!(
            table.contains("logs             rnbd1      open        ok       s/vol1"),
            "{table}"
        );

        // A restarted daemon finds the run-time volume and changes nothing.
        let mut again = Daemon::load(&path, Options::default()).unwrap();
        again.with_state(&state).unwrap();
        kernel.writes.clear();
        let pass = again
            .tick(&mut kernel, Instant::now(), &mut |_| {})
            .unwrap();
        assert!(
            pass.applied.is_empty() && kernel.writes.is_empty(),
            "{:?}",
            kernel.writes
        );
        assert_eq!(again.config.volumes.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_bad_map_requests_change_nothing() {
        let (dir, path, state) = setup("badmap", DB);
        let mut kernel = FakeKernel::new();
        kernel.export("vol0");
        let mut daemon = Daemon::load(&path, Options::default()).unwrap();
        daemon.with_state(&state).unwrap();
        daemon
            .tick(&mut kernel, Instant::now(), &mut |_| {})
            .unwrap();
        let cases = [
            (spec("db", "vol0"), "volume \"db\" is in the config file"),
            (
                spec("x", "vol0"),
                "\"vol0\" is already mapped in session \"s\" by volume \"db\"",
            ),
            (
                VolumeSpec {
                    paths: vec!["10.0.0.2".into()],
                    ..spec("x", "vol5")
                },
                "volumes sharing a session must list the same paths and port",
            ),
            (
                VolumeSpec {
                    port: Some(1235),
                    ..spec("x", "vol5")
                },
                "volumes sharing a session must list the same paths and port",
            ),
            (
                VolumeSpec {
                    access_mode: Some("rx".into()),
                    ..spec("x", "vol5")
                },
                "map request: volume.access_mode: expected",
            ),
            (
                VolumeSpec {
                    paths: vec!["host".into()],
                    session: "t".into(),
                    ..spec("x", "vol5")
                },
                "map request: volume.paths[0]: expected an address",
            ),
            // Not exported by the target: the kernel refuses, nothing is kept.
            (
                VolumeSpec {
                    session: "t".into(),
                    ..spec("x", "vol5")
                },
                "the kernel refused",
            ),
        ];
        for (volume, expected) in cases {
            let message = refusal(request(&mut daemon, &mut kernel, map(volume.clone())));
            assert!(message.contains(expected), "{volume:?}: {message}");
            assert_eq!(daemon.config.volumes.len(), 1, "{volume:?}");
            assert!(
                !std::fs::read_to_string(&state)
                    .unwrap_or_default()
                    .contains("name ="),
                "{volume:?}"
            );
        }
        let message = refusal(request(&mut daemon, &mut kernel, map(logs())));
        assert!(message.contains("the kernel refused"), "{message}");
        assert_eq!(kernel.device_names(), ["rnbd0"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_unmap_request() {
        let (dir, path, state) = setup("unmap", DB);
        let mut kernel = FakeKernel::new();
        kernel.export("vol0");
        kernel.export("vol1");
        let mut daemon = Daemon::load(&path, Options::default()).unwrap();
        daemon.with_state(&state).unwrap();
        daemon
            .tick(&mut kernel, Instant::now(), &mut |_| {})
            .unwrap();
        request(&mut daemon, &mut kernel, map(logs()));
        assert_eq!(kernel.device_names(), ["rnbd0", "rnbd1"]);

        let message = refusal(request(&mut daemon, &mut kernel, unmap("db", false)));
        assert!(
            message.contains("is in the config file")
                && message.contains("(line 1)")
                && message.contains("remove it there and reload"),
            "{message}"
        );
        assert_eq!(
            refusal(request(&mut daemon, &mut kernel, unmap("nope", true))),
            "no volume \"nope\""
        );

        kernel.mount("rnbd1", "/srv/logs");
        let message = refusal(request(&mut daemon, &mut kernel, unmap("logs", false)));
        assert_eq!(
            message,
            "rnbd1 (logs) is mounted at /srv/logs; unmount it or use --force"
        );
        assert_eq!(kernel.device_names(), ["rnbd0", "rnbd1"]);

        let reply = request(&mut daemon, &mut kernel, unmap("logs", true));
        assert_eq!(
            reply,
            Reply::Unmapped {
                name: "logs".into(),
                device: Some("rnbd1".into())
            }
        );
        assert_eq!(kernel.device_names(), ["rnbd0"]);
        assert_eq!(kernel.link("logs"), None);
        assert!(!std::fs::read_to_string(&state).unwrap().contains("logs"));
        // Gone for good: the next pass does not map it again.
        daemon
            .tick(&mut kernel, Instant::now(), &mut |_| {})
            .unwrap();
        assert_eq!(kernel.device_names(), ["rnbd0"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_config_file_supersedes_a_runtime_volume() {
        let (dir, path, state) = setup("supersede", DB);
        let mut kernel = FakeKernel::new();
        kernel.export("vol0");
        kernel.export("vol1");
        let mut daemon = Daemon::load(&path, Options::default()).unwrap();
        daemon.with_state(&state).unwrap();
        request(&mut daemon, &mut kernel, map(logs()));
        std::fs::write(&path, format!("{DB}\n{LOGS}")).unwrap();
        let summary = daemon.reload().unwrap();
        assert_eq!(summary.superseded, ["logs"]);
        assert!(summary.added.is_empty() && summary.removed.is_empty());
        kernel.writes.clear();
        daemon
            .tick(&mut kernel, Instant::now(), &mut |_| {})
            .unwrap();
        assert!(kernel.writes.is_empty(), "{:?}", kernel.writes);
        let Reply::List { volumes } = request(
            &mut daemon,
            &mut kernel,
            Request::List {
                format: Format::Json,
            },
        ) else {
            panic!("expected a list reply");
        };
        let origins: Vec<(&str, &str)> = volumes
            .iter()
            .map(|v| (v.name.as_str(), v.origin.as_str()))
            .collect();
        assert_eq!(origins, [("db", "config"), ("logs", "config")]);
        assert!(!std::fs::read_to_string(&state).unwrap().contains("logs"));

        // A state file that conflicts with the config file stops the start.
        std::fs::write(&state, "[[volumes]]\nname = \"z\"\nsession = \"s\"\ndevice_path = \"vol9\"\npaths = [\"10.9.9.9\"]\n").unwrap();
        let mut fresh = Daemon::load(&path, Options::default()).unwrap();
        let e = fresh.with_state(&state).unwrap_err();
        assert!(e.to_string().contains("must list the same paths"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
