//! ACPI, only as far as PCI needs it: the RSDP, the RSDT/XSDT and MCFG.
//!
//! ACPI 6.3 §5.2.5 (RSDP), §5.2.7/§5.2.8 (RSDT/XSDT), and the PCI Firmware
//! Specification 3.2 §4.1.2 (MCFG: one entry per ECAM window, base address,
//! segment, start and end bus). The RSDP is where the loader says (PVH
//! `rsdp_paddr`, which the image's UEFI loader fills from the firmware's
//! configuration table), or found by the legacy scan of the BIOS area
//! 0xe0000-0xfffff on 16-byte boundaries (SeaBIOS puts it there; QEMU's
//! own PVH loader passes no address). Every table's signature, length and
//! checksum is checked; a table that fails is skipped, never trusted, and
//! the caller falls back to the legacy PCI ports.

use core::fmt;

use super::pvh::PhysRead;

/// One ECAM window from MCFG.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct EcamWindow {
    /// Physical base address (of bus 0 of the segment, even when
    /// `start_bus` is above 0).
    pub base: u64,
    /// PCI segment group.
    pub segment: u16,
    /// First bus decoded.
    pub start_bus: u8,
    /// Last bus decoded.
    pub end_bus: u8,
}

impl EcamWindow {
    /// The physical address of `start_bus`'s configuration space.
    pub fn start(&self) -> u64 {
        self.base + (u64::from(self.start_bus) << 20)
    }

    /// Bytes from [`start`](Self::start) to the end of `end_bus`.
    pub fn len(&self) -> u64 {
        (u64::from(self.end_bus.saturating_sub(self.start_bus)) + 1) << 20
    }

    /// Never empty (an entry with `end_bus < start_bus` is refused).
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl fmt::Display for EcamWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "segment {} buses {:02x}-{:02x} at {:#x}",
            self.segment,
            self.start_bus,
            self.end_bus,
            self.start()
        )
    }
}

/// What the ACPI walk found (or why it stopped).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mcfg {
    /// The first window of segment 0.
    Found {
        /// Where the RSDP was.
        rsdp: u64,
        /// The window.
        window: EcamWindow,
    },
    /// No valid RSDP.
    NoRsdp,
    /// An RSDP, but no valid MCFG with a segment 0 window (a machine
    /// without ECAM, QEMU's `pc`).
    NoMcfg {
        /// Where the RSDP was.
        rsdp: u64,
    },
}

/// Most tables looked at in the RSDT/XSDT.
const MAX_TABLES: usize = 64;

fn sum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |sum, byte| sum.wrapping_add(*byte))
}

fn read<const N: usize>(memory: &impl PhysRead, address: u64) -> Option<[u8; N]> {
    let mut bytes = [0u8; N];
    memory.read(address, &mut bytes).ok()?;
    Some(bytes)
}

/// The RSDP at `address` if it is one: signature, ACPI 1.0 checksum and,
/// for revision 2 and up, the extended checksum. Returns (RSDT, XSDT).
fn rsdp_at(memory: &impl PhysRead, address: u64) -> Option<(u32, u64)> {
    let bytes: [u8; 36] = read(memory, address)?;
    if &bytes[..8] != b"RSD PTR " || sum(&bytes[..20]) != 0 {
        return None;
    }
    let rsdt = u32::from_le_bytes(bytes[16..20].try_into().ok()?);
    let xsdt = if bytes[15] >= 2 {
        let length = u32::from_le_bytes(bytes[20..24].try_into().ok()?);
        if length < 36 || sum(&bytes) != 0 {
            return None;
        }
        u64::from_le_bytes(bytes[24..32].try_into().ok()?)
    } else {
        0
    };
    Some((rsdt, xsdt))
}

/// Finds the RSDP: at `hint` if non-zero, else by the legacy scan.
pub fn find_rsdp(memory: &impl PhysRead, hint: u64) -> Option<u64> {
    if hint != 0 {
        return rsdp_at(memory, hint).map(|_| hint);
    }
    (0xe_0000u64..0x10_0000)
        .step_by(16)
        .find(|&address| rsdp_at(memory, address).is_some())
}

/// The table at `address` if its header is sane and its checksum right:
/// (signature, length).
fn table_at(memory: &impl PhysRead, address: u64) -> Option<([u8; 4], u32)> {
    let header: [u8; 36] = read(memory, address)?;
    let length = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if !(36..=1 << 20).contains(&length) {
        return None;
    }
    let mut total = 0u8;
    let mut at = address;
    let end = address + u64::from(length);
    let mut chunk = [0u8; 64];
    while at < end {
        let n = usize::try_from((end - at).min(64)).ok()?;
        memory.read(at, &mut chunk[..n]).ok()?;
        total = total.wrapping_add(sum(&chunk[..n]));
        at += n as u64;
    }
    (total == 0).then(|| (header[..4].try_into().unwrap_or([0; 4]), length))
}

/// The first segment-0 window of the MCFG at `address` (length `length`).
fn mcfg_window(memory: &impl PhysRead, address: u64, length: u32) -> Option<EcamWindow> {
    // 36-byte header, 8 reserved bytes, then 16-byte entries.
    let mut at = address + 44;
    while at + 16 <= address + u64::from(length) {
        let entry: [u8; 16] = read(memory, at)?;
        let window = EcamWindow {
            base: u64::from_le_bytes(entry[..8].try_into().ok()?),
            segment: u16::from_le_bytes([entry[8], entry[9]]),
            start_bus: entry[10],
            end_bus: entry[11],
        };
        if window.segment == 0
            && window.base != 0
            && window.base % (1 << 20) == 0
            && window.start_bus <= window.end_bus
        {
            return Some(window);
        }
        at += 16;
    }
    None
}

/// Walks RSDP -> XSDT (or RSDT) -> MCFG; `rsdp_hint` is the loader's RSDP
/// address (0: scan).
pub fn find_mcfg(memory: &impl PhysRead, rsdp_hint: u64) -> Mcfg {
    let Some(rsdp) = find_rsdp(memory, rsdp_hint) else {
        return Mcfg::NoRsdp;
    };
    let Some((rsdt, xsdt)) = rsdp_at(memory, rsdp) else {
        return Mcfg::NoRsdp;
    };
    // The XSDT (64-bit entries) wins when there is a valid one.
    let root = [(xsdt, 8u64, *b"XSDT"), (u64::from(rsdt), 4, *b"RSDT")]
        .into_iter()
        .filter(|(address, _, _)| *address != 0)
        .find_map(|(address, width, signature)| {
            let (found, length) = table_at(memory, address)?;
            (found == signature).then_some((address, length, width))
        });
    let Some((root, length, width)) = root else {
        return Mcfg::NoMcfg { rsdp };
    };
    let entries = (u64::from(length) - 36) / width;
    for index in 0..entries.min(MAX_TABLES as u64) {
        let at = root + 36 + index * width;
        let table = if width == 8 {
            read::<8>(memory, at).map(u64::from_le_bytes)
        } else {
            read::<4>(memory, at).map(|b| u64::from(u32::from_le_bytes(b)))
        };
        let Some(table) = table else { continue };
        if let Some((signature, length)) = table_at(memory, table) {
            if &signature == b"MCFG" {
                if let Some(window) = mcfg_window(memory, table, length) {
                    return Mcfg::Found { rsdp, window };
                }
            }
        }
    }
    Mcfg::NoMcfg { rsdp }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::boot::pvh::OutOfRange;
    use std::string::ToString;
    use std::vec::Vec;

    /// Sparse memory: (address, bytes) pieces, zeros elsewhere below 1 MiB.
    struct Memory(Vec<(u64, Vec<u8>)>);

    impl PhysRead for Memory {
        fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), OutOfRange> {
            if address + buffer.len() as u64 > 1 << 32 {
                return Err(OutOfRange {
                    address,
                    len: buffer.len(),
                });
            }
            buffer.fill(0);
            for (start, bytes) in &self.0 {
                for (i, byte) in buffer.iter_mut().enumerate() {
                    let at = address + i as u64;
                    if at >= *start && at < start + bytes.len() as u64 {
                        *byte = bytes[(at - start) as usize];
                    }
                }
            }
            Ok(())
        }
    }

    fn fix(bytes: &mut [u8], checksum_at: usize, range: core::ops::Range<usize>) {
        bytes[checksum_at] = 0;
        bytes[checksum_at] = 0u8.wrapping_sub(sum(&bytes[range]));
    }

    fn table(signature: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(signature);
        bytes.extend_from_slice(&((36 + body.len()) as u32).to_le_bytes());
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(b"BRICK BRICKTBL");
        bytes.resize(36, 0);
        bytes.extend_from_slice(body);
        let len = bytes.len();
        fix(&mut bytes, 9, 0..len);
        bytes
    }

    fn rsdp(revision: u8, rsdt: u32, xsdt: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"RSD PTR ");
        bytes.push(0);
        bytes.extend_from_slice(b"BRICK ");
        bytes.push(revision);
        bytes.extend_from_slice(&rsdt.to_le_bytes());
        bytes.extend_from_slice(&36u32.to_le_bytes());
        bytes.extend_from_slice(&xsdt.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        fix(&mut bytes, 8, 0..20);
        fix(&mut bytes, 32, 0..36);
        bytes
    }

    fn mcfg() -> Vec<u8> {
        let mut body = Vec::from([0u8; 8]);
        // A segment 1 window first (skipped), then segment 0's.
        body.extend_from_slice(&0xc000_0000u64.to_le_bytes());
        body.extend_from_slice(&[1, 0, 0, 0xff, 0, 0, 0, 0]);
        body.extend_from_slice(&0xb000_0000u64.to_le_bytes());
        body.extend_from_slice(&[0, 0, 0, 0xff, 0, 0, 0, 0]);
        table(b"MCFG", &body)
    }

    const WINDOW: EcamWindow = EcamWindow {
        base: 0xb000_0000,
        segment: 0,
        start_bus: 0,
        end_bus: 0xff,
    };

    #[test]
    fn the_xsdt_leads_to_mcfg_by_hint_or_by_scan() {
        let facp = table(b"FACP", &[0; 16]);
        let mut xsdt_body = Vec::new();
        xsdt_body.extend_from_slice(&0x7fe0_1000u64.to_le_bytes());
        xsdt_body.extend_from_slice(&0x7fe0_2000u64.to_le_bytes());
        let memory = Memory(Vec::from([
            (0xf_5a40, rsdp(2, 0, 0x7fe0_0000)),
            (0x7fe0_0000, table(b"XSDT", &xsdt_body)),
            (0x7fe0_1000, facp),
            (0x7fe0_2000, mcfg()),
        ]));
        let found = Mcfg::Found {
            rsdp: 0xf_5a40,
            window: WINDOW,
        };
        assert_eq!(find_mcfg(&memory, 0xf_5a40), found);
        assert_eq!(find_mcfg(&memory, 0), found, "by the legacy scan");
        assert_eq!(WINDOW.len(), 256 << 20);
        assert_eq!(WINDOW.to_string(), "segment 0 buses 00-ff at 0xb0000000");
    }

    #[test]
    fn an_acpi_1_rsdt_works_and_bad_checksums_are_skipped() {
        let mut rsdt_body = Vec::new();
        rsdt_body.extend_from_slice(&0x7fe0_2000u32.to_le_bytes());
        let mut bad_mcfg = mcfg();
        bad_mcfg[40] ^= 1;
        let good = Memory(Vec::from([
            (0xe_0010, rsdp(0, 0x7fe0_0000, 0)),
            (0x7fe0_0000, table(b"RSDT", &rsdt_body)),
            (0x7fe0_2000, mcfg()),
        ]));
        assert!(matches!(
            find_mcfg(&good, 0),
            Mcfg::Found { window: WINDOW, .. }
        ));
        let bad = Memory(Vec::from([
            (0xe_0010, rsdp(0, 0x7fe0_0000, 0)),
            (0x7fe0_0000, table(b"RSDT", &rsdt_body)),
            (0x7fe0_2000, bad_mcfg),
        ]));
        assert_eq!(find_mcfg(&bad, 0), Mcfg::NoMcfg { rsdp: 0xe_0010 });
        let mut broken = rsdp(0, 0x7fe0_0000, 0);
        broken[9] ^= 1;
        assert_eq!(
            find_mcfg(&Memory(Vec::from([(0xe_0010, broken)])), 0),
            Mcfg::NoRsdp
        );
    }
}
