//! One RTRS session's RNBD state: its mapped devices and their ids.

use super::*;

/// One mapped device of a session.
#[derive(Debug, Clone)]
pub struct Device {
    pub(super) path: String<{ DEVICE_PATH_LEN - 1 }>,
    pub(super) volume: VolumeInfo,
    pub(super) mode: AccessMode,
    pub(super) in_flight: u32,
}

impl Device {
    /// The `device_path` it was opened with.
    pub fn path(&self) -> &str {
        &self.path
    }
    /// The volume.
    pub const fn volume(&self) -> &VolumeInfo {
        &self.volume
    }
    /// The access mode it was opened with.
    pub const fn mode(&self) -> AccessMode {
        self.mode
    }
    /// IOs submitted and not yet completed.
    pub const fn in_flight(&self) -> u32 {
        self.in_flight
    }
}

/// State of one device id of a session.
#[derive(Debug, Clone, Default)]
pub enum DeviceState {
    /// The id is free.
    #[default]
    Free,
    /// Opened: accepts IO.
    Open(Device),
    /// CLOSE received (or the session ended) while IO was in flight: new IO
    /// gets ENOTCONN, the id stays reserved until `in_flight` reaches 0.
    Draining {
        /// The device.
        device: Device,
        /// The CLOSE to answer when drained (`None` at session end).
        close_tag: Option<u32>,
    },
}

/// One RNBD session: negotiated version, device table, statistics.
#[derive(Debug, Clone)]
pub struct Session {
    pub(super) version: u8,
    pub(super) devices: [DeviceState; MAX_DEVICES_PER_SESSION],
    pub(super) stats: SessionStats,
}

impl Default for Session {
    fn default() -> Self {
        Session::new()
    }
}

impl Session {
    /// A new session: version 0 until SESS_INFO (rnbd.md §2.3), no devices.
    pub fn new() -> Session {
        Session {
            version: 0,
            devices: core::array::from_fn(|_| DeviceState::Free),
            stats: SessionStats::default(),
        }
    }

    /// The negotiated protocol version (0 before SESS_INFO).
    pub const fn version(&self) -> u8 {
        self.version
    }

    /// Statistics.
    pub const fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// The state of `device_id`.
    pub fn device(&self, device_id: u32) -> Option<&DeviceState> {
        self.devices.get(usize::try_from(device_id).ok()?)
    }

    /// Device ids not free (open or draining).
    pub fn devices_in_use(&self) -> usize {
        self.devices
            .iter()
            .filter(|state| !matches!(state, DeviceState::Free))
            .count()
    }

    /// True when no device is open or draining.
    pub fn is_idle(&self) -> bool {
        self.devices_in_use() == 0
    }

    pub(super) fn open_device_mut(&mut self, device_id: u32) -> Option<&mut Device> {
        match self.devices.get_mut(usize::try_from(device_id).ok()?)? {
            DeviceState::Open(device) => Some(device),
            _ => None,
        }
    }

    pub(super) fn find_open_path(&self, path: &str) -> Option<(u32, &Device)> {
        self.devices
            .iter()
            .enumerate()
            .find_map(|(id, state)| match state {
                DeviceState::Open(device) if device.path == path => Some((id as u32, device)),
                _ => None,
            })
    }

    pub(super) fn holds_volume(&self, volume: VolumeId) -> bool {
        self.devices.iter().any(|state| match state {
            DeviceState::Open(device) | DeviceState::Draining { device, .. } => {
                device.volume.id == volume
            }
            DeviceState::Free => false,
        })
    }

    pub(super) fn free_id(&self) -> Option<usize> {
        self.devices
            .iter()
            .position(|state| matches!(state, DeviceState::Free))
    }
}
