//! ARP for the software HCA: answer who-has, resolve next hops, keep neighbours.
//!
//! roce-v2.md §1.1 and §1.11, checklist A.1: a RoCEv2 server answers ARP requests
//! for its IPv4 address(es) and resolves the client's MAC (a Linux client ARPs for
//! the server in `rdma_resolve_addr()` and refreshes its entry later); RFC 826 for
//! the packet rules. Sans-IO: frames in, frames out, time passed in (`now`, ns).
//!
//! # Driving it (what the HCA does)
//!
//! - Every received frame with EtherType ARP goes to [`Arp::process`]; a returned
//!   frame (a reply) is sent as is. Requests and replies addressed to one of our
//!   addresses teach us the sender's MAC; others only refresh entries we already
//!   have (RFC 826's merge rule), so a LAN's chatter cannot fill the table.
//! - Before sending to an IPv4 next hop: [`Arp::lookup`]. `None` → look at
//!   [`Arp::state`]: [`NeighborState::Unknown`] → [`Arp::request`] (send the frame it
//!   returns), then hold or drop the packet; [`NeighborState::Incomplete`] → a
//!   request is in flight (queue or drop); [`NeighborState::Failed`] → no answer
//!   after every retry: drop (and, for RC, let the transport's retries decide).
//! - The poll loop: `while let Some(frame) = arp.poll(now) { send(frame) }`; sleep
//!   no longer than [`Arp::poll_at`]. `poll` retransmits requests, re-confirms
//!   entries in use once they age past [`Config::reachable_time`] (unicast to the
//!   known MAC, which stays usable meanwhile), forgets unused ones.
//!
//! # Answering a first resolution twice
//!
//! A broadcast request comes from a host that has no entry for us yet. Brick
//! answers it at once with a **broadcast** reply and [`Config::confirm_delay`]
//! later with a **unicast** one (RFC 5227 §2.6 allows broadcast replies). A
//! Linux requester takes the broadcast reply as "stale" and the unicast one as
//! "reachable": two neighbour updates instead of one. That matters because
//! Linux's `rdma_resolve_ip()` sends the request (`dst_fetch_ha` ->
//! `neigh_event_send`) before it queues its resolution, and only a
//! neighbour-update event (`netevent_callback`) wakes a queued resolution: a
//! reply processed in between, as a fast responder's is in a slow (emulated)
//! client, wakes nobody, and the client's first `rdma_resolve_addr()` then
//! waits for the entry to go stale (15-45 s) or for its 30 s timeout. The
//! second reply's update comes after the resolution is queued and wakes it.
//! Unicast requests (a host re-confirming an entry it has) get one unicast
//! reply, as RFC 826 says.
//!
//! The table holds at most `N` neighbours; when full, the least recently confirmed
//! entry is evicted. Frames are built for Ethernet II without padding
//! ([`FRAME_LEN`] bytes, as Linux hands them to the NIC).

use heapless::Vec;

use crate::wire::arp::Operation;
use crate::wire::Ipv4Address;
use crate::wire::{ArpPacket, ArpRepr, EtherType, EthernetAddress, EthernetFrame, EthernetRepr};

/// Length of an ARP frame Brick sends: Ethernet header 14 + ARP 28.
pub const FRAME_LEN: usize = 42;

/// Most IPv4 addresses one [`Arp`] answers for.
pub const MAX_ADDRESSES: usize = 4;

/// An ARP frame to send.
pub type ArpFrame = [u8; FRAME_LEN];

/// Timers and retry counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// How long a learned MAC counts as confirmed, ns (Linux: ~30 s randomised).
    pub reachable_time: u64,
    /// Time between requests for one address, ns.
    pub retransmit_interval: u64,
    /// Requests sent for one resolution (or re-confirmation) before giving up.
    pub max_requests: u8,
    /// How long a failed resolution is remembered, ns: requests are not repeated
    /// and packets to it are dropped until then.
    pub failed_hold: u64,
    /// After a broadcast reply to a broadcast request, when the unicast reply
    /// follows, ns (see the module docs).
    pub confirm_delay: u64,
}

impl Default for Config {
    /// 30 s reachable, 1 s between requests, 3 requests, 3 s failed hold, the
    /// unicast reply 50 ms after the broadcast one.
    fn default() -> Config {
        Config {
            reachable_time: 30_000_000_000,
            retransmit_interval: 1_000_000_000,
            max_requests: 3,
            failed_hold: 3_000_000_000,
            confirm_delay: 50_000_000,
        }
    }
}

/// What the table knows about an IPv4 neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NeighborState {
    /// No entry: call [`Arp::request`].
    Unknown,
    /// A request is out, no answer yet: hold or drop packets for it.
    Incomplete,
    /// The MAC was confirmed within [`Config::reachable_time`].
    Reachable(EthernetAddress),
    /// The MAC is older than that and being re-confirmed; still usable.
    Stale(EthernetAddress),
    /// Every request went unanswered; drop packets until the hold time ends.
    Failed,
}

/// Why [`Arp::add_address`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ArpError {
    /// Already [`MAX_ADDRESSES`] addresses.
    TooManyAddresses,
    /// Not a unicast address (unspecified, broadcast or multicast).
    NotUnicast,
}

impl core::fmt::Display for ArpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ArpError::TooManyAddresses => "too many local addresses",
            ArpError::NotUnicast => "not a unicast IPv4 address",
        })
    }
}

impl core::error::Error for ArpError {}

/// The state of one table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryState {
    /// Resolving: requests are being sent.
    Incomplete,
    /// Confirmed at `confirmed`.
    Reachable,
    /// Past the reachable time and in use: unicast requests are being sent.
    Probing,
    /// Every request went unanswered; forgotten at `deadline`.
    Failed,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    ip: Ipv4Address,
    /// Valid in `Reachable` and `Probing`.
    mac: EthernetAddress,
    state: EntryState,
    /// When the MAC was last confirmed (learning time for eviction).
    confirmed: u64,
    /// Next action: retransmission, re-confirmation or forgetting.
    deadline: u64,
    /// Requests left in `Incomplete` / `Probing`.
    requests_left: u8,
    /// Our address to ask from.
    source_ip: Ipv4Address,
    /// Looked up since the last confirmation (only used entries are re-confirmed).
    used: bool,
    /// A unicast reply to send at this time, from our address `reply_from`
    /// (the second answer to a broadcast request).
    reply_due: Option<u64>,
    /// Our address the pending reply answers for.
    reply_from: Ipv4Address,
}

/// An ARP responder and neighbour table of `N` entries for one interface.
#[derive(Debug)]
pub struct Arp<const N: usize> {
    mac: EthernetAddress,
    addresses: Vec<Ipv4Address, MAX_ADDRESSES>,
    entries: Vec<Entry, N>,
    config: Config,
}

fn is_unicast(ip: Ipv4Address) -> bool {
    !(ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast())
}

impl<const N: usize> Arp<N> {
    /// A table for the interface with MAC `mac`, answering for no address yet.
    pub fn new(mac: EthernetAddress, config: Config) -> Arp<N> {
        Arp {
            mac,
            addresses: Vec::new(),
            entries: Vec::new(),
            config,
        }
    }

    /// Our MAC.
    pub fn mac(&self) -> EthernetAddress {
        self.mac
    }

    /// Answers ARP requests for `ip` from now on.
    ///
    /// # Errors
    /// [`ArpError::NotUnicast`], [`ArpError::TooManyAddresses`].
    pub fn add_address(&mut self, ip: Ipv4Address) -> Result<(), ArpError> {
        if !is_unicast(ip) {
            return Err(ArpError::NotUnicast);
        }
        if self.addresses.contains(&ip) {
            return Ok(());
        }
        self.addresses
            .push(ip)
            .map_err(|_| ArpError::TooManyAddresses)
    }

    /// Whether `ip` is one of ours.
    pub fn is_local(&self, ip: Ipv4Address) -> bool {
        self.addresses.contains(&ip)
    }

    fn find(&self, ip: Ipv4Address) -> Option<usize> {
        self.entries.iter().position(|e| e.ip == ip)
    }

    /// What the table knows about `ip` at `now`.
    pub fn state(&self, now: u64, ip: Ipv4Address) -> NeighborState {
        let Some(entry) = self.find(ip).map(|i| &self.entries[i]) else {
            return NeighborState::Unknown;
        };
        match entry.state {
            EntryState::Incomplete => NeighborState::Incomplete,
            EntryState::Reachable
                if now.saturating_sub(entry.confirmed) < self.config.reachable_time =>
            {
                NeighborState::Reachable(entry.mac)
            }
            EntryState::Reachable | EntryState::Probing => NeighborState::Stale(entry.mac),
            EntryState::Failed if now < entry.deadline => NeighborState::Failed,
            EntryState::Failed => NeighborState::Unknown,
        }
    }

    /// The MAC to send to `ip`, if known (reachable or being re-confirmed). Marks
    /// the entry used, so [`Arp::poll`] re-confirms it when it ages.
    pub fn lookup(&mut self, now: u64, ip: Ipv4Address) -> Option<EthernetAddress> {
        let index = self.find(ip)?;
        match self.state(now, ip) {
            NeighborState::Reachable(mac) | NeighborState::Stale(mac) => {
                self.entries[index].used = true;
                Some(mac)
            }
            _ => None,
        }
    }

    /// Starts resolving `ip` (asking from our address `source_ip`): returns the
    /// broadcast request to send, or `None` if there is nothing to do (known, a
    /// request already out, or failed recently). Retries come from [`Arp::poll`].
    pub fn request(
        &mut self,
        now: u64,
        source_ip: Ipv4Address,
        ip: Ipv4Address,
    ) -> Option<ArpFrame> {
        if !is_unicast(ip) || self.is_local(ip) {
            return None;
        }
        match self.state(now, ip) {
            NeighborState::Unknown => {}
            _ => return None,
        }
        let entry = Entry {
            ip,
            mac: EthernetAddress([0; 6]),
            state: EntryState::Incomplete,
            confirmed: now,
            deadline: now.saturating_add(self.config.retransmit_interval),
            requests_left: self.config.max_requests.saturating_sub(1),
            source_ip,
            used: true,
            reply_due: None,
            reply_from: source_ip,
        };
        self.insert(entry);
        Some(self.request_frame(source_ip, ip, None))
    }

    /// Puts an entry in the table, replacing the one for its address or evicting
    /// the least recently confirmed one when full.
    fn insert(&mut self, entry: Entry) {
        if let Some(index) = self.find(entry.ip) {
            self.entries[index] = entry;
            return;
        }
        if let Err(entry) = self.entries.push(entry) {
            // Full (N > 0 here, or push would not have failed... unless N == 0).
            if let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| (e.state == EntryState::Incomplete, e.confirmed))
                .map(|(i, _)| i)
            {
                self.entries[oldest] = entry;
            }
        }
    }

    fn learn(&mut self, now: u64, ip: Ipv4Address, mac: EthernetAddress, create: bool) {
        let reachable = |source_ip, used| Entry {
            ip,
            mac,
            state: EntryState::Reachable,
            confirmed: now,
            deadline: now.saturating_add(self.config.reachable_time),
            requests_left: 0,
            source_ip,
            used,
            reply_due: None,
            reply_from: source_ip,
        };
        match self.find(ip) {
            Some(index) => {
                let old = self.entries[index];
                self.entries[index] = Entry {
                    reply_due: old.reply_due,
                    reply_from: old.reply_from,
                    ..reachable(old.source_ip, old.used)
                };
            }
            None if create => {
                let source = self.addresses.first().copied().unwrap_or(ip);
                self.insert(reachable(source, false));
            }
            None => {}
        }
    }

    /// Handles a received Ethernet frame carrying ARP. Returns the reply to send
    /// if it is a request for one of our addresses. Malformed frames, frames for
    /// another MAC, non-Ethernet/IPv4 ARP and senders that are not unicast (or
    /// claim our own address) are ignored. Never panics.
    pub fn process(&mut self, now: u64, frame: &[u8]) -> Option<ArpFrame> {
        let eth = EthernetFrame::new_checked(frame).ok()?;
        let eth_repr = EthernetRepr::parse(&eth).ok()?;
        if eth_repr.ethertype != EtherType::Arp {
            return None;
        }
        let packet = ArpPacket::new_checked(eth.payload()).ok()?;
        let arp = ArpRepr::parse(&packet).ok()?;
        self.process_repr(now, &eth_repr, &arp)
    }

    /// [`Arp::process`] for a frame already parsed, e.g. the `Frame::Arp` of
    /// [`crate::wire::Frame::parse`].
    pub fn process_repr(
        &mut self,
        now: u64,
        eth: &EthernetRepr,
        arp: &ArpRepr,
    ) -> Option<ArpFrame> {
        if !(eth.dst_addr == self.mac || eth.dst_addr.is_broadcast()) {
            return None;
        }
        let ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        } = *arp
        else {
            return None;
        };
        if !source_hardware_addr.is_unicast() || self.is_local(source_protocol_addr) {
            return None;
        }
        let for_us = self.is_local(target_protocol_addr);
        if source_protocol_addr.is_unspecified() {
            // An RFC 5227 probe for an address: answer (defend) if it is ours, but
            // learn nothing from it.
            if !for_us || operation != Operation::Request {
                return None;
            }
        } else if !is_unicast(source_protocol_addr) {
            return None;
        } else {
            self.learn(now, source_protocol_addr, source_hardware_addr, for_us);
        }
        if !for_us || operation != Operation::Request {
            return None;
        }
        // A broadcast request: the first resolution of a host that has no
        // entry for us. Broadcast reply now, unicast reply later (module docs).
        let first_resolution =
            eth.dst_addr.is_broadcast() && !source_protocol_addr.is_unspecified();
        if first_resolution {
            if let Some(index) = self.find(source_protocol_addr) {
                let entry = &mut self.entries[index];
                entry.reply_due = Some(now.saturating_add(self.config.confirm_delay));
                entry.reply_from = target_protocol_addr;
            }
        }
        let destination = if first_resolution {
            EthernetAddress::BROADCAST
        } else {
            source_hardware_addr
        };
        Some(self.reply_frame(
            destination,
            target_protocol_addr,
            source_hardware_addr,
            source_protocol_addr,
        ))
    }

    /// A reply for our address `from` to the host `to_mac`/`to_ip`, sent to
    /// the Ethernet address `destination`.
    fn reply_frame(
        &self,
        destination: EthernetAddress,
        from: Ipv4Address,
        to_mac: EthernetAddress,
        to_ip: Ipv4Address,
    ) -> ArpFrame {
        let mut reply = [0u8; FRAME_LEN];
        emit(
            &mut reply,
            EthernetRepr {
                src_addr: self.mac,
                dst_addr: destination,
                ethertype: EtherType::Arp,
            },
            ArpRepr::EthernetIpv4 {
                operation: Operation::Reply,
                source_hardware_addr: self.mac,
                source_protocol_addr: from,
                target_hardware_addr: to_mac,
                target_protocol_addr: to_ip,
            },
        );
        reply
    }

    fn request_frame(
        &self,
        source_ip: Ipv4Address,
        ip: Ipv4Address,
        unicast: Option<EthernetAddress>,
    ) -> ArpFrame {
        let mut frame = [0u8; FRAME_LEN];
        emit(
            &mut frame,
            EthernetRepr {
                src_addr: self.mac,
                dst_addr: unicast.unwrap_or(EthernetAddress::BROADCAST),
                ethertype: EtherType::Arp,
            },
            ArpRepr::EthernetIpv4 {
                operation: Operation::Request,
                source_hardware_addr: self.mac,
                source_protocol_addr: source_ip,
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: ip,
            },
        );
        frame
    }

    /// When [`Arp::poll`] next has work, or `None` with an empty table.
    pub fn poll_at(&self) -> Option<u64> {
        self.entries
            .iter()
            .map(|e| e.reply_due.map_or(e.deadline, |due| due.min(e.deadline)))
            .min()
    }

    /// Whether [`Arp::poll`] at `now` has anything to do (false: it would
    /// return `None` and change nothing). One pass over the table.
    #[inline]
    pub fn is_due(&self, now: u64) -> bool {
        self.entries
            .iter()
            .any(|e| e.deadline <= now || e.reply_due.is_some_and(|due| due <= now))
    }

    /// Runs the timers due at `now` and returns at most one frame to send (call
    /// again until `None`). Bounded: one pass over the table per call.
    pub fn poll(&mut self, now: u64) -> Option<ArpFrame> {
        let config = self.config;
        if let Some(entry) = self
            .entries
            .iter_mut()
            .find(|e| e.reply_due.is_some_and(|due| due <= now))
        {
            entry.reply_due = None;
            let (mac, from, ip) = (entry.mac, entry.reply_from, entry.ip);
            return Some(self.reply_frame(mac, from, mac, ip));
        }
        let mut index = 0;
        while index < self.entries.len() {
            let entry = self.entries[index];
            if entry.deadline > now {
                index += 1;
                continue;
            }
            match entry.state {
                EntryState::Incomplete | EntryState::Probing if entry.requests_left > 0 => {
                    let e = &mut self.entries[index];
                    e.requests_left -= 1;
                    e.deadline = now.saturating_add(config.retransmit_interval);
                    let unicast = (entry.state == EntryState::Probing).then_some(entry.mac);
                    return Some(self.request_frame(entry.source_ip, entry.ip, unicast));
                }
                EntryState::Incomplete | EntryState::Probing => {
                    let e = &mut self.entries[index];
                    e.state = EntryState::Failed;
                    e.deadline = now.saturating_add(config.failed_hold);
                }
                EntryState::Reachable if entry.used => {
                    let e = &mut self.entries[index];
                    e.state = EntryState::Probing;
                    e.used = false;
                    e.requests_left = config.max_requests.saturating_sub(1);
                    e.deadline = now.saturating_add(config.retransmit_interval);
                    return Some(self.request_frame(entry.source_ip, entry.ip, Some(entry.mac)));
                }
                EntryState::Reachable | EntryState::Failed => {
                    self.entries.swap_remove(index);
                    continue;
                }
            }
            index += 1;
        }
        None
    }
}

fn emit(frame: &mut ArpFrame, eth: EthernetRepr, arp: ArpRepr) {
    let mut eth_frame = EthernetFrame::new_unchecked(&mut frame[..]);
    eth.emit(&mut eth_frame);
    arp.emit(&mut ArpPacket::new_unchecked(eth_frame.payload_mut()));
}

#[cfg(test)]
mod test {
    use super::*;

    const OUR_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0, 0x77, 0, 1]);
    const PEER_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0, 0x77, 0, 2]);
    const OUR_IP: Ipv4Address = Ipv4Address::new(10, 77, 0, 1);
    const PEER_IP: Ipv4Address = Ipv4Address::new(10, 77, 0, 2);
    const S: u64 = 1_000_000_000;

    fn arp() -> Arp<2> {
        let mut arp = Arp::new(OUR_MAC, Config::default());
        arp.add_address(OUR_IP).unwrap();
        arp
    }

    fn peer() -> Arp<2> {
        let mut arp = Arp::new(PEER_MAC, Config::default());
        arp.add_address(PEER_IP).unwrap();
        arp
    }

    #[test]
    fn test_request_reply_learn() {
        let (mut server, mut client) = (arp(), peer());
        assert_eq!(client.state(0, OUR_IP), NeighborState::Unknown);
        let request = client.request(0, PEER_IP, OUR_IP).unwrap();
        assert_eq!(client.state(0, OUR_IP), NeighborState::Incomplete);
        assert_eq!(client.request(0, PEER_IP, OUR_IP), None);
        let reply = server.process(0, &request).unwrap();
        // The server learned the client from a request addressed to it.
        assert_eq!(server.lookup(0, PEER_IP), Some(PEER_MAC));
        assert_eq!(client.process(0, &reply), None);
        assert_eq!(client.lookup(0, OUR_IP), Some(OUR_MAC));
        assert_eq!(client.state(0, OUR_IP), NeighborState::Reachable(OUR_MAC));
    }

    /// A broadcast request (a host resolving us for the first time) gets a
    /// broadcast reply at once and a unicast one `confirm_delay` later; a
    /// unicast request (re-confirmation) gets one unicast reply.
    #[test]
    fn test_first_resolution_is_answered_twice() {
        let (mut server, mut client) = (arp(), peer());
        let delay = Config::default().confirm_delay;
        let request = client.request(0, PEER_IP, OUR_IP).unwrap();
        let first = server.process(0, &request).unwrap();
        assert_eq!(
            &first[..6],
            &EthernetAddress::BROADCAST.0,
            "broadcast first"
        );
        assert_eq!(
            &first[32..38],
            &PEER_MAC.0,
            "target hardware address: the requester"
        );
        assert_eq!(&first[38..42], &PEER_IP.octets());
        assert_eq!(server.poll(delay - 1), None);
        assert_eq!(server.poll_at(), Some(delay));
        let second = server.poll(delay).unwrap();
        assert_eq!(&second[..6], &PEER_MAC.0, "unicast second");
        assert_eq!(&second[6..12], &OUR_MAC.0);
        assert_eq!(&second[20..22], &[0, 2], "a reply");
        assert_eq!(&second[22..28], &OUR_MAC.0);
        assert_eq!(&second[28..32], &OUR_IP.octets());
        assert_eq!(&second[32..42], &first[32..42]);
        assert_eq!(server.poll(delay), None, "only once");
        // Both replies teach the requester the same MAC.
        assert_eq!(client.process(0, &first), None);
        assert_eq!(client.state(0, OUR_IP), NeighborState::Reachable(OUR_MAC));
        assert_eq!(client.process(delay, &second), None);
        assert_eq!(
            client.state(delay, OUR_IP),
            NeighborState::Reachable(OUR_MAC)
        );
        // A unicast request (the requester re-confirming) gets one unicast reply.
        let mut probe = request;
        probe[..6].copy_from_slice(&OUR_MAC.0);
        let reply = server.process(2 * delay, &probe).unwrap();
        assert_eq!(&reply[..6], &PEER_MAC.0);
        assert_ne!(server.poll_at(), Some(3 * delay));
        assert_eq!(server.poll(3 * delay), None);
    }

    #[test]
    fn test_retries_then_failed_then_forgotten() {
        let mut client = peer();
        client.request(0, PEER_IP, OUR_IP).unwrap();
        assert_eq!(client.poll(0), None);
        assert!(client.poll(S).is_some());
        assert!(client.poll(2 * S).is_some());
        assert_eq!(client.poll(3 * S), None);
        assert_eq!(client.state(3 * S, OUR_IP), NeighborState::Failed);
        assert_eq!(client.request(3 * S, PEER_IP, OUR_IP), None);
        assert_eq!(client.poll_at(), Some(6 * S));
        assert_eq!(client.poll(6 * S), None);
        assert_eq!(client.state(6 * S, OUR_IP), NeighborState::Unknown);
        assert!(client.request(6 * S, PEER_IP, OUR_IP).is_some());
    }

    #[test]
    fn test_used_entries_are_reconfirmed_unicast() {
        let (mut server, mut client) = (arp(), peer());
        let request = client.request(0, PEER_IP, OUR_IP).unwrap();
        let reply = server.process(0, &request).unwrap();
        client.process(0, &reply);
        // The unicast second answer to the broadcast request.
        let confirm = server.poll(Config::default().confirm_delay).unwrap();
        client.process(Config::default().confirm_delay, &confirm);
        assert_eq!(client.lookup(S, OUR_IP), Some(OUR_MAC));
        let at = client.poll_at().unwrap();
        let probe = client.poll(at).unwrap();
        assert_eq!(&probe[..6], &OUR_MAC.0, "unicast to the known MAC");
        assert_eq!(client.state(at, OUR_IP), NeighborState::Stale(OUR_MAC));
        assert_eq!(client.lookup(at, OUR_IP), Some(OUR_MAC));
        let reply = server.process(at, &probe).unwrap();
        client.process(at, &reply);
        assert_eq!(client.state(at, OUR_IP), NeighborState::Reachable(OUR_MAC));
        // The server never looked its entry up: it is forgotten when it ages.
        let at = server.poll_at().unwrap();
        assert_eq!(server.poll(at), None);
        assert_eq!(server.state(at, PEER_IP), NeighborState::Unknown);
    }

    #[test]
    fn test_not_for_us_only_refreshes() {
        let mut server = arp();
        let mut other = Arp::<2>::new(PEER_MAC, Config::default());
        other.add_address(PEER_IP).unwrap();
        let request = other
            .request(0, PEER_IP, Ipv4Address::new(10, 77, 0, 9))
            .unwrap();
        assert_eq!(server.process(0, &request), None);
        assert_eq!(server.state(0, PEER_IP), NeighborState::Unknown);
        // Garbage and truncation are ignored.
        assert_eq!(server.process(0, &request[..30]), None);
        assert_eq!(server.process(0, &[]), None);
    }

    #[test]
    fn test_probe_for_our_address_is_answered_not_learned() {
        let mut server = arp();
        let mut probe = [0u8; FRAME_LEN];
        emit(
            &mut probe,
            EthernetRepr {
                src_addr: PEER_MAC,
                dst_addr: EthernetAddress::BROADCAST,
                ethertype: EtherType::Arp,
            },
            ArpRepr::EthernetIpv4 {
                operation: Operation::Request,
                source_hardware_addr: PEER_MAC,
                source_protocol_addr: Ipv4Address::UNSPECIFIED,
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: OUR_IP,
            },
        );
        let reply = server.process(0, &probe).unwrap();
        assert_eq!(&reply[..6], &PEER_MAC.0);
        assert_eq!(&reply[38..42], &[0, 0, 0, 0]);
        assert_eq!(
            server.state(0, Ipv4Address::UNSPECIFIED),
            NeighborState::Unknown
        );
        assert!(server.entries.is_empty());
    }

    #[test]
    fn test_eviction_keeps_capacity() {
        let mut server = arp();
        for (n, host) in [5u8, 6, 7].iter().enumerate() {
            let mut peer =
                Arp::<1>::new(EthernetAddress([2, 0, 0, 0, 0, *host]), Config::default());
            let ip = Ipv4Address::new(10, 77, 0, *host);
            peer.add_address(ip).unwrap();
            let request = peer.request(n as u64, ip, OUR_IP).unwrap();
            assert!(server.process(n as u64, &request).is_some());
        }
        assert_eq!(server.entries.len(), 2);
        assert_eq!(
            server.state(2, Ipv4Address::new(10, 77, 0, 5)),
            NeighborState::Unknown
        );
        assert!(server.lookup(2, Ipv4Address::new(10, 77, 0, 7)).is_some());
    }

    #[test]
    fn test_addresses() {
        let mut arp = Arp::<1>::new(OUR_MAC, Config::default());
        assert_eq!(
            arp.add_address(Ipv4Address::BROADCAST),
            Err(ArpError::NotUnicast)
        );
        for i in 0..MAX_ADDRESSES as u8 {
            arp.add_address(Ipv4Address::new(10, 0, 0, i + 1)).unwrap();
        }
        assert_eq!(
            arp.add_address(Ipv4Address::new(10, 0, 1, 1)),
            Err(ArpError::TooManyAddresses)
        );
        assert_eq!(arp.request(0, OUR_IP, Ipv4Address::new(10, 0, 0, 1)), None);
    }
}
