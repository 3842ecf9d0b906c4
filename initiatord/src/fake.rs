//! An in-memory rnbd/rtrs client for tests: a [`Sysfs`] that reacts.
//!
//! [`FakeKernel`] keeps a model (devices, sessions, paths, a target that can
//! go down, volumes it exports, mounts, `/dev/brick` links) and renders the
//! sysfs files from it. Writes to the control files change the model the
//! way `rnbd.md` §5 and `rtrs.md` §6, §8 describe for Linux 6.1:
//!
//! * `map_device` creates the session (every path must connect, else the
//!   whole map fails) and `/sys/block/rnbdN` with the lowest free N;
//!   `EEXIST` if the device path is already mapped in the session, `ENXIO`
//!   for a new session without paths, `ENOENT` if the target does not
//!   export the volume.
//! * `unmap_device`: `normal` is `EBUSY` while the device is open (mounted,
//!   held or opened); the session goes with its last device.
//! * `remap_device`: `EALREADY` if open; reopens if a path is connected
//!   and the target exports the volume.
//! * `add_path`, `paths/*/reconnect`, `remove_path`, `disconnect`.
//! * When the last path goes down, open devices become `closed`; when the
//!   first comes back, closed devices whose volume the target exports
//!   reopen (rnbd's RECONNECTED remap).
//!
//! Time does not pass by itself: RTRS's own reconnect (after 30 s) happens
//! only when a test calls [`FakeKernel::auto_reconnect`]; a path that RTRS
//! gave up ([`FakeKernel::give_up`]) never comes back by itself.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use crate::config::{Address, PathSpec};
use crate::sysfs::{Sysfs, DEV_BRICK, PROC_MOUNTS, RNBD_CTL, RNBD_MODULE, RTRS_CLIENT, SYS_BLOCK};

/// A path's state inside RTRS (sysfs shows only connected/disconnected).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FakePathState {
    /// Up; IO may use it.
    Connected,
    /// Down; RTRS retries every 30 s ([`FakeKernel::auto_reconnect`]).
    Reconnecting,
    /// Down for good: `max_reconnect_attempts` ran out, or `disconnect`.
    GivenUp,
}

#[derive(Clone, Debug)]
struct FakePath {
    source: Address,
    target: Address,
    state: FakePathState,
}

impl FakePath {
    fn directory(&self) -> String {
        format!("{}@{}", self.source, self.target)
    }
}

#[derive(Clone, Debug, Default)]
struct FakeSession {
    paths: Vec<FakePath>,
}

impl FakeSession {
    fn any_connected(&self) -> bool {
        self.paths
            .iter()
            .any(|p| p.state == FakePathState::Connected)
    }
}

#[derive(Clone, Debug)]
struct FakeDevice {
    session: String,
    mapping_path: String,
    access_mode: String,
    open: bool,
    open_count: u32,
    holders: Vec<String>,
}

/// The simulated kernel (and target). See the module docs.
#[derive(Clone, Debug)]
pub struct FakeKernel {
    rnbd_loaded: bool,
    devices: BTreeMap<u32, FakeDevice>,
    sessions: BTreeMap<String, FakeSession>,
    links: BTreeMap<String, String>,
    mounts: Vec<(String, String)>,
    exports: BTreeSet<String>,
    target_up: bool,
    unreachable: BTreeSet<Address>,
    /// Every write and link change, in order, as `(path, value)`.
    pub writes: Vec<(String, String)>,
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn not_found() -> io::Error {
    io::Error::from(io::ErrorKind::NotFound)
}

/// The source address the fake binds when a path names none: the target's
/// subnet, host 2 (host 3 if the target is host 2).
fn default_source(target: Address) -> Address {
    match target {
        Address::Ip(std::net::IpAddr::V4(v4)) => {
            let [a, b, c, d] = v4.octets();
            let host = if d == 2 { 3 } else { 2 };
            Address::Ip(std::net::Ipv4Addr::new(a, b, c, host).into())
        }
        other => other,
    }
}

impl Default for FakeKernel {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeKernel {
    /// A kernel without the rnbd module loaded, a target that is up and
    /// exports nothing yet.
    pub fn new() -> Self {
        Self {
            rnbd_loaded: false,
            devices: BTreeMap::new(),
            sessions: BTreeMap::new(),
            links: BTreeMap::new(),
            mounts: Vec::new(),
            exports: BTreeSet::new(),
            target_up: true,
            unreachable: BTreeSet::new(),
            writes: Vec::new(),
        }
    }

    // --- the target and the network ------------------------------------

    /// The target serves `device_path`.
    pub fn export(&mut self, device_path: &str) {
        self.exports.insert(device_path.to_owned());
    }

    /// The target no longer serves `device_path` (already open devices
    /// stay open until they are reopened).
    pub fn unexport(&mut self, device_path: &str) {
        self.exports.remove(device_path);
    }

    /// The target goes away: every connected path starts reconnecting,
    /// and sessions that lose their last path close their devices.
    pub fn target_down(&mut self) {
        self.target_up = false;
        let names: Vec<String> = self.sessions.keys().cloned().collect();
        for name in names {
            let was_any = self.any_connected(&name);
            if let Some(session) = self.sessions.get_mut(&name) {
                for path in &mut session.paths {
                    if path.state == FakePathState::Connected {
                        path.state = FakePathState::Reconnecting;
                    }
                }
            }
            self.after_path_change(&name, was_any);
        }
    }

    /// The target is back (a new instance: it has no sessions). Paths stay
    /// down until RTRS retries ([`Self::auto_reconnect`]) or the daemon
    /// writes `reconnect`.
    pub fn target_up(&mut self) {
        self.target_up = true;
    }

    /// The link to `target` breaks: paths to it start reconnecting.
    pub fn link_down(&mut self, target: &str) {
        let target = Address::parse(target).expect("test address");
        self.unreachable.insert(target);
        let names: Vec<String> = self.sessions.keys().cloned().collect();
        for name in names {
            let was_any = self.any_connected(&name);
            if let Some(session) = self.sessions.get_mut(&name) {
                for path in &mut session.paths {
                    if path.target == target && path.state == FakePathState::Connected {
                        path.state = FakePathState::Reconnecting;
                    }
                }
            }
            self.after_path_change(&name, was_any);
        }
    }

    /// The link to `target` works again (paths stay down until retried).
    pub fn link_up(&mut self, target: &str) {
        let target = Address::parse(target).expect("test address");
        self.unreachable.remove(&target);
    }

    /// RTRS's own reconnect timer fires on every reconnecting path.
    pub fn auto_reconnect(&mut self) {
        let names: Vec<String> = self.sessions.keys().cloned().collect();
        for name in names {
            let was_any = self.any_connected(&name);
            let up = self.target_up;
            let unreachable = self.unreachable.clone();
            if let Some(session) = self.sessions.get_mut(&name) {
                for path in &mut session.paths {
                    if path.state == FakePathState::Reconnecting
                        && up
                        && !unreachable.contains(&path.target)
                    {
                        path.state = FakePathState::Connected;
                    }
                }
            }
            self.after_path_change(&name, was_any);
        }
    }

    /// RTRS gives up every path of `session` (`max_reconnect_attempts` ran
    /// out): they stay disconnected until someone writes `reconnect`.
    pub fn give_up(&mut self, session: &str) {
        let was_any = self.any_connected(session);
        if let Some(s) = self.sessions.get_mut(session) {
            for path in &mut s.paths {
                path.state = FakePathState::GivenUp;
            }
        }
        self.after_path_change(session, was_any);
    }

    // --- users of the devices ------------------------------------------

    /// Mounts `/dev/<device>` (which opens it).
    pub fn mount(&mut self, device: &str, mount_point: &str) {
        self.mounts
            .push((format!("/dev/{device}"), mount_point.to_owned()));
        if let Some(d) = self.device_mut(device) {
            d.open_count += 1;
        }
    }

    /// A dm/md device stacks on `device` (which opens it).
    pub fn add_holder(&mut self, device: &str, holder: &str) {
        if let Some(d) = self.device_mut(device) {
            d.holders.push(holder.to_owned());
            d.open_count += 1;
        }
    }

    /// Something opens `/dev/<device>` (and keeps it open).
    pub fn open(&mut self, device: &str) {
        if let Some(d) = self.device_mut(device) {
            d.open_count += 1;
        }
    }

    /// An administrator force-unmaps `device` behind the daemon's back.
    pub fn admin_unmap(&mut self, device: &str) {
        let _ = self.unmap(device, "force");
    }

    // --- what tests look at --------------------------------------------

    /// Mapped devices, `rnbdN` names in index order.
    pub fn device_names(&self) -> Vec<String> {
        self.devices.keys().map(|n| format!("rnbd{n}")).collect()
    }

    /// The `state` of `device`.
    pub fn device_state(&self, device: &str) -> Option<&'static str> {
        self.device(device)
            .map(|d| if d.open { "open" } else { "closed" })
    }

    /// The device mapping `device_path` in `session`.
    pub fn device_for(&self, session: &str, device_path: &str) -> Option<String> {
        self.devices
            .iter()
            .find(|(_, d)| d.session == session && d.mapping_path == device_path)
            .map(|(n, _)| format!("rnbd{n}"))
    }

    /// `(directory, state)` of each path of `session`.
    pub fn paths(&self, session: &str) -> Vec<(String, FakePathState)> {
        self.sessions
            .get(session)
            .map(|s| s.paths.iter().map(|p| (p.directory(), p.state)).collect())
            .unwrap_or_default()
    }

    /// Session names.
    pub fn session_names(&self) -> Vec<String> {
        self.sessions.keys().cloned().collect()
    }

    /// The target of `/dev/brick/<name>`.
    pub fn link(&self, name: &str) -> Option<&str> {
        self.links.get(name).map(String::as_str)
    }

    /// Plants a link as if something else made it.
    pub fn set_link(&mut self, name: &str, target: &str) {
        self.links.insert(name.to_owned(), target.to_owned());
    }

    /// Whether `modprobe rnbd-client` ran.
    pub fn rnbd_loaded(&self) -> bool {
        self.rnbd_loaded
    }

    // --- the model -----------------------------------------------------

    fn index(device: &str) -> Option<u32> {
        device.strip_prefix("rnbd")?.parse().ok()
    }

    fn device(&self, device: &str) -> Option<&FakeDevice> {
        self.devices.get(&Self::index(device)?)
    }

    fn device_mut(&mut self, device: &str) -> Option<&mut FakeDevice> {
        self.devices.get_mut(&Self::index(device)?)
    }

    fn reachable(&self, target: Address) -> bool {
        self.target_up && !self.unreachable.contains(&target)
    }

    /// Whether `session` has a connected path (false if it does not exist).
    fn any_connected(&self, session: &str) -> bool {
        self.sessions
            .get(session)
            .is_some_and(FakeSession::any_connected)
    }

    /// rnbd's reaction to the session's paths changing from `was_any`
    /// connected: DISCONNECTED closes its devices when the last path went
    /// down; RECONNECTED reopens those the target exports when the first
    /// came back (`rnbd.md` §5.2).
    fn after_path_change(&mut self, session: &str, was_any: bool) {
        let now_any = self.any_connected(session);
        for device in self.devices.values_mut() {
            if device.session != session {
                continue;
            }
            if was_any && !now_any {
                device.open = false;
            } else if !was_any && now_any && self.exports.contains(&device.mapping_path) {
                device.open = true;
            }
        }
    }

    fn map(&mut self, line: &str) -> io::Result<()> {
        let mut session = None;
        let mut device_path = None;
        let mut access_mode = "rw".to_owned();
        let mut paths = Vec::new();
        for token in line.split_whitespace() {
            let (key, value) = token.split_once('=').ok_or_else(|| errno(libc::EINVAL))?;
            match key {
                "sessname" => session = Some(value.to_owned()),
                "device_path" => device_path = Some(value.to_owned()),
                "access_mode" => access_mode = value.to_owned(),
                "dest_port" | "nr_poll_queues" => {}
                "path" => paths.push(PathSpec::parse(value).ok_or_else(|| errno(libc::EINVAL))?),
                _ => return Err(errno(libc::EINVAL)),
            }
        }
        let (Some(session), Some(device_path)) = (session, device_path) else {
            return Err(errno(libc::EINVAL));
        };
        if paths.len() > 6 {
            return Err(errno(libc::EINVAL));
        }
        if self.device_for(&session, &device_path).is_some() {
            return Err(errno(libc::EEXIST));
        }
        let created = !self.sessions.contains_key(&session);
        if created {
            if paths.is_empty() {
                return Err(errno(libc::ENXIO));
            }
            // rtrs_clt_open: every path must establish, or the open fails.
            if let Some(bad) = paths.iter().find(|p| !self.reachable(p.target)) {
                let _ = bad;
                return Err(errno(libc::ECONNRESET));
            }
            let paths = paths
                .iter()
                .map(|p| FakePath {
                    source: p.source.unwrap_or_else(|| default_source(p.target)),
                    target: p.target,
                    state: FakePathState::Connected,
                })
                .collect();
            self.sessions.insert(session.clone(), FakeSession { paths });
        } else if !self.sessions[&session].any_connected() {
            return Err(errno(libc::ECONNABORTED));
        }
        if !self.exports.contains(&device_path) {
            if created {
                self.sessions.remove(&session);
            }
            return Err(errno(libc::ENOENT));
        }
        let index = (0..).find(|n| !self.devices.contains_key(n)).unwrap_or(0);
        self.devices.insert(
            index,
            FakeDevice {
                session,
                mapping_path: device_path,
                access_mode,
                open: true,
                open_count: 0,
                holders: Vec::new(),
            },
        );
        Ok(())
    }

    fn unmap(&mut self, device: &str, mode: &str) -> io::Result<()> {
        let index = Self::index(device).ok_or_else(not_found)?;
        let d = self.devices.get(&index).ok_or_else(not_found)?;
        match mode {
            "normal" if d.open_count > 0 => return Err(errno(libc::EBUSY)),
            "normal" | "force" => {}
            _ => return Err(errno(libc::EINVAL)),
        }
        let session = d.session.clone();
        self.devices.remove(&index);
        self.mounts
            .retain(|(source, _)| source != &format!("/dev/{device}"));
        if !self.devices.values().any(|d| d.session == session) {
            self.sessions.remove(&session);
        }
        Ok(())
    }

    fn remap(&mut self, device: &str) -> io::Result<()> {
        let d = self.device(device).ok_or_else(not_found)?;
        if d.open {
            return Err(errno(libc::EALREADY));
        }
        let connected = self
            .sessions
            .get(&d.session)
            .is_some_and(FakeSession::any_connected);
        if !connected {
            return Err(errno(libc::ECONNABORTED));
        }
        if !self.exports.contains(&d.mapping_path) {
            return Err(errno(libc::ENOENT));
        }
        if let Some(d) = self.device_mut(device) {
            d.open = true;
        }
        Ok(())
    }

    fn add_path(&mut self, session: &str, value: &str) -> io::Result<()> {
        let spec = PathSpec::parse(value.trim()).ok_or_else(|| errno(libc::EINVAL))?;
        let reachable = self.reachable(spec.target);
        let was_any = self.any_connected(session);
        let s = self.sessions.get_mut(session).ok_or_else(not_found)?;
        let source = spec.source.unwrap_or_else(|| default_source(spec.target));
        if s.paths
            .iter()
            .any(|p| p.target == spec.target && p.source == source)
        {
            return Err(errno(libc::EEXIST));
        }
        if !reachable {
            return Err(errno(libc::ECONNRESET));
        }
        s.paths.push(FakePath {
            source,
            target: spec.target,
            state: FakePathState::Connected,
        });
        self.after_path_change(session, was_any);
        Ok(())
    }

    fn path_control(&mut self, session: &str, directory: &str, control: &str) -> io::Result<()> {
        let reachable_targets: Vec<Address> = self
            .sessions
            .get(session)
            .map(|s| {
                s.paths
                    .iter()
                    .map(|p| p.target)
                    .filter(|t| self.reachable(*t))
                    .collect()
            })
            .unwrap_or_default();
        let was_any = self.any_connected(session);
        let s = self.sessions.get_mut(session).ok_or_else(not_found)?;
        let position = s
            .paths
            .iter()
            .position(|p| p.directory() == directory)
            .ok_or_else(not_found)?;
        match control {
            "reconnect" => {
                let path = &mut s.paths[position];
                if reachable_targets.contains(&path.target) {
                    path.state = FakePathState::Connected;
                    self.after_path_change(session, was_any);
                    Ok(())
                } else {
                    path.state = FakePathState::Reconnecting;
                    Err(errno(libc::ENOTCONN))
                }
            }
            "disconnect" => {
                s.paths[position].state = FakePathState::GivenUp;
                self.after_path_change(session, was_any);
                Ok(())
            }
            "remove_path" => {
                s.paths.remove(position);
                self.after_path_change(session, was_any);
                Ok(())
            }
            _ => Err(not_found()),
        }
    }

    /// Splits `/sys/class/rtrs-client/<s>/paths/<d>/<file>`.
    fn path_file(path: &str) -> Option<(&str, &str, &str)> {
        let rest = path.strip_prefix(RTRS_CLIENT)?.strip_prefix('/')?;
        let mut parts = rest.split('/');
        let (session, paths, directory, file) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        (paths == "paths" && parts.next().is_none()).then_some((session, directory, file))
    }

    /// Splits `/sys/block/<device>/rnbd/<file>`.
    fn device_file(path: &str) -> Option<(&str, &str)> {
        let rest = path.strip_prefix(SYS_BLOCK)?.strip_prefix('/')?;
        let (device, file) = rest.split_once("/rnbd/")?;
        Some((device, file))
    }
}

impl Sysfs for FakeKernel {
    fn read(&self, path: &str) -> io::Result<String> {
        if path == PROC_MOUNTS {
            let mut text = String::from("/dev/vda / ext4 rw 0 0\n");
            for (source, mount_point) in &self.mounts {
                text.push_str(&format!("{source} {mount_point} ext4 rw,relatime 0 0\n"));
            }
            return Ok(text);
        }
        if let Some((device, file)) = Self::device_file(path) {
            let d = self.device(device).ok_or_else(not_found)?;
            return Ok(match file {
                "state" => format!("{}\n", if d.open { "open" } else { "closed" }),
                "session" => format!("{}\n", d.session),
                "mapping_path" => format!("{}\n", d.mapping_path),
                "access_mode" => format!("{}\n", d.access_mode),
                _ => return Err(not_found()),
            });
        }
        if let Some((session, directory, file)) = Self::path_file(path) {
            let s = self.sessions.get(session).ok_or_else(not_found)?;
            let p = s
                .paths
                .iter()
                .find(|p| p.directory() == directory)
                .ok_or_else(not_found)?;
            return match file {
                "state" => Ok(if p.state == FakePathState::Connected {
                    "connected\n".into()
                } else {
                    "disconnected\n".into()
                }),
                _ => Err(not_found()),
            };
        }
        Err(not_found())
    }

    fn write(&mut self, path: &str, value: &str) -> io::Result<()> {
        self.writes.push((path.to_owned(), value.to_owned()));
        if path == format!("{RNBD_CTL}/map_device") {
            if !self.rnbd_loaded {
                return Err(not_found());
            }
            return self.map(value);
        }
        if let Some((device, file)) = Self::device_file(path) {
            return match file {
                "unmap_device" => self.unmap(device, value.trim()),
                "remap_device" if value.trim() == "1" => self.remap(device),
                "remap_device" => Err(errno(libc::EINVAL)),
                _ => Err(not_found()),
            };
        }
        if let Some((session, directory, file)) = Self::path_file(path) {
            return self.path_control(session, directory, file);
        }
        if let Some(session) = path
            .strip_prefix(RTRS_CLIENT)
            .and_then(|rest| rest.strip_prefix('/'))
            .and_then(|rest| rest.strip_suffix("/add_path"))
        {
            return self.add_path(session, value);
        }
        Err(not_found())
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = if dir == SYS_BLOCK {
            let mut names = vec!["vda".to_owned()];
            names.extend(self.device_names());
            names
        } else if dir == RTRS_CLIENT {
            self.session_names()
        } else if dir == DEV_BRICK {
            self.links.keys().cloned().collect()
        } else if let Some(rest) = dir
            .strip_prefix(SYS_BLOCK)
            .and_then(|r| r.strip_prefix('/'))
        {
            match rest.split_once('/') {
                None => {
                    self.device(rest).ok_or_else(not_found)?;
                    vec!["holders".into(), "rnbd".into(), "size".into()]
                }
                Some((device, "holders")) => {
                    self.device(device).ok_or_else(not_found)?.holders.clone()
                }
                Some(_) => return Err(not_found()),
            }
        } else if let Some(session) = dir
            .strip_prefix(RTRS_CLIENT)
            .and_then(|r| r.strip_prefix('/'))
            .and_then(|r| r.strip_suffix("/paths"))
        {
            let s = self.sessions.get(session).ok_or_else(not_found)?;
            s.paths.iter().map(FakePath::directory).collect()
        } else {
            return Err(not_found());
        };
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &str) -> bool {
        if path == RNBD_CTL {
            return self.rnbd_loaded;
        }
        self.read(path).is_ok() || self.list(path).is_ok()
    }

    fn read_link(&self, path: &str) -> io::Result<String> {
        let name = path
            .strip_prefix(DEV_BRICK)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(not_found)?;
        self.links.get(name).cloned().ok_or_else(not_found)
    }

    fn symlink(&mut self, target: &str, link: &str) -> io::Result<()> {
        let name = link
            .strip_prefix(DEV_BRICK)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| errno(libc::EACCES))?;
        self.writes.push((link.to_owned(), format!("-> {target}")));
        self.links.insert(name.to_owned(), target.to_owned());
        Ok(())
    }

    fn remove(&mut self, path: &str) -> io::Result<()> {
        let name = path
            .strip_prefix(DEV_BRICK)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| errno(libc::EACCES))?;
        self.writes.push((path.to_owned(), "removed".to_owned()));
        self.links.remove(name).map(|_| ()).ok_or_else(not_found)
    }

    fn load_module(&mut self, name: &str) -> io::Result<()> {
        self.writes.push(("modprobe".to_owned(), name.to_owned()));
        if name == RNBD_MODULE {
            self.rnbd_loaded = true;
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "modprobe: module {name} not found"
            )))
        }
    }
}
