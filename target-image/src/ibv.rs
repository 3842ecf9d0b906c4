//! The engine on RDMA devices through libibverbs (`verbs-ibv`, hosted
//! only): [`Port`] for [`IbvDevice`] and the device configuration a
//! manifest interface asks for.

use core::fmt;

use manifest::binary::Interface;
use rtrs::server::ServerConfig;
use verbs_ibv::{IbvConfig, IbvDevice, IbvLink};

use crate::engine::Transmit;
use crate::port::Port;
use crate::{arena_bytes, hca_capacity, BuildError};

impl Port for IbvDevice {
    /// The device makes its own progress (the kernel or the HCA); RTRS
    /// polls its completions and events through verbs.
    fn poll_link<T: Transmit + ?Sized>(
        &mut self,
        _now: u64,
        _interface: usize,
        _sink: &mut T,
    ) -> bool {
        false
    }

    /// Completions have no descriptor: the loop polls (see `brick-target`).
    fn poll_at(&self, _now: u64) -> Option<u64> {
        None
    }

    fn can_rekey(&self) -> bool {
        false
    }

    fn write_counters(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rdma device {}: connections {} memory regions {}",
            self.device_name(),
            self.connections(),
            self.registrations()
        )
    }
}

/// What interface `iface` of a manifest with RTRS configuration `config`
/// needs of RDMA device `link`: the same memory and tables the software
/// HCA would get ([`arena_bytes`], [`hca_capacity`]).
///
/// # Errors
/// [`BuildError::Capacity`] as [`hca_capacity`].
pub fn ibv_config(
    config: &ServerConfig,
    iface: &Interface<'_>,
    link: &IbvLink,
) -> Result<IbvConfig, BuildError> {
    let capacity = hca_capacity(config)?;
    Ok(IbvConfig {
        device: link.device.clone(),
        port: link.port,
        address: iface.address.address,
        memory_bytes: arena_bytes(config),
        regions: capacity.regions,
        connections: capacity.qps,
        cq_entries: u32::try_from(capacity.cq_entries).unwrap_or(u32::MAX),
    })
}
