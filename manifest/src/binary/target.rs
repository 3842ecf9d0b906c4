//! The TARGET, LIMITS and INTERFACES sections: decoding their records
//! (checked once by [`Manifest::parse`]) and the accessors that read them.

use core::net::Ipv4Addr;

use super::{
    error_name, Interface, Manifest, ReadError, Target, TARGET_ALWAYS_INVALIDATE, TARGET_HAS_UUID,
};
#[cfg(doc)]
use crate::types::MAX_INTERFACES;
use crate::types::{bounds, check_name, is_host_address, Ipv4Cidr, Limits, MacAddress};

impl<'a> Manifest<'a> {
    pub(super) fn decode_limits(&self) -> Result<Limits, ReadError> {
        let r = self.record(self.limits, 0);
        if r.u16(10) != 0 {
            return Err(ReadError::ReservedNotZero("limits bytes"));
        }
        let defaults = Limits::default();
        // Format 3 appends the half-open limits and the setup timeout.
        let long = self.limits.record_len >= 28;
        if long && r.u16(26) != 0 {
            return Err(ReadError::ReservedNotZero("limits bytes"));
        }
        Ok(Limits {
            max_sessions: r.u32(0),
            max_paths_per_session: r.u16(4),
            max_connections_per_path: r.u16(6),
            queue_depth: r.u16(8),
            chunk_size: r.u32(12),
            max_half_open: if long {
                r.u32(16)
            } else {
                defaults.max_half_open
            },
            setup_timeout_ms: if long {
                r.u32(20)
            } else {
                defaults.setup_timeout_ms
            },
            max_half_open_per_source: if long {
                r.u16(24)
            } else {
                defaults.max_half_open_per_source
            },
        })
    }

    pub(super) fn decode_target(&self) -> Result<Target<'a>, ReadError> {
        let r = self.record(self.target, 0);
        let name = self.checked_text(r.str_ref(0), "target.name", check_name)?;
        let flags = r.u16(26);
        if flags & !(TARGET_HAS_UUID | TARGET_ALWAYS_INVALIDATE) != 0 {
            return Err(ReadError::ReservedNotZero("target flags"));
        }
        if r.u32(28) != 0 {
            return Err(ReadError::ReservedNotZero("target bytes"));
        }
        if r.u16(24) == 0 {
            return Err(ReadError::BadPort);
        }
        let uuid: [u8; 16] = r.array(8);
        if flags & TARGET_HAS_UUID == 0 && uuid != [0; 16] {
            return Err(ReadError::ReservedNotZero("target uuid (flagged absent)"));
        }
        Ok(Target {
            name,
            uuid: (flags & TARGET_HAS_UUID != 0).then_some(uuid),
            port: r.u16(24),
            always_invalidate: flags & TARGET_ALWAYS_INVALIDATE != 0,
        })
    }

    pub(super) fn decode_interface(&self, index: usize) -> Result<Interface<'a>, ReadError> {
        let r = self.record(self.interfaces, index);
        let name = self.checked_text(r.str_ref(0), "interface name", check_name)?;
        let address = Ipv4Addr::from(r.array::<4>(8));
        let mac = MacAddress(r.array(12));
        let prefix = r.u8(18);
        let mtu = r.u16(20);
        if r.u8(19) != 0 || r.u16(22) != 0 {
            return Err(ReadError::ReservedNotZero("interface bytes"));
        }
        if prefix > 32 {
            return Err(ReadError::BadPrefix(prefix));
        }
        let address = Ipv4Cidr { address, prefix };
        if !mac.is_unicast() {
            return Err(ReadError::BadMac(error_name(name)));
        }
        if !is_host_address(&address) {
            return Err(ReadError::BadAddress(error_name(name)));
        }
        if !bounds::MTU.contains(&mtu) {
            return Err(ReadError::BadMtu {
                interface: error_name(name),
                mtu,
            });
        }
        Ok(Interface {
            name,
            mac,
            address,
            mtu,
        })
    }

    /// The target identity and switches.
    pub fn target(&self) -> Target<'a> {
        // Checked in parse: cannot fail.
        self.decode_target().unwrap_or(Target {
            name: "",
            uuid: None,
            port: 0,
            always_invalidate: true,
        })
    }

    /// The limits (checked against their bounds).
    pub fn limits(&self) -> Limits {
        self.decode_limits().unwrap_or_default()
    }

    /// Number of interfaces (1..=[`MAX_INTERFACES`]).
    pub fn interface_count(&self) -> usize {
        self.interfaces.count
    }

    /// The interfaces, in manifest order.
    pub fn interfaces(&self) -> impl Iterator<Item = Interface<'a>> + '_ {
        (0..self.interfaces.count).filter_map(|i| self.decode_interface(i).ok())
    }
}
