//! Which device serves what: disks for volumes, NICs for interfaces, and
//! when to stop trusting the NICs' interrupt lines.
//!
//! The image probes the hardware (PCI functions, serials, MACs) and hands
//! the facts to these functions, which decide with plain logic:
//!
//! * [`choose_device`]: the device a volume's selector names among
//!   candidates (virtio-blk disks or NVMe controllers): by PCI address, or
//!   by serial, which must be on exactly one candidate;
//! * [`claim_nics`]: interface `i` takes the first unclaimed NIC whose
//!   device MAC is the manifest's, else the first unclaimed one in PCI
//!   order;
//! * [`HaltPolicy`]: how long the idle loop may halt, and after how many
//!   unexplained early wake-ups in a row the NICs' lines are deemed stuck
//!   (masked; halts sliced).

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use manifest::types::{PciAddress, VirtioSelector};

/// One device a volume may select.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// Its PCI address (bus, device, function; segment 0).
    pub address: (u8, u8, u8),
    /// Its serial, or `None` if it could not be read.
    pub serial: Option<&'a [u8]>,
}

/// Why a selector names no device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChoiceError {
    /// No candidate is at this PCI address.
    NoDeviceAt(PciAddress),
    /// No candidate has this serial.
    NoSerial(String),
    /// Two candidates (these indexes) have this serial.
    SerialOnTwo(String, usize, usize),
}

impl fmt::Display for ChoiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDeviceAt(address) => write!(f, "nothing at pci {address}"),
            Self::NoSerial(serial) => write!(f, "no device has serial \"{serial}\""),
            Self::SerialOnTwo(serial, _, _) => {
                write!(f, "serial \"{serial}\" is on more than one device")
            }
        }
    }
}

/// The index among `candidates` that `selector` names.
///
/// # Errors
///
/// [`ChoiceError`]: no device at the address, none or two with the serial.
pub fn choose_device(
    selector: VirtioSelector<'_>,
    candidates: &[Candidate<'_>],
) -> Result<usize, ChoiceError> {
    match selector {
        VirtioSelector::Pci(wanted) => candidates
            .iter()
            .position(|candidate| {
                wanted.domain == 0
                    && candidate.address == (wanted.bus, wanted.device, wanted.function)
            })
            .ok_or(ChoiceError::NoDeviceAt(wanted)),
        VirtioSelector::Serial(serial) => {
            let mut matching = candidates
                .iter()
                .enumerate()
                .filter(|(_, candidate)| candidate.serial == Some(serial.as_bytes()));
            match (matching.next(), matching.next()) {
                (Some((index, _)), None) => Ok(index),
                (None, _) => Err(ChoiceError::NoSerial(serial.into())),
                (Some((first, _)), Some((second, _))) => {
                    Err(ChoiceError::SerialOnTwo(serial.into(), first, second))
                }
            }
        }
    }
}

/// For each wanted MAC (interface order), the index of the NIC it gets
/// among `nics` (PCI order; `None`: unusable): the first unclaimed NIC with
/// that device MAC, else the first unclaimed usable one.
///
/// # Errors
///
/// The index of the first interface left without a NIC.
pub fn claim_nics(nics: &[Option<[u8; 6]>], wanted: &[[u8; 6]]) -> Result<Vec<usize>, usize> {
    let mut claimed = alloc::vec![false; nics.len()];
    let mut chosen = Vec::with_capacity(wanted.len());
    for (interface, mac) in wanted.iter().enumerate() {
        let free = |index: &usize| !claimed[*index] && nics[*index].is_some();
        let by_mac = (0..nics.len()).find(|i| free(i) && nics[*i] == Some(*mac));
        let Some(index) = by_mac.or_else(|| (0..nics.len()).find(free)) else {
            return Err(interface);
        };
        claimed[index] = true;
        chosen.push(index);
    }
    Ok(chosen)
}

/// What the idle loop does after a halt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterWake {
    /// Go on as before.
    Keep,
    /// The lines look stuck: mask them and halt in slices from now on.
    MaskLines,
}

/// The image's halting policy (see `serve.rs`'s module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HaltPolicy {
    /// Whether a frame ends a halt (every NIC has a usable line).
    pub on_frame: bool,
    /// Early wake-ups in a row that no NIC raised.
    pub unexplained: u32,
    /// The longest halt while frames wake the CPU.
    pub max_halt_ns: u64,
    /// The longest halt when they cannot.
    pub slice_ns: u64,
    /// Unexplained early wake-ups in a row before the lines are deemed
    /// stuck.
    pub stuck_after: u32,
}

impl HaltPolicy {
    /// The longest halt from now.
    pub fn longest_halt(&self) -> u64 {
        if self.on_frame {
            self.max_halt_ns
        } else {
            self.slice_ns
        }
    }

    /// After a halt planned for `planned_ns` that lasted `slept_ns`:
    /// `raised` if a NIC said its line woke the CPU. A wake-up before half
    /// the wait that no NIC raised is the stale tick of an earlier one-shot
    /// (once), or a line held by something else (every time).
    pub fn after_wake(&mut self, raised: bool, slept_ns: u64, planned_ns: u64) -> AfterWake {
        let early = slept_ns < planned_ns / 2;
        if raised || !early || !self.on_frame {
            self.unexplained = 0;
            return AfterWake::Keep;
        }
        self.unexplained += 1;
        if self.unexplained < self.stuck_after {
            return AfterWake::Keep;
        }
        self.on_frame = false;
        AfterWake::MaskLines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    const CANDIDATES: [Candidate<'static>; 3] = [
        Candidate {
            address: (0, 0x10, 0),
            serial: Some(b"brick-a"),
        },
        Candidate {
            address: (0, 0x11, 0),
            serial: Some(b"brick-b"),
        },
        Candidate {
            address: (1, 0, 0),
            serial: Some(b"brick-b"),
        },
    ];

    #[test]
    fn devices_are_chosen_by_address_or_unique_serial() {
        let pci = |text| VirtioSelector::Pci(PciAddress::parse(text).unwrap());
        assert_eq!(choose_device(pci("00:11.0"), &CANDIDATES), Ok(1));
        assert_eq!(choose_device(pci("01:00.0"), &CANDIDATES), Ok(2));
        assert_eq!(
            choose_device(pci("0001:00:10.0"), &CANDIDATES),
            Err(ChoiceError::NoDeviceAt(
                PciAddress::parse("0001:00:10.0").unwrap()
            ))
        );
        assert_eq!(
            choose_device(VirtioSelector::Serial("brick-a"), &CANDIDATES),
            Ok(0)
        );
        assert_eq!(
            choose_device(VirtioSelector::Serial("brick-b"), &CANDIDATES),
            Err(ChoiceError::SerialOnTwo("brick-b".into(), 1, 2))
        );
        let unreadable = [Candidate {
            address: (0, 4, 0),
            serial: None,
        }];
        assert_eq!(
            choose_device(VirtioSelector::Serial("brick-a"), &unreadable)
                .unwrap_err()
                .to_string(),
            "no device has serial \"brick-a\""
        );
    }

    #[test]
    fn nics_go_by_mac_then_pci_order() {
        let a = [0x52, 0x54, 0, 0x77, 0, 1];
        let b = [0x52, 0x54, 0, 0x78, 0, 1];
        let other = [2, 0, 0, 0, 0, 9];
        // Interface 0 wants b's MAC (second NIC), interface 1 takes the
        // first unclaimed one.
        assert_eq!(claim_nics(&[Some(a), Some(b)], &[b, other]), Ok(vec![1, 0]));
        // An unusable NIC is skipped; the third interface has none left.
        assert_eq!(
            claim_nics(&[None, Some(a), Some(b)], &[a, b, other]),
            Err(2)
        );
        assert_eq!(claim_nics(&[Some(other)], &[a]), Ok(vec![0]));
    }

    #[test]
    fn stuck_lines_are_masked_after_enough_unexplained_wakes() {
        let mut policy = HaltPolicy {
            on_frame: true,
            unexplained: 0,
            max_halt_ns: 50_000_000,
            slice_ns: 1_000_000,
            stuck_after: 3,
        };
        assert_eq!(policy.longest_halt(), 50_000_000);
        assert_eq!(policy.after_wake(false, 1000, 50_000_000), AfterWake::Keep);
        // A frame's interrupt or a full sleep resets the count.
        assert_eq!(policy.after_wake(true, 1000, 50_000_000), AfterWake::Keep);
        assert_eq!(
            policy.after_wake(false, 40_000_000, 50_000_000),
            AfterWake::Keep
        );
        assert_eq!(policy.unexplained, 0);
        for _ in 0..2 {
            assert_eq!(policy.after_wake(false, 10, 50_000_000), AfterWake::Keep);
        }
        assert_eq!(
            policy.after_wake(false, 10, 50_000_000),
            AfterWake::MaskLines
        );
        assert!(!policy.on_frame);
        assert_eq!(policy.longest_halt(), 1_000_000);
    }
}
