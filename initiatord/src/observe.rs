//! What the kernel shows: rnbd devices, rtrs sessions and paths, links.
//!
//! [`observe`] reads everything the reconciler needs in one pass through
//! [`Sysfs`]. A file that vanishes while being read (a device unmapped
//! under our feet) makes that entry missing, never an error: the next pass
//! sees the settled state.

use std::collections::BTreeMap;
use std::io;

use crate::config::{AccessMode, Address};
use crate::sysfs::{Sysfs, DEV_BRICK, PROC_MOUNTS, RNBD_CTL, RTRS_CLIENT, SYS_BLOCK};

/// The `state` of an rnbd device (`rnbd.md` §5.1).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DeviceState {
    /// Being set up.
    Init,
    /// Mapped; IO flows.
    Open,
    /// The session lost its last path, or the target could not reopen the
    /// volume; IO fails with EIO until it is open again.
    Closed,
    /// Being unmapped.
    Unmapped,
    /// A word this daemon does not know.
    Unknown,
}

impl DeviceState {
    fn parse(text: &str) -> Self {
        match text {
            "init" => Self::Init,
            "open" => Self::Open,
            "closed" => Self::Closed,
            "unmapped" => Self::Unmapped,
            _ => Self::Unknown,
        }
    }
}

/// One `/sys/block/rnbdN` device.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Device {
    /// The block device name, `rnbdN`.
    pub name: String,
    /// `rnbd/session`.
    pub session: String,
    /// `rnbd/mapping_path`: the `device_path` it was mapped with.
    pub mapping_path: String,
    /// `rnbd/state`.
    pub state: DeviceState,
    /// `rnbd/access_mode`, if readable and known.
    pub access_mode: Option<AccessMode>,
    /// Devices stacked on it (`holders/`: dm, md, ...), including those of
    /// its partitions.
    pub holders: Vec<String>,
    /// Mount points of it or its partitions (from `/proc/mounts`).
    pub mounts: Vec<String>,
}

impl Device {
    /// Why the device is in use, if it visibly is (holders or mounts).
    /// The kernel refuses a `normal` unmap of any open device anyway.
    pub fn in_use(&self) -> Option<String> {
        if let Some(mount) = self.mounts.first() {
            return Some(format!("mounted at {mount}"));
        }
        self.holders
            .first()
            .map(|holder| format!("held by {holder}"))
    }
}

/// One path of an rtrs session (`/sys/class/rtrs-client/<s>/paths/<src@dst>`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SessionPath {
    /// The directory name, `src@dst`.
    pub directory: String,
    /// The bound source address, parsed from the name.
    pub source: Option<Address>,
    /// The target address, parsed from the name.
    pub target: Option<Address>,
    /// `state` is `connected`.
    pub connected: bool,
}

/// One rtrs client session.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Session {
    /// Its paths, sorted by directory name.
    pub paths: Vec<SessionPath>,
}

impl Session {
    /// Whether any path is connected.
    pub fn any_connected(&self) -> bool {
        self.paths.iter().any(|p| p.connected)
    }
}

/// Everything observed in one pass.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Observed {
    /// The rnbd client is loaded (its `ctl` directory exists).
    pub rnbd_loaded: bool,
    /// rnbd devices, sorted by name.
    pub devices: Vec<Device>,
    /// rtrs client sessions by name.
    pub sessions: BTreeMap<String, Session>,
    /// `/dev/brick/<name>` -> the link's target as stored.
    pub links: BTreeMap<String, String>,
}

impl Observed {
    /// The device mapping `device_path` in `session`.
    pub fn device_for(&self, session: &str, device_path: &str) -> Option<&Device> {
        self.devices
            .iter()
            .find(|d| d.session == session && d.mapping_path == device_path)
    }

    /// The device called `name` (`rnbd0`).
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }
}

/// The block device a `/dev/brick` link names: the last component of its
/// target (`../rnbd0` and `/dev/rnbd0` both name `rnbd0`).
pub fn link_device(target: &str) -> &str {
    target.rsplit('/').next().unwrap_or(target)
}

fn read_trimmed(sysfs: &dyn Sysfs, path: &str) -> Option<String> {
    sysfs.read(path).ok().map(|text| text.trim().to_owned())
}

/// A directory's names; a missing directory is empty.
fn list_or_empty(sysfs: &dyn Sysfs, dir: &str) -> io::Result<Vec<String>> {
    match sysfs.list(dir) {
        Ok(names) => Ok(names),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Reads the current state.
///
/// # Errors
///
/// A directory that exists could not be listed, or `/proc/mounts` exists
/// but cannot be read (the daemon must not guess that nothing is mounted).
pub fn observe(sysfs: &dyn Sysfs) -> io::Result<Observed> {
    let mounts = match sysfs.read(PROC_MOUNTS) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let mut devices = Vec::new();
    for name in list_or_empty(sysfs, SYS_BLOCK)? {
        if !name.starts_with("rnbd") {
            continue;
        }
        let base = format!("{SYS_BLOCK}/{name}");
        let (Some(session), Some(mapping_path), Some(state)) = (
            read_trimmed(sysfs, &format!("{base}/rnbd/session")),
            read_trimmed(sysfs, &format!("{base}/rnbd/mapping_path")),
            read_trimmed(sysfs, &format!("{base}/rnbd/state")),
        ) else {
            continue; // vanished mid-read
        };
        let access_mode = read_trimmed(sysfs, &format!("{base}/rnbd/access_mode"))
            .and_then(|mode| AccessMode::parse(&mode));
        let mut holders = list_or_empty(sysfs, &format!("{base}/holders"))?;
        // Partitions (rnbd0p1) are subdirectories with their own holders.
        for entry in list_or_empty(sysfs, &base)? {
            if entry.starts_with(&name) && entry != name {
                holders.extend(list_or_empty(sysfs, &format!("{base}/{entry}/holders"))?);
            }
        }
        let device_mounts = mounts_of(&mounts, &name);
        devices.push(Device {
            name,
            session,
            mapping_path,
            state: DeviceState::parse(&state),
            access_mode,
            holders,
            mounts: device_mounts,
        });
    }
    let mut sessions = BTreeMap::new();
    for session in list_or_empty(sysfs, RTRS_CLIENT)? {
        let paths_dir = format!("{RTRS_CLIENT}/{session}/paths");
        let mut paths = Vec::new();
        for directory in list_or_empty(sysfs, &paths_dir)? {
            let Some(state) = read_trimmed(sysfs, &format!("{paths_dir}/{directory}/state")) else {
                continue;
            };
            let (source, target) = match directory.split_once('@') {
                Some((source, target)) => (Address::parse(source), Address::parse(target)),
                None => (None, Address::parse(&directory)),
            };
            paths.push(SessionPath {
                directory,
                source,
                target,
                connected: state == "connected",
            });
        }
        sessions.insert(session, Session { paths });
    }
    let mut links = BTreeMap::new();
    for name in list_or_empty(sysfs, DEV_BRICK)? {
        if let Ok(target) = sysfs.read_link(&format!("{DEV_BRICK}/{name}")) {
            links.insert(name, target);
        }
    }
    // A mount through the stable name shows the link path as its source.
    for (name, target) in &links {
        let device = link_device(target);
        if let Some(device) = devices.iter_mut().find(|d| d.name == device) {
            device.mounts.extend(mounts_of_link(&mounts, name));
        }
    }
    Ok(Observed {
        rnbd_loaded: sysfs.exists(RNBD_CTL),
        devices,
        sessions,
        links,
    })
}

/// Mount points whose source is `/dev/<device>` or one of its partitions
/// (`/dev/rnbd0p1`).
fn mounts_of(mounts: &str, device: &str) -> Vec<String> {
    let own = format!("/dev/{device}");
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let source = fields.next()?;
            let mount_point = fields.next()?;
            let is_partition = source.strip_prefix(&own).is_some_and(|rest| {
                rest.starts_with('p') && rest[1..].bytes().all(|b| b.is_ascii_digit())
            });
            (source == own || is_partition).then(|| mount_point.to_owned())
        })
        .collect()
}

/// Mount points whose source is the link `/dev/brick/<name>`.
fn mounts_of_link(mounts: &str, name: &str) -> Vec<String> {
    let own = format!("{DEV_BRICK}/{name}");
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let source = fields.next()?;
            let mount_point = fields.next()?;
            (source == own).then(|| mount_point.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_mounts_of() {
        let mounts = "/dev/vda / ext4 rw 0 0\n/dev/rnbd1 /mnt/a ext4 rw 0 0\n\
                      /dev/rnbd10 /mnt/b xfs rw 0 0\n/dev/rnbd1p2 /mnt/c ext4 rw 0 0\n\
                      /dev/brick/db /mnt/d ext4 rw 0 0\n";
        assert_eq!(mounts_of(mounts, "rnbd1"), ["/mnt/a", "/mnt/c"]);
        assert_eq!(mounts_of(mounts, "rnbd10"), ["/mnt/b"]);
        assert!(mounts_of(mounts, "rnbd2").is_empty());
        assert_eq!(mounts_of_link(mounts, "db"), ["/mnt/d"]);
    }

    #[test]
    fn test_link_device() {
        assert_eq!(link_device("../rnbd0"), "rnbd0");
        assert_eq!(link_device("/dev/rnbd3"), "rnbd3");
        assert_eq!(link_device("rnbd4"), "rnbd4");
    }
}
