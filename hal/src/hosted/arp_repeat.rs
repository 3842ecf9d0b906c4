//! [`ArpRepeater`]: a second ARP reply for an address the host kernel
//! already answers for.
//!
//! A Linux client's first `rdma_resolve_ip()` sends its ARP request and
//! only then queues itself to wait for the neighbour update; a reply that
//! is processed in between wakes nobody, and the map waits for the next
//! neighbour update or the 30 s resolve timeout (the software HCA answers
//! twice for this reason, `roce/src/arp.rs`). When Brick serves through the
//! host's RDMA device (`brick-target --link ibv:`), the kernel answers ARP
//! with one unicast reply, which makes the client's entry REACHABLE. A
//! second unicast reply changes nothing there, so wakes nobody; a
//! *broadcast* reply makes the entry STALE (broadcast replies do not assert
//! reachability) — a state change, which wakes the queued resolution — but
//! only once the entry's lock time (1 s) has passed since the first reply,
//! before that the client keeps the first answer unchanged. So this repeats
//! the kernel's answer once, broadcast, [`REPEAT_DELAY_NS`] after the
//! request: a first map that lost the race waits about a second, not 30.
//! Standard ARP: the reply says what the kernel said.
//!
//! It reads ARP requests on the interface holding the address through an
//! `AF_PACKET` datagram socket (needs `CAP_NET_RAW`), non-blocking.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// How long after the request the repeat goes out: past the client's ARP
/// lock time (1 s, Linux `locktime`), so the broadcast reply is applied.
pub const REPEAT_DELAY_NS: u64 = 1_100_000_000;
/// Repeats waiting at once (more requests at once are answered by the
/// kernel alone).
const PENDING: usize = 16;
/// An ARP packet for IPv4 over Ethernet.
const ARP_LEN: usize = 28;
const ETH_P_ARP: u16 = 0x0806;

/// Repeats the kernel's ARP replies for one address (see the module docs).
pub struct ArpRepeater {
    socket: OwnedFd,
    ifindex: i32,
    mac: [u8; 6],
    ip: Ipv4Addr,
    /// (when, requester MAC, requester IP).
    pending: heapless::Vec<(u64, [u8; 6], [u8; 4]), PENDING>,
}

impl ArpRepeater {
    /// Listens for ARP requests for `ip` on the interface that holds it.
    ///
    /// # Errors
    /// No interface holds `ip` (`NotFound`), or the socket could not be
    /// made (`PermissionDenied` without `CAP_NET_RAW`).
    pub fn open(ip: Ipv4Addr) -> io::Result<Self> {
        let (ifindex, mac) = interface_of(ip)?;
        // SAFETY: plain socket(2); the result is checked and owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(ETH_P_ARP.to_be()),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        let address = link_address(ifindex, [0xff; 6]);
        // SAFETY: `address` is a valid sockaddr_ll of the size passed.
        let rc = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                (&raw const address).cast(),
                core::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            socket,
            ifindex,
            mac,
            ip,
            pending: heapless::Vec::new(),
        })
    }

    /// The socket, to wait on while idle.
    pub fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// When the next repeat is due, if one waits.
    pub fn poll_at(&self) -> Option<u64> {
        self.pending.iter().map(|&(due, _, _)| due).min()
    }

    /// Reads the requests that arrived (scheduling a repeat for each new
    /// requester of our address) and sends the repeats that are due.
    /// Returns whether it did anything.
    pub fn poll(&mut self, now: u64) -> bool {
        let mut busy = false;
        let mut packet = [0u8; 64];
        loop {
            // SAFETY: `packet` is writable for its length; no address wanted.
            let n = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    packet.as_mut_ptr().cast(),
                    packet.len(),
                    0,
                )
            };
            let Ok(n) = usize::try_from(n) else {
                break; // EAGAIN (or an error: nothing to read)
            };
            busy = true;
            if let Some((mac, ip)) = request_for(&packet[..n.min(packet.len())], self.ip) {
                let known = self.pending.iter().any(|&(_, m, i)| m == mac && i == ip);
                if !known {
                    let _ = self.pending.push((now + REPEAT_DELAY_NS, mac, ip));
                }
            }
        }
        while let Some(at) = self.pending.iter().position(|&(due, _, _)| due <= now) {
            let (_, mac, ip) = self.pending.swap_remove(at);
            let reply = reply(self.mac, self.ip.octets(), mac, ip);
            let address = link_address(self.ifindex, [0xff; 6]);
            // SAFETY: `reply` and `address` are valid for the sizes passed.
            unsafe {
                libc::sendto(
                    self.socket.as_raw_fd(),
                    reply.as_ptr().cast(),
                    reply.len(),
                    0,
                    (&raw const address).cast(),
                    core::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                );
            }
            busy = true;
        }
        busy
    }
}

/// The requester (MAC, IPv4) of an ARP request for `ip`, if `packet` is one.
fn request_for(packet: &[u8], ip: Ipv4Addr) -> Option<([u8; 6], [u8; 4])> {
    let arp = packet.get(..ARP_LEN)?;
    let ethernet_ipv4 = arp[..6] == [0, 1, 8, 0, 6, 4];
    let request = arp[6..8] == [0, 1];
    if !(ethernet_ipv4 && request && arp[24..28] == ip.octets()) {
        return None;
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&arp[8..14]);
    let mut sender = [0u8; 4];
    sender.copy_from_slice(&arp[14..18]);
    Some((mac, sender))
}

/// An ARP reply: `ip` is at `mac`, to `to_mac`/`to_ip`.
fn reply(mac: [u8; 6], ip: [u8; 4], to_mac: [u8; 6], to_ip: [u8; 4]) -> [u8; ARP_LEN] {
    let mut arp = [0u8; ARP_LEN];
    arp[..8].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
    arp[8..14].copy_from_slice(&mac);
    arp[14..18].copy_from_slice(&ip);
    arp[18..24].copy_from_slice(&to_mac);
    arp[24..28].copy_from_slice(&to_ip);
    arp
}

fn link_address(ifindex: i32, mac: [u8; 6]) -> libc::sockaddr_ll {
    let mut address = libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: ETH_P_ARP.to_be(),
        sll_ifindex: ifindex,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 6,
        sll_addr: [0; 8],
    };
    address.sll_addr[..6].copy_from_slice(&mac);
    address
}

/// The index and MAC of the interface holding `ip` (getifaddrs).
fn interface_of(ip: Ipv4Addr) -> io::Result<(i32, [u8; 6])> {
    let mut list: *mut libc::ifaddrs = core::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&raw mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut name = None;
    let mut links = Vec::new();
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points at a sockaddr of its family.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        // SAFETY: ifa_name is a NUL-terminated interface name.
        let ifname = unsafe { core::ffi::CStr::from_ptr(ifa.ifa_name) }.to_owned();
        if family == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
            if sin.sin_addr.s_addr.to_ne_bytes() == ip.octets() {
                name = Some(ifname);
            }
        } else if family == libc::AF_PACKET {
            // SAFETY: an AF_PACKET address is a sockaddr_ll.
            let sll = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_ll>() };
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&sll.sll_addr[..6]);
            links.push((ifname, sll.sll_ifindex, mac));
        }
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    let name = name.ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("no interface holds {ip}"))
    })?;
    links
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, index, mac)| (index, mac))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("interface {name:?} of {ip} has no link address"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_for_our_address_names_its_sender_and_the_reply_repeats_ours() {
        let ours = Ipv4Addr::new(10, 77, 0, 1);
        let mut request = [0u8; ARP_LEN];
        request[..8].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        request[8..14].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        request[14..18].copy_from_slice(&[10, 77, 0, 2]);
        request[24..28].copy_from_slice(&ours.octets());
        assert_eq!(
            request_for(&request, ours),
            Some(([2, 0, 0, 0, 0, 9], [10, 77, 0, 2]))
        );
        assert_eq!(
            request_for(&request, Ipv4Addr::new(10, 77, 0, 3)),
            None,
            "not ours"
        );
        let mut answer = request;
        answer[7] = 2;
        assert_eq!(request_for(&answer, ours), None, "a reply is no request");
        assert_eq!(request_for(&request[..20], ours), None, "short");
        let out = reply(
            [2, 0, 0, 0, 0, 1],
            ours.octets(),
            [2, 0, 0, 0, 0, 9],
            [10, 77, 0, 2],
        );
        assert_eq!(&out[6..8], &[0, 2]);
        assert_eq!(request_for(&out, Ipv4Addr::new(10, 77, 0, 2)), None);
        assert_eq!(&out[24..28], &[10, 77, 0, 2]);
    }
}
