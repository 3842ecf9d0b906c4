//! Spec-named integers of the IB transport: PSN, QPN, MSN, keys, GID, MTU.
//!
//! 24-bit quantities (`Psn`, `Qpn`, `Msn`) are newtypes that keep the 24-bit
//! invariant, with the `new` / `try_new` / `new_truncate` constructor set. `Psn`
//! compares in the 24-bit wrapping window rxe uses (roce-v2.md §2.2), so protocol
//! code never does raw `u32` arithmetic on sequence numbers.
//!
//! `Pkey` and `Qkey` are plain `pub` tuple structs: they have no invariant beyond
//! their width. `Rkey` and `Lkey` are re-exported from `verbs`, so the wire layer and
//! the fabric seam share one definition.

use core::fmt;
use core::net::{Ipv4Addr, Ipv6Addr};

/// A value did not fit the 24 bits of a PSN, QPN or MSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueTooLarge;

impl fmt::Display for ValueTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("value does not fit in 24 bits")
    }
}

impl core::error::Error for ValueTooLarge {}

const U24_MASK: u32 = 0x00ff_ffff;

macro_rules! u24_newtype {
    ($(#[$attr:meta])* $name:ident, $display:literal) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(u32);

        impl $name {
            /// The largest value, `0xFF_FFFF`.
            pub const MAX: Self = Self(U24_MASK);

            /// Creates the value.
            ///
            /// # Panics
            /// If `value` does not fit in 24 bits (a programming error; use
            /// [`Self::try_new`] or [`Self::new_truncate`] for peer-supplied numbers).
            pub const fn new(value: u32) -> Self {
                match Self::try_new(value) {
                    Ok(v) => v,
                    Err(_) => panic!("value does not fit in 24 bits"),
                }
            }

            /// Creates the value, or fails if it does not fit in 24 bits.
            ///
            /// # Errors
            /// [`ValueTooLarge`] if `value > 0xFF_FFFF`.
            pub const fn try_new(value: u32) -> Result<Self, ValueTooLarge> {
                if value > U24_MASK {
                    Err(ValueTooLarge)
                } else {
                    Ok(Self(value))
                }
            }

            /// Creates the value from the low 24 bits of `value`.
            pub const fn new_truncate(value: u32) -> Self {
                Self(value & U24_MASK)
            }

            /// The value as a `u32` (always `<= 0xFF_FFFF`).
            pub const fn value(self) -> u32 {
                self.0
            }

            /// `self + n`, wrapping at 2^24.
            #[must_use]
            pub const fn wrapping_add(self, n: u32) -> Self {
                Self::new_truncate(self.0.wrapping_add(n))
            }

            /// `self - n`, wrapping at 2^24.
            #[must_use]
            pub const fn wrapping_sub(self, n: u32) -> Self {
                Self::new_truncate(self.0.wrapping_sub(n))
            }
        }

        impl From<$name> for u32 {
            fn from(value: $name) -> u32 {
                value.0
            }
        }

        impl TryFrom<u32> for $name {
            type Error = ValueTooLarge;
            fn try_from(value: u32) -> Result<Self, ValueTooLarge> {
                Self::try_new(value)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $display, self.0)
            }
        }

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
}

u24_newtype!(
    /// Packet Sequence Number (BTH bytes 9-11), 24 bits, wrapping.
    ///
    /// Ordering is defined only within half the sequence space, as rxe's
    /// `psn_compare()` does (roce-v2.md §2.2): `a` is before `b` iff the 24-bit
    /// difference `b - a` is in `1..2^23`. Two PSNs exactly 2^23 apart are neither
    /// before nor after each other. `Psn` deliberately does not implement `Ord`.
    Psn,
    "{}"
);

impl Psn {
    /// Half the PSN space: the width of the "before"/"after" windows.
    pub const HALF: u32 = 1 << 23;

    /// `true` if `self` comes strictly before `other` in the wrapping window.
    pub const fn is_before(self, other: Psn) -> bool {
        let d = self.distance_to(other);
        d != 0 && d < Self::HALF
    }

    /// `true` if `self` comes strictly after `other` in the wrapping window.
    pub const fn is_after(self, other: Psn) -> bool {
        other.is_before(self)
    }

    /// Forward distance from `self` to `other`: how many increments take `self` to
    /// `other`, in `0..2^24`.
    pub const fn distance_to(self, other: Psn) -> u32 {
        other.0.wrapping_sub(self.0) & U24_MASK
    }

    /// Signed distance from `self` to `other` in `-2^23..2^23`: positive if `other`
    /// is after `self` (the antipode maps to `-2^23`, as in rxe's `psn_compare()`).
    pub const fn signed_distance_to(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back: sign-extends.
        ((other.0.wrapping_sub(self.0) << 8) as i32) >> 8
    }
}

u24_newtype!(
    /// Queue Pair Number (BTH DestQP, DETH SrcQP, CM QPN fields), 24 bits.
    Qpn,
    "{:#08x}"
);

impl Qpn {
    /// QP0, the subnet management QP (not used on RoCE).
    pub const SMI: Qpn = Qpn(0);
    /// QP1, the General Services Interface QP that carries the CM MADs.
    pub const GSI: Qpn = Qpn(1);
    /// The multicast QPN `0xFF_FFFF`.
    pub const MULTICAST: Qpn = Qpn(U24_MASK);
}

u24_newtype!(
    /// Message Sequence Number (AETH bytes 1-3): messages completed at the responder.
    Msn,
    "{}"
);

/// Partition key (BTH bytes 2-3, CM REQ Partition Key).
///
/// Bit 15 is the membership bit (1 = full member).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pkey(pub u16);

impl Pkey {
    /// The default partition, full membership: what rxe sends.
    pub const DEFAULT: Pkey = Pkey(0xffff);

    /// The rxe acceptance rule (`pkey_match()` against 0xFFFF, roce-v2.md §1.4):
    /// the low 15 bits are all ones, i.e. 0xFFFF or 0x7FFF.
    pub const fn is_default_partition(self) -> bool {
        self.0 & 0x7fff == 0x7fff
    }
}

impl fmt::Display for Pkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

/// Queue key (DETH bytes 0-3; CM REQ/REP Local Q_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Qkey(pub u32);

impl Qkey {
    /// The well-known Q_Key of QP1 (`IB_QP1_QKEY`), required on every MAD.
    pub const GSI: Qkey = Qkey(0x8001_0000);
}

impl fmt::Display for Qkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// Remote key (RETH, AtomicETH, IETH) and local key: one definition, in `verbs`
/// (24-bit index + 8-bit variant), shared by the wire layer and the fabric seam.
pub use verbs::{Lkey, Rkey};

/// 128-bit Global Identifier. On RoCEv2 it is the IPv4-mapped IPv6 address
/// `::ffff:a.b.c.d` of the port (roce-v2.md §1.11); the CM REQ path carries GIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The RoCEv2 GID of an IPv4 address (`rdma_ip2gid()`).
    pub const fn from_ipv4(addr: Ipv4Addr) -> Gid {
        let o = addr.octets();
        Gid([
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, o[0], o[1], o[2], o[3],
        ])
    }

    /// The IPv4 address of an IPv4-mapped GID, or `None` for any other GID.
    pub fn to_ipv4(self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `::ffff:a.b.c.d` for IPv4-mapped GIDs, RFC 5952 text otherwise.
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

/// IB path MTU, as the 4-bit enumeration carried in the CM REQ
/// ("Path Packet Payload MTU", roce-v2.md §1.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mtu {
    /// 256 bytes (enum 1).
    Mtu256,
    /// 512 bytes (enum 2).
    Mtu512,
    /// 1024 bytes (enum 3): what a 1500-byte Ethernet gives.
    Mtu1024,
    /// 2048 bytes (enum 4).
    Mtu2048,
    /// 4096 bytes (enum 5).
    Mtu4096,
    /// A reserved encoding (0 or 6..15).
    Unknown(u8),
}

impl Mtu {
    /// Payload bytes per packet, or `None` for a reserved encoding.
    pub const fn bytes(self) -> Option<usize> {
        match self {
            Mtu::Mtu256 => Some(256),
            Mtu::Mtu512 => Some(512),
            Mtu::Mtu1024 => Some(1024),
            Mtu::Mtu2048 => Some(2048),
            Mtu::Mtu4096 => Some(4096),
            Mtu::Unknown(_) => None,
        }
    }

    /// The largest IB MTU whose packets fit an Ethernet MTU, as RDMA CM computes it
    /// (`iboe_get_mtu()`: `netdev_mtu - 96`, rounded down, roce-v2.md §1.9).
    /// `None` if not even 256 bytes fit.
    pub const fn for_ethernet_mtu(netdev_mtu: usize) -> Option<Mtu> {
        match netdev_mtu.saturating_sub(96) {
            4096.. => Some(Mtu::Mtu4096),
            2048.. => Some(Mtu::Mtu2048),
            1024.. => Some(Mtu::Mtu1024),
            512.. => Some(Mtu::Mtu512),
            256.. => Some(Mtu::Mtu256),
            _ => None,
        }
    }
}

impl From<u8> for Mtu {
    fn from(value: u8) -> Mtu {
        match value {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            other => Mtu::Unknown(other),
        }
    }
}

impl From<Mtu> for u8 {
    fn from(value: Mtu) -> u8 {
        match value {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
            Mtu::Unknown(other) => other,
        }
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bytes() {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "reserved({})", u8::from(*self)),
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_u24_constructors() {
        assert_eq!(Psn::new(0xff_ffff).value(), 0xff_ffff);
        assert_eq!(Psn::try_new(0x100_0000), Err(ValueTooLarge));
        assert_eq!(Qpn::new_truncate(0x1234_5678), Qpn::new(0x34_5678));
        assert_eq!(Msn::MAX.wrapping_add(1), Msn::new(0));
        assert_eq!(Qpn::new(0x11).to_string(), "0x000011");
        assert_eq!(Psn::new(5535020).to_string(), "5535020");
    }

    #[test]
    #[should_panic]
    fn test_new_panics_on_25_bits() {
        let _ = Qpn::new(0x100_0000);
    }

    #[test]
    fn test_psn_wraps() {
        let last = Psn::MAX;
        let first = last.wrapping_add(1);
        assert_eq!(first, Psn::new(0));
        assert!(last.is_before(first));
        assert!(first.is_after(last));
        assert_eq!(last.distance_to(first), 1);
        assert_eq!(first.signed_distance_to(last), -1);
        assert_eq!(first.wrapping_sub(1), last);
    }

    #[test]
    fn test_psn_antipode() {
        let a = Psn::new(10);
        let b = a.wrapping_add(Psn::HALF);
        assert!(!a.is_before(b) && !b.is_before(a));
        assert_eq!(a.signed_distance_to(b), -(Psn::HALF as i32));
    }

    #[test]
    fn test_gid_ipv4() {
        let gid = Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(gid.to_ipv4(), Some(Ipv4Addr::new(10, 77, 0, 2)));
        assert_eq!(gid.to_string(), "::ffff:10.77.0.2");
        assert_eq!(Gid([0xfe; 16]).to_ipv4(), None);
    }

    #[test]
    fn test_mtu() {
        assert_eq!(Mtu::for_ethernet_mtu(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_ethernet_mtu(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_ethernet_mtu(300), None);
        for v in 0..=15u8 {
            assert_eq!(u8::from(Mtu::from(v)), v);
        }
        assert!(Pkey(0x7fff).is_default_partition() && !Pkey(0x8001).is_default_partition());
    }
}
