//! Desired state (config) vs observed state (sysfs) -> actions, each with a reason.
//!
//! [`plan`] is pure: it looks at a [`Config`] and an [`Observed`] and
//! returns the [`Step`]s that move the kernel toward the config, plus
//! [`Plan::notices`] for what it will not do and why. [`apply`] performs one
//! step through [`Sysfs`]. [`reconcile`] runs observe -> plan -> apply
//! until nothing is left to do (at most [`MAX_ROUNDS`] rounds), so one call
//! maps a device and links it.
//!
//! Rules (`rnbd.md` §5, `rtrs.md` §6, §8):
//!
//! * The rnbd client module is loaded first if a volume is configured.
//! * A volume with no device in its session is mapped (`map_device`, with
//!   all paths, at most six; the rest are added with `add_path`). Not while
//!   its session exists with no connected path: a map would fail, the path
//!   has to come back first.
//! * A configured path missing from its session is added (`add_path`).
//! * A path disconnected for `reconnect_after_s` gets `reconnect`: this
//!   skips RTRS's 30 s delay and revives a path RTRS gave up after
//!   `max_reconnect_attempts`.
//! * A device `closed` for `remap_after_s` while its session has a
//!   connected path is reopened (`remap_device`): the target lost the
//!   volume, or rnbd's own (asynchronous) reopen failed.
//! * `/dev/brick/<name>` links to `../rnbdN` of its volume; a wrong link
//!   is replaced.
//! * Ownership: a device is the daemon's if a `/dev/brick` link names it.
//!   A linked device no volume wants (removed from the config, or its
//!   session or device path changed) is unmapped (`normal`; `force` with
//!   `--force`) unless it is mounted or held, and its link then removed.
//!   Devices nobody linked are never touched.
//! * An action that failed, or was accepted without effect, is not tried
//!   again before `retry_interval_s`.
//!
//! Volumes with `export` (userspace volumes, served as NBD by the daemon
//! itself, see `userspace`) are not the kernel's: [`plan`] and
//! [`converged`] look only at [`Config::kernel_only`], so such a volume
//! causes no sysfs write (not even loading the module).
//!
//! A second pass over a converged state plans nothing (idempotence): every
//! rule compares with what sysfs shows, nothing is remembered but attempt
//! times and how long paths and devices have been down.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::time::{Duration, Instant};

use crate::config::{Config, PathSpec, Volume, MAX_MAP_PATHS};
use crate::observe::{link_device, observe, DeviceState, Observed};
use crate::sysfs::{Sysfs, DEV_BRICK, RNBD_CTL, RNBD_MODULE, RTRS_CLIENT, SYS_BLOCK};

/// Observe/plan/apply rounds per [`reconcile`] call; each round's actions
/// enable the next (map, then link), so three suffice, four is margin.
pub const MAX_ROUNDS: usize = 4;

/// Policy switches from the command line.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Options {
    /// Unmap devices removed from the config even if open or mounted, with
    /// `unmap_device force`.
    pub force: bool,
}

/// One change to the kernel or to `/dev/brick`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Action {
    /// `modprobe` a module.
    LoadModule {
        /// Module name.
        module: &'static str,
    },
    /// Write `line` to `map_device`.
    Map {
        /// The volume's name.
        volume: String,
        /// The `map_device` line.
        line: String,
    },
    /// Write `path` to the session's `add_path`.
    AddPath {
        /// Session name.
        session: String,
        /// The path to add.
        path: PathSpec,
    },
    /// Write `1` to a path's `reconnect`.
    Reconnect {
        /// Session name.
        session: String,
        /// The path's directory (`src@dst`).
        directory: String,
    },
    /// Write `1` to the device's `remap_device`.
    Remap {
        /// The volume's name.
        volume: String,
        /// `rnbdN`.
        device: String,
    },
    /// Write `normal` (or `force`) to the device's `unmap_device`.
    Unmap {
        /// `rnbdN`.
        device: String,
        /// Use `force`.
        force: bool,
    },
    /// Make `/dev/brick/<name>` a link to `../<device>`.
    Link {
        /// The volume's name.
        name: String,
        /// `rnbdN`.
        device: String,
    },
    /// Remove `/dev/brick/<name>`.
    Unlink {
        /// The stale name.
        name: String,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LoadModule { module } => write!(f, "modprobe {module}"),
            Self::Map { volume, line } => write!(f, "map {volume} ({line})"),
            Self::AddPath { session, path } => write!(f, "add_path {path} to session {session}"),
            Self::Reconnect { session, directory } => {
                write!(f, "reconnect path {directory} of session {session}")
            }
            Self::Remap { volume, device } => write!(f, "remap {volume} ({device})"),
            Self::Unmap { device, force } => {
                write!(
                    f,
                    "unmap {device} ({})",
                    if *force { "force" } else { "normal" }
                )
            }
            Self::Link { name, device } => write!(f, "link {DEV_BRICK}/{name} -> ../{device}"),
            Self::Unlink { name } => write!(f, "remove link {DEV_BRICK}/{name}"),
        }
    }
}

/// An action and why it is needed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Step {
    /// What to do.
    pub action: Action,
    /// Why, for the log: what was expected and what was found.
    pub reason: String,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.action, self.reason)
    }
}

/// The outcome of [`plan`].
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Plan {
    /// Actions to apply, in order.
    pub steps: Vec<Step>,
    /// Things left as they are on purpose, with the reason (an open device
    /// not unmapped, a retry not yet due, a mismatch needing a human).
    pub notices: Vec<String>,
}

/// What the daemon remembers between passes: which actions are held off
/// (failed, or accepted without effect) since when, since when paths are
/// down and devices closed, which notices were already logged.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    held_since: BTreeMap<String, Instant>,
    down_since: BTreeMap<(String, String), Instant>,
    closed_since: BTreeMap<String, Instant>,
    logged_notices: BTreeSet<String>,
}

impl Memory {
    /// Holds `action` off until `retry_interval_s` after `now`: it failed,
    /// or the kernel accepted it without the expected effect (it was
    /// planned again right after), and must not repeat every pass.
    pub fn hold_off(&mut self, action: &Action, now: Instant) {
        self.held_since.insert(action.to_string(), now);
    }

    /// Forgets a hold-off: `action` worked.
    pub fn clear(&mut self, action: &Action) {
        self.held_since.remove(&action.to_string());
    }

    /// The notices not logged yet; forgets those no longer current, so a
    /// problem that comes back is logged again.
    pub fn new_notices(&mut self, notices: &[String]) -> Vec<String> {
        let current: BTreeSet<String> = notices.iter().cloned().collect();
        let fresh = current.difference(&self.logged_notices).cloned().collect();
        self.logged_notices = current;
        fresh
    }

    /// Whether `action` was held off less than `retry` before `now`.
    fn held_off(&self, action: &Action, now: Instant, retry: Duration) -> bool {
        self.held_since
            .get(&action.to_string())
            .is_some_and(|at| now.saturating_duration_since(*at) < retry)
    }
}

/// The `map_device` line for `volume`: `dest_port` first (it applies only
/// to the `path=` tokens after it), at most six paths.
pub fn map_line(volume: &Volume) -> String {
    let mut line = format!("sessname={} dest_port={}", volume.session, volume.port);
    for path in volume.paths.iter().take(MAX_MAP_PATHS) {
        line.push_str(&format!(" path={path}"));
    }
    line.push_str(&format!(
        " device_path={} access_mode={}",
        volume.device_path, volume.access_mode
    ));
    line
}

/// Plans the steps from `observed` toward `config` at `now`, updating the
/// path-down clocks in `memory`.
pub fn plan(
    config: &Config,
    observed: &Observed,
    memory: &mut Memory,
    now: Instant,
    options: Options,
) -> Plan {
    // Userspace volumes are served by the daemon, not the rnbd client.
    let config = &config.kernel_only();
    let mut out = Plan::default();
    let retry = Duration::from_secs(config.daemon.retry_interval_s);
    let reconnect_after = Duration::from_secs(config.daemon.reconnect_after_s);
    let remap_after = Duration::from_secs(config.daemon.remap_after_s);
    memory
        .held_since
        .retain(|_, at| now.saturating_duration_since(*at) < retry);
    let mut steps: Vec<Step> = Vec::new();

    if !observed.rnbd_loaded {
        if !config.volumes.is_empty() {
            steps.push(Step {
                action: Action::LoadModule {
                    module: RNBD_MODULE,
                },
                reason: format!(
                    "{} volume(s) configured, {RNBD_CTL} missing",
                    config.volumes.len()
                ),
            });
        }
        out.steps = throttle(steps, memory, now, retry, &mut out.notices);
        return out;
    }

    let wanted = |session: &str, mapping_path: &str| {
        config
            .volumes
            .iter()
            .any(|v| v.session == session && v.device_path == mapping_path)
    };

    // Devices the daemon owns (linked) that no volume wants: unmap.
    for (name, target) in &observed.links {
        let device_name = link_device(target);
        let Some(device) = observed.device(device_name) else {
            continue;
        };
        if wanted(&device.session, &device.mapping_path) {
            continue;
        }
        let why = match config.volume(name) {
            None => format!("volume {name:?} is no longer in the config"),
            Some(v) => format!(
                "volume {name:?} now wants {:?} in session {:?}, {} maps {:?} in session {:?}",
                v.device_path, v.session, device.name, device.mapping_path, device.session
            ),
        };
        match device.in_use() {
            Some(use_) if !options.force => out.notices.push(format!(
                "keeping {} ({DEV_BRICK}/{name}): {why}, but it is {use_}; \
                 unmount it or run with --force",
                device.name
            )),
            _ => steps.push(Step {
                action: Action::Unmap {
                    device: device.name.clone(),
                    force: options.force,
                },
                reason: why,
            }),
        }
    }

    // Sessions: missing paths, paths down.
    let mut seen_sessions = BTreeSet::new();
    for volume in &config.volumes {
        if !seen_sessions.insert(volume.session.as_str()) {
            continue;
        }
        let Some(session) = observed.sessions.get(&volume.session) else {
            continue;
        };
        for spec in &volume.paths {
            let present = session
                .paths
                .iter()
                .any(|p| p.target.is_some_and(|t| spec.matches(p.source, t)));
            if !present {
                steps.push(Step {
                    action: Action::AddPath {
                        session: volume.session.clone(),
                        path: *spec,
                    },
                    reason: format!(
                        "config lists path {spec} (line {}), session {:?} has {}",
                        volume.line,
                        volume.session,
                        describe_paths(session)
                    ),
                });
            }
        }
        for path in &session.paths {
            let key = (volume.session.clone(), path.directory.clone());
            if path.connected {
                memory.down_since.remove(&key);
                continue;
            }
            let since = *memory.down_since.entry(key).or_insert(now);
            let down = now.saturating_duration_since(since);
            if down >= reconnect_after {
                steps.push(Step {
                    action: Action::Reconnect {
                        session: volume.session.clone(),
                        directory: path.directory.clone(),
                    },
                    reason: format!(
                        "path disconnected for {}s (RTRS retries only every 30 s, \
                         and not at all after max_reconnect_attempts)",
                        down.as_secs()
                    ),
                });
            }
        }
    }
    // Forget clocks of paths no longer listed.
    memory.down_since.retain(|(session, directory), _| {
        observed
            .sessions
            .get(session)
            .is_some_and(|s| s.paths.iter().any(|p| &p.directory == directory))
    });

    // Volumes: map, remap, link.
    for volume in &config.volumes {
        let session = observed.sessions.get(&volume.session);
        let Some(device) = observed.device_for(&volume.session, &volume.device_path) else {
            if session.is_some_and(|s| !s.any_connected()) {
                out.notices.push(format!(
                    "{}: not mapped; waiting for a connected path of session {:?} to map it",
                    volume.name, volume.session
                ));
                continue;
            }
            steps.push(Step {
                action: Action::Map {
                    volume: volume.name.clone(),
                    line: map_line(volume),
                },
                reason: format!(
                    "config (line {}) wants {:?} from session {:?}; no rnbd device maps it",
                    volume.line, volume.device_path, volume.session
                ),
            });
            continue;
        };
        if let Some(mode) = device.access_mode {
            if mode != volume.access_mode {
                out.notices.push(format!(
                    "{}: {} is mapped {mode}, the config says {}; \
                     unmap it to have it mapped again (not done automatically)",
                    volume.name, device.name, volume.access_mode
                ));
            }
        }
        let connected_path = session.and_then(|s| s.paths.iter().find(|p| p.connected));
        match (device.state, connected_path) {
            (DeviceState::Closed, Some(path)) => {
                let since = *memory
                    .closed_since
                    .entry(device.name.clone())
                    .or_insert(now);
                let closed = now.saturating_duration_since(since);
                if closed >= remap_after {
                    steps.push(Step {
                        action: Action::Remap {
                            volume: volume.name.clone(),
                            device: device.name.clone(),
                        },
                        reason: format!(
                            "{} is closed while path {} is connected, for {}s \
                             (the target lost the volume, or rnbd's reopen failed)",
                            device.name,
                            path.directory,
                            closed.as_secs()
                        ),
                    });
                } else {
                    out.notices.push(format!(
                        "{}: {} is closed while path {} is connected; \
                         remap_device in {}s unless rnbd reopens it",
                        volume.name,
                        device.name,
                        path.directory,
                        remap_after.as_secs()
                    ));
                }
            }
            (DeviceState::Closed, None) => {
                memory.closed_since.remove(&device.name);
                out.notices.push(format!(
                    "{}: {} is closed; waiting for a path of session {:?}",
                    volume.name, device.name, volume.session
                ));
            }
            _ => {
                memory.closed_since.remove(&device.name);
            }
        }
        let expected = format!("../{}", device.name);
        match observed.links.get(&volume.name) {
            Some(target) if link_device(target) == device.name => {}
            found => steps.push(Step {
                action: Action::Link {
                    name: volume.name.clone(),
                    device: device.name.clone(),
                },
                reason: match found {
                    None => format!(
                        "{DEV_BRICK}/{} missing, expected -> {expected}",
                        volume.name
                    ),
                    Some(target) => format!(
                        "{DEV_BRICK}/{} -> {target}, expected -> {expected}",
                        volume.name
                    ),
                },
            }),
        }
    }

    memory
        .closed_since
        .retain(|device, _| observed.device(device).is_some());

    // Links no volume wants whose device is gone or belongs elsewhere.
    for (name, target) in &observed.links {
        if config.volume(name).is_some() {
            continue;
        }
        let device_name = link_device(target);
        match observed.device(device_name) {
            Some(device) if !wanted(&device.session, &device.mapping_path) => {
                // Still ours to unmap (above); the link goes after the device.
            }
            Some(_) => steps.push(Step {
                action: Action::Unlink { name: name.clone() },
                reason: format!(
                    "volume {name:?} is not in the config; {device_name} belongs to another volume"
                ),
            }),
            None => steps.push(Step {
                action: Action::Unlink { name: name.clone() },
                reason: format!("volume {name:?} is not in the config and {target} is gone"),
            }),
        }
    }

    // Order: free first, then paths, reopen, map, names.
    steps.sort_by_key(|step| match step.action {
        Action::LoadModule { .. } => 0,
        Action::Unmap { .. } => 1,
        Action::Reconnect { .. } => 2,
        Action::AddPath { .. } => 3,
        Action::Remap { .. } => 4,
        Action::Map { .. } => 5,
        Action::Link { .. } => 6,
        Action::Unlink { .. } => 7,
    });
    out.steps = throttle(steps, memory, now, retry, &mut out.notices);
    out
}

fn describe_paths(session: &crate::observe::Session) -> String {
    if session.paths.is_empty() {
        return "no paths".into();
    }
    let items: Vec<&str> = session.paths.iter().map(|p| p.directory.as_str()).collect();
    items.join(", ")
}

/// Drops steps held off less than `retry` ago.
fn throttle(
    steps: Vec<Step>,
    memory: &Memory,
    now: Instant,
    retry: Duration,
    notices: &mut Vec<String>,
) -> Vec<Step> {
    steps
        .into_iter()
        .filter(|step| {
            let held_off = memory.held_off(&step.action, now, retry);
            if held_off {
                // Stable text: the notice is logged once, not every pass.
                notices.push(format!(
                    "{} held off after a failure or no effect; retried at most every {}s",
                    step.action,
                    retry.as_secs()
                ));
            }
            !held_off
        })
        .collect()
}

/// Performs one action.
///
/// # Errors
///
/// The kernel's refusal (as the failed write's error) or a file-system
/// error on `/dev/brick`.
pub fn apply(sysfs: &mut dyn Sysfs, action: &Action) -> io::Result<()> {
    match action {
        Action::LoadModule { module } => sysfs.load_module(module),
        Action::Map { line, .. } => sysfs.write(&format!("{RNBD_CTL}/map_device"), line),
        Action::AddPath { session, path } => sysfs.write(
            &format!("{RTRS_CLIENT}/{session}/add_path"),
            &path.to_string(),
        ),
        Action::Reconnect { session, directory } => sysfs.write(
            &format!("{RTRS_CLIENT}/{session}/paths/{directory}/reconnect"),
            "1",
        ),
        Action::Remap { device, .. } => {
            sysfs.write(&format!("{SYS_BLOCK}/{device}/rnbd/remap_device"), "1")
        }
        Action::Unmap { device, force } => sysfs.write(
            &format!("{SYS_BLOCK}/{device}/rnbd/unmap_device"),
            if *force { "force" } else { "normal" },
        ),
        Action::Link { name, device } => {
            sysfs.symlink(&format!("../{device}"), &format!("{DEV_BRICK}/{name}"))
        }
        Action::Unlink { name } => sysfs.remove(&format!("{DEV_BRICK}/{name}")),
    }
}

/// What one [`reconcile`] call did.
#[derive(Debug, Default)]
pub struct Pass {
    /// Steps applied, with their results.
    pub applied: Vec<(Step, io::Result<()>)>,
    /// Notices of the last round.
    pub notices: Vec<String>,
    /// The last observation (after the last round's actions).
    pub observed: Observed,
}

impl Pass {
    /// Whether any applied step failed.
    pub fn any_failed(&self) -> bool {
        self.applied.iter().any(|(_, result)| result.is_err())
    }
}

/// Observes, plans and applies until a round plans nothing (at most
/// [`MAX_ROUNDS`] rounds). `log` receives one line per action before it is
/// applied and one per failure.
///
/// # Errors
///
/// Observing failed (see [`observe`]); actions that fail are reported in
/// [`Pass::applied`], not as errors.
pub fn reconcile(
    sysfs: &mut dyn Sysfs,
    config: &Config,
    memory: &mut Memory,
    now: Instant,
    options: Options,
    log: &mut dyn FnMut(&str),
) -> io::Result<Pass> {
    let mut pass = Pass::default();
    // Actions that succeeded in this call: planned again means no effect.
    let mut succeeded: BTreeSet<String> = BTreeSet::new();
    for _ in 0..MAX_ROUNDS {
        let observed = observe(sysfs)?;
        let planned = plan(config, &observed, memory, now, options);
        pass.observed = observed;
        pass.notices = planned.notices;
        if planned.steps.is_empty() {
            break;
        }
        let mut progress = false;
        for step in planned.steps {
            let key = step.action.to_string();
            if succeeded.contains(&key) {
                log(&format!(
                    "{} was accepted but had no effect; next attempt in {}s",
                    step.action, config.daemon.retry_interval_s
                ));
                memory.hold_off(&step.action, now);
                continue;
            }
            progress = true;
            log(&step.to_string());
            let result = apply(sysfs, &step.action);
            match &result {
                Ok(()) => {
                    memory.clear(&step.action);
                    succeeded.insert(key);
                }
                Err(e) => {
                    memory.hold_off(&step.action, now);
                    log(&format!("{} failed: {e}", step.action));
                }
            }
            pass.applied.push((step, result));
        }
        if !progress {
            break;
        }
    }
    if !pass.applied.is_empty() {
        pass.observed = observe(sysfs)?;
        let planned = plan(config, &pass.observed, memory, now, options);
        pass.notices = planned.notices;
    }
    Ok(pass)
}

/// Whether every configured volume is mapped, open and linked.
pub fn converged(config: &Config, observed: &Observed) -> bool {
    config.kernel_only().volumes.iter().all(|volume| {
        observed
            .device_for(&volume.session, &volume.device_path)
            .is_some_and(|device| {
                device.state == DeviceState::Open
                    && observed
                        .links
                        .get(&volume.name)
                        .is_some_and(|target| link_device(target) == device.name)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::fake::FakeKernel;

    const KERNEL_AND_NBD: &str = r#"
[[volumes]]
name = "db"
session = "host1"
device_path = "vol0"
paths = ["10.77.0.1"]

[[volumes]]
name = "nbd"
session = "host1-nbd"
device_path = "vol1"
paths = ["127.0.0.1"]
export = "nbd:unix:/run/brick/nbd.sock"
link = "udp:127.0.0.2:4791"
"#;

    fn pass(kernel: &mut FakeKernel, config: &Config) -> Pass {
        reconcile(
            kernel,
            config,
            &mut Memory::default(),
            Instant::now(),
            Options::default(),
            &mut |_| {},
        )
        .expect("observe never fails on the fake")
    }

    #[test]
    fn test_userspace_volumes_cause_no_sysfs_writes() {
        let both = parse(KERNEL_AND_NBD, "t.toml").unwrap();
        let only_nbd = Config {
            volumes: both.volumes[1..].to_vec(),
            ..both.clone()
        };
        // Alone: not even the module is loaded; converged as far as the
        // kernel goes.
        let mut kernel = FakeKernel::new();
        kernel.export("vol0");
        kernel.export("vol1");
        let first = pass(&mut kernel, &only_nbd);
        assert!(kernel.writes.is_empty(), "{:?}", kernel.writes);
        assert!(first.applied.is_empty());
        assert!(converged(&only_nbd, &first.observed));

        // With a kernel volume: only that one is mapped and linked.
        let second = pass(&mut kernel, &both);
        assert!(converged(&both, &second.observed));
        assert_eq!(kernel.device_for("host1", "vol0").as_deref(), Some("rnbd0"));
        assert_eq!(kernel.device_for("host1-nbd", "vol1"), None);
        assert_eq!(kernel.link("nbd"), None);
        assert!(
            kernel
                .writes
                .iter()
                .all(|(path, value)| !path.contains("host1-nbd")
                    && !value.contains("host1-nbd")
                    && !path.ends_with("/nbd")),
            "{:?}",
            kernel.writes
        );
        // And again: nothing to do.
        kernel.writes.clear();
        pass(&mut kernel, &both);
        assert!(kernel.writes.is_empty(), "{:?}", kernel.writes);
    }
}
