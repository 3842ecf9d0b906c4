//! The ADMIN section (format version 4): the hosted target's admin
//! endpoint (HTTP: `/metrics`, `/volumes/NAME/extents`) and the networks
//! allowed to reach it.

use core::fmt;
use core::net::{Ipv4Addr, SocketAddrV4};

use super::{section, Manifest, ReadError};
use crate::types::Ipv4Cidr;

/// The first format version with the ADMIN section.
pub const ADMIN_VERSION: u16 = 4;
/// The ADMIN record length: address, port, source count, then
/// [`MAX_ADMIN_SOURCES`] sources of 8 bytes.
pub const ADMIN_RECORD_LEN: u16 = 8 + 8 * MAX_ADMIN_SOURCES as u16;
/// Most source networks one admin endpoint allows.
pub const MAX_ADMIN_SOURCES: usize = 8;

/// A checked admin endpoint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Admin {
    /// Where the endpoint listens (TCP).
    pub address: SocketAddrV4,
    sources: [Ipv4Cidr; MAX_ADMIN_SOURCES],
    source_count: usize,
}

impl Admin {
    /// An endpoint on `address` allowing `sources` (at most
    /// [`MAX_ADMIN_SOURCES`], at least one; `None` otherwise).
    pub fn new(address: SocketAddrV4, sources: &[Ipv4Cidr]) -> Option<Self> {
        if sources.is_empty() || sources.len() > MAX_ADMIN_SOURCES {
            return None;
        }
        let mut all = [Ipv4Cidr {
            address: Ipv4Addr::UNSPECIFIED,
            prefix: 0,
        }; MAX_ADMIN_SOURCES];
        all[..sources.len()].copy_from_slice(sources);
        Some(Self {
            address,
            sources: all,
            source_count: sources.len(),
        })
    }

    /// The networks allowed to connect.
    pub fn sources(&self) -> &[Ipv4Cidr] {
        &self.sources[..self.source_count]
    }

    /// Whether a connection from `peer` is allowed.
    pub fn allows(&self, peer: Ipv4Addr) -> bool {
        self.sources().iter().any(|s| s.contains(peer))
    }
}

/// `127.0.0.1:9100 from 127.0.0.1/32, 10.0.0.0/8`, for the boot log.
impl fmt::Display for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} from ", self.address)?;
        for (i, source) in self.sources().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{source}")?;
        }
        Ok(())
    }
}

/// The ADMIN record of `admin` (the writer's, std).
#[cfg(feature = "std")]
pub(super) fn encode(admin: &Admin) -> [u8; ADMIN_RECORD_LEN as usize] {
    let mut r = [0u8; ADMIN_RECORD_LEN as usize];
    r[0..4].copy_from_slice(&admin.address.ip().octets());
    r[4..6].copy_from_slice(&admin.address.port().to_le_bytes());
    r[6] = admin.source_count as u8;
    for (i, source) in admin.sources().iter().enumerate() {
        let at = 8 + 8 * i;
        r[at..at + 4].copy_from_slice(&source.address.octets());
        r[at + 4] = source.prefix;
    }
    r
}

impl Manifest<'_> {
    fn decode_admin(&self) -> Result<Option<Admin>, ReadError> {
        if self.admin.count == 0 {
            return Ok(None);
        }
        let r = self.record(self.admin, 0);
        let bad = ReadError::BadAdmin;
        let ip = Ipv4Addr::from(r.array::<4>(0));
        let port = r.u16(4);
        if port == 0 {
            return Err(bad("port 0 is not a listen port"));
        }
        let count = usize::from(r.u8(6));
        if count == 0 || count > MAX_ADMIN_SOURCES {
            return Err(bad("source count is not 1..=8"));
        }
        if r.u8(7) != 0 {
            return Err(ReadError::ReservedNotZero("admin bytes"));
        }
        let mut sources = [Ipv4Cidr {
            address: Ipv4Addr::UNSPECIFIED,
            prefix: 0,
        }; MAX_ADMIN_SOURCES];
        for (i, source) in sources.iter_mut().enumerate() {
            let at = 8 + 8 * i;
            let address = Ipv4Addr::from(r.array::<4>(at));
            let prefix = r.u8(at + 4);
            if r.array::<3>(at + 5) != [0; 3] {
                return Err(ReadError::ReservedNotZero("admin source bytes"));
            }
            if i >= count {
                if address != Ipv4Addr::UNSPECIFIED || prefix != 0 {
                    return Err(bad("bytes past the last source are not zero"));
                }
                continue;
            }
            if prefix > 32 {
                return Err(bad("a source prefix is over 32"));
            }
            *source = Ipv4Cidr { address, prefix };
        }
        Ok(Some(Admin {
            address: SocketAddrV4::new(ip, port),
            sources,
            source_count: count,
        }))
    }

    /// At most one admin record, and a valid one.
    pub(super) fn check_admin(&self) -> Result<(), ReadError> {
        Self::count_in(self.admin, section::ADMIN, 0, 1)?;
        self.decode_admin().map(|_| ())
    }

    /// The admin endpoint, if the manifest names one (always `None`
    /// before format version 4).
    pub fn admin(&self) -> Option<Admin> {
        self.decode_admin().ok().flatten()
    }
}
