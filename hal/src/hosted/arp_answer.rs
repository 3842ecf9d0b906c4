//! [`ArpAnswerer`]: Brick answers ARP for an address on a host
//! interface itself, twice, as its own stack does.
//!
//! A Linux client's first `rdma_resolve_ip()` sends its ARP request and
//! only then queues itself to wait for the neighbour update; a reply that
//! is processed in between wakes nobody, and the map waits for the next
//! neighbour update or the 30 s resolve timeout. The software HCA answers
//! a first resolution twice (`roce/src/arp.rs`): a broadcast reply at once,
//! which makes the client's entry STALE, and a unicast reply 50 ms later,
//! which makes it REACHABLE — two state changes, so the queued resolution
//! is woken by the second if it missed the first. When Brick serves through
//! the host's RDMA device (`brick-target --link ibv:`), the kernel would
//! answer with one unicast reply, and nothing sent after it changes the
//! client's entry again (same address, already REACHABLE): measured, 5 of
//! 10 first maps hung. So Brick takes the answer over: it sets the
//! interface's `arp_ignore` to 8 (the kernel does not reply) while it runs
//! and answers on an `AF_PACKET` socket as its own stack does; the old
//! value comes back when the answerer is dropped (a value of 8 found at
//! start is taken for one a killed brick-target left, and 0 comes back).
//! Needs `CAP_NET_ADMIN` and `CAP_NET_RAW` (root); without them the
//! caller serves with the kernel's answer.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// How long after the broadcast reply the unicast one goes out (as the
/// software HCA's `confirm_delay`).
pub const CONFIRM_DELAY_NS: u64 = 50_000_000;
/// Unicast replies waiting at once (more requesters at once get the
/// broadcast reply only).
const PENDING: usize = 16;
/// `arp_ignore` 8: the kernel replies to no ARP request on the interface.
const IGNORE_ALL: &str = "8";
/// An ARP packet for IPv4 over Ethernet.
const ARP_LEN: usize = 28;
const ETH_P_ARP: u16 = 0x0806;

/// Answers ARP for one address on a host interface (see the module docs).
pub struct ArpAnswerer {
    socket: OwnedFd,
    /// `/proc/sys/net/ipv4/conf/IF/arp_ignore` and the value to restore.
    arp_ignore: (String, String),
    ifindex: i32,
    mac: [u8; 6],
    ip: Ipv4Addr,
    /// (when, requester MAC, requester IP).
    pending: heapless::Vec<(u64, [u8; 6], [u8; 4]), PENDING>,
}

impl ArpAnswerer {
    /// Takes the ARP answers for `ip` over on the interface that holds it.
    ///
    /// # Errors
    /// No interface holds `ip` (`NotFound`), the socket could not be made
    /// (`PermissionDenied` without `CAP_NET_RAW`) or `arp_ignore` could not
    /// be set; the kernel keeps answering then.
    pub fn open(ip: Ipv4Addr) -> io::Result<Self> {
        let (ifindex, mac, name) = interface_of(ip)?;
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
        let path = format!("/proc/sys/net/ipv4/conf/{name}/arp_ignore");
        let found = std::fs::read_to_string(&path)?.trim().to_string();
        let restore = if found == IGNORE_ALL {
            "0".into()
        } else {
            found
        };
        std::fs::write(&path, IGNORE_ALL)?;
        Ok(Self {
            socket,
            arp_ignore: (path, restore),
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

    /// When the next unicast reply is due, if one waits.
    pub fn poll_at(&self) -> Option<u64> {
        self.pending.iter().map(|&(due, _, _)| due).min()
    }

    /// Reads the requests that arrived, answers each for our address with
    /// a broadcast reply at once and a unicast one [`CONFIRM_DELAY_NS`]
    /// later, and sends the unicast replies that are due. Returns whether
    /// it did anything.
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
                self.send(mac, ip, [0xff; 6]);
                let known = self.pending.iter().any(|&(_, m, i)| m == mac && i == ip);
                if !known {
                    let _ = self.pending.push((now + CONFIRM_DELAY_NS, mac, ip));
                }
            }
        }
        while let Some(at) = self.pending.iter().position(|&(due, _, _)| due <= now) {
            let (_, mac, ip) = self.pending.swap_remove(at);
            self.send(mac, ip, mac);
            busy = true;
        }
        busy
    }

    /// Sends "our IP is at our MAC" to `to_mac`/`to_ip`, in an Ethernet
    /// frame to `dest` (broadcast or the requester).
    fn send(&self, to_mac: [u8; 6], to_ip: [u8; 4], dest: [u8; 6]) {
        let reply = reply(self.mac, self.ip.octets(), to_mac, to_ip);
        let address = link_address(self.ifindex, dest);
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
    }
}

impl Drop for ArpAnswerer {
    fn drop(&mut self) {
        // The kernel answers again.
        let _ = std::fs::write(&self.arp_ignore.0, &self.arp_ignore.1);
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

/// The index, MAC and name of the interface holding `ip` (getifaddrs).
fn interface_of(ip: Ipv4Addr) -> io::Result<(i32, [u8; 6], String)> {
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
        .map(|(n, index, mac)| (index, mac, n.to_string_lossy().into_owned()))
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
