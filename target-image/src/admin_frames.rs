//! The admin endpoint's frames (`admin_tcp`): which received frames are
//! its, and the device smoltcp runs on — two rings of preallocated frame
//! slots between the image's loop and smoltcp.

use alloc::vec;
use alloc::vec::Vec;

use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::time::Instant;

/// Frames held in each direction between the loop and smoltcp.
pub const FRAME_SLOTS: usize = 16;
/// Bytes of an Ethernet header.
pub(crate) const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const IP_PROTOCOL_TCP: u8 = 6;

/// Whether a received frame is for the endpoint at `ip` (an ARP packet
/// whose target is `ip`, or an IPv4 TCP segment to it), and whether it is
/// the endpoint's alone (the TCP segment: the engine never sees it).
pub(crate) fn classify(frame: &[u8], ip: [u8; 4]) -> (bool, bool) {
    if frame.len() < ETH_HEADER {
        return (false, false);
    }
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let payload = &frame[ETH_HEADER..];
    match ethertype {
        // ARP for IPv4 over Ethernet: the target protocol address.
        ETHERTYPE_ARP => (payload.get(24..28) == Some(&ip[..]), false),
        ETHERTYPE_IPV4 => {
            let tcp =
                payload.get(9) == Some(&IP_PROTOCOL_TCP) && payload.get(16..20) == Some(&ip[..]);
            (tcp, tcp)
        }
        _ => (false, false),
    }
}

/// Whether `frame` is an ARP reply (the engine answers ARP requests).
pub(crate) fn is_arp_reply(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&ETHERTYPE_ARP.to_be_bytes()[..])
        && frame.get(ETH_HEADER + 6..ETH_HEADER + 8) == Some(&[0, 2][..])
}

/// A ring of frame slots, each `slot` bytes.
pub(crate) struct Ring {
    data: Vec<u8>,
    lens: Vec<usize>,
    slot: usize,
    head: usize,
    pub(crate) count: usize,
}

impl Ring {
    pub(crate) fn new(slots: usize, slot: usize) -> Self {
        Self {
            data: vec![0; slots * slot],
            lens: vec![0; slots],
            slot,
            head: 0,
            count: 0,
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.count == self.lens.len()
    }

    /// The free slot after the last frame, as `len` bytes (`None`: full or
    /// too long).
    pub(crate) fn back(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.is_full() || len > self.slot {
            return None;
        }
        let index = (self.head + self.count) % self.lens.len();
        self.lens[index] = len;
        let start = index * self.slot;
        Some(&mut self.data[start..start + len])
    }

    /// Commits the slot [`back`](Self::back) gave.
    pub(crate) fn push_back(&mut self) {
        self.count += 1;
    }

    pub(crate) fn front(&self) -> Option<&[u8]> {
        if self.count == 0 {
            return None;
        }
        let start = self.head * self.slot;
        Some(&self.data[start..start + self.lens[self.head]])
    }

    pub(crate) fn pop_front(&mut self) {
        if self.count > 0 {
            self.head = (self.head + 1) % self.lens.len();
            self.count -= 1;
        }
    }
}

/// smoltcp's device: frames the loop gave ([`AdminTcp::receive`]) in,
/// frames for the loop to send out.
pub(crate) struct Frames {
    pub(crate) rx: Ring,
    pub(crate) tx: Ring,
    pub(crate) frame_bytes: usize,
}

pub(crate) struct Rx<'a>(&'a mut Ring);
pub(crate) struct Tx<'a>(&'a mut Ring);

impl RxToken for Rx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let result = f(self.0.front().unwrap_or_default());
        self.0.pop_front();
        result
    }
}

impl TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        // `transmit` only hands out a token with a free slot, and smoltcp
        // never asks for more than the capabilities' MTU (a slot).
        match self.0.back(len) {
            Some(buf) => {
                let result = f(buf);
                self.0.push_back();
                result
            }
            None => f(&mut [0u8; ETH_HEADER + 1500][..len.min(ETH_HEADER + 1500)]),
        }
    }
}

impl Device for Frames {
    type RxToken<'a> = Rx<'a>;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _: Instant) -> Option<(Rx<'_>, Tx<'_>)> {
        if self.rx.count == 0 || self.tx.is_full() {
            return None;
        }
        Some((Rx(&mut self.rx), Tx(&mut self.tx)))
    }

    fn transmit(&mut self, _: Instant) -> Option<Tx<'_>> {
        (!self.tx.is_full()).then_some(Tx(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.frame_bytes;
        caps.max_burst_size = Some(FRAME_SLOTS);
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: [u8; 4] = [10, 0, 2, 15];

    /// An Ethernet frame of `ethertype` with `payload`.
    fn frame(ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0xff; 12];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// An IPv4 header of `protocol` to `dst`.
    fn ipv4(protocol: u8, dst: [u8; 4]) -> Vec<u8> {
        let mut h = vec![
            0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, protocol, 0, 0, 10, 0, 2, 2,
        ];
        h.extend_from_slice(&dst);
        h.extend_from_slice(&[0; 20]);
        h
    }

    /// An ARP packet (`op` 1 request, 2 reply) whose target is `target`.
    fn arp(op: u8, target: [u8; 4]) -> Vec<u8> {
        let mut a = vec![0, 1, 8, 0, 6, 4, 0, op];
        a.extend_from_slice(&[0x52, 0x55, 10, 0, 2, 2, 10, 0, 2, 2]);
        a.extend_from_slice(&[0; 6]);
        a.extend_from_slice(&target);
        a
    }

    #[test]
    fn tcp_to_the_admin_address_is_the_endpoints_alone_arp_is_shared() {
        assert_eq!(
            classify(&frame(0x0800, &ipv4(6, ADMIN)), ADMIN),
            (true, true)
        );
        // RoCEv2 (UDP), ICMP and TCP to another address stay the engine's.
        assert_eq!(
            classify(&frame(0x0800, &ipv4(17, ADMIN)), ADMIN),
            (false, false)
        );
        assert_eq!(
            classify(&frame(0x0800, &ipv4(1, ADMIN)), ADMIN),
            (false, false)
        );
        assert_eq!(
            classify(&frame(0x0800, &ipv4(6, [10, 0, 2, 16])), ADMIN),
            (false, false)
        );
        assert_eq!(
            classify(&frame(0x0806, &arp(1, ADMIN)), ADMIN),
            (true, false)
        );
        assert_eq!(
            classify(&frame(0x0806, &arp(2, ADMIN)), ADMIN),
            (true, false)
        );
        assert_eq!(
            classify(&frame(0x0806, &arp(1, [10, 0, 2, 3])), ADMIN),
            (false, false)
        );
        // Short or truncated frames are nobody's here.
        assert_eq!(classify(&[0; 13], ADMIN), (false, false));
        assert_eq!(
            classify(&frame(0x0800, &[0x45, 0, 0]), ADMIN),
            (false, false)
        );
        assert_eq!(
            classify(&frame(0x0806, &arp(1, ADMIN)[..20]), ADMIN),
            (false, false)
        );
    }

    #[test]
    fn only_arp_replies_are_held_back() {
        assert!(is_arp_reply(&frame(0x0806, &arp(2, ADMIN))));
        assert!(!is_arp_reply(&frame(0x0806, &arp(1, ADMIN))));
        assert!(!is_arp_reply(&frame(0x0800, &ipv4(6, ADMIN))));
        assert!(!is_arp_reply(&[0; 10]));
    }

    #[test]
    fn rings_hold_their_slots_and_refuse_more() {
        let mut ring = Ring::new(2, 64);
        assert!(ring.back(65).is_none(), "a frame longer than a slot");
        for n in 1..=2u8 {
            ring.back(usize::from(n)).unwrap().fill(n);
            ring.push_back();
        }
        assert!(ring.is_full() && ring.back(1).is_none());
        assert_eq!(ring.front(), Some(&[1u8][..]));
        ring.pop_front();
        ring.back(3).unwrap().fill(3);
        ring.push_back();
        assert_eq!(ring.front(), Some(&[2u8, 2][..]));
        ring.pop_front();
        assert_eq!(ring.front(), Some(&[3u8, 3, 3][..]));
        ring.pop_front();
        assert_eq!(ring.front(), None);
    }
}
