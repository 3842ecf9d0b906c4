//! The probe's fabric: its nodes on one Ethernet link, the monotonic
//! clock, the waits bounded in seconds.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

use hal::hosted::{wait_readable, FrameLink, MonotonicClock};
use hal::{Clock, Nic, NicError};
use verbs::Verbs;

use crate::clients::{Fabric, Node, RawNode, RawRefusal};

/// Frames taken from the link per step.
const RX_BURST: usize = 64;
/// Longest an idle step blocks on the link (the nodes' timers are checked
/// at least this often).
const IDLE_NAP_NS: u64 = 5_000_000;
/// Budget of the best-effort teardown after each case.
const CLEANUP_NS: u64 = 3_000_000_000;
/// Addresses the cases' nodes take in turn: `--local` + 1 ..= + this
/// (`--local` itself is the healthy client's). Rotating keeps a run within
/// a few hosts' worth of neighbour entries and leaves the time a reused
/// address had to be forgotten by the target long.
pub const ROTATION: u8 = 100;
/// Queue depth the Brick-client nodes accept at most: RTRS's 512, or less
/// if the client's receives (`2 × qd + 8` per connection) would not fit the
/// software HCA's receive queue.
pub const CLIENT_QUEUE_DEPTH: u16 = {
    let fits = (roce::qp::config::RQ_DEPTH - 9) / 2;
    if fits < 512 {
        fits as u16
    } else {
        512
    }
};

/// The probe's fabric.
pub struct Wire {
    pub link: FrameLink,
    pub clock: MonotonicClock,
    pub server: SocketAddr,
    /// Brick-client nodes; the first [`Wire::keep`] outlive the cases.
    pub clients: Vec<Node>,
    pub raws: Vec<RawNode>,
    /// Connections raw nodes made outside a session (half-open paths):
    /// [`Wire::reset`] disconnects them.
    pub held: Vec<(usize, verbs::ConnId)>,
    /// Clients [`Wire::reset`] leaves alone (the healthy client).
    pub keep: usize,
    /// Budget of one wait, nanoseconds.
    pub wait_ns: u64,
    /// Address and MAC of the first node.
    pub base_ip: [u8; 4],
    pub base_mac: [u8; 6],
    /// Nodes made so far (seeds; the rotation of addresses).
    pub made: u64,
    /// Seeds keys and uuids (per run, so two runs do not share uuids).
    pub seed: u64,
    /// Frames received and sent.
    pub frames_in: u64,
    pub frames_out: u64,
}

impl Wire {
    /// The address and MAC at `offset` from the first node's, and a fresh
    /// seed (a raw node's uuids come from its low byte: it must change).
    fn host(&mut self, offset: u8) -> ([u8; 4], [u8; 6], u64) {
        self.made += 1;
        let mut ip = self.base_ip;
        ip[3] = ip[3]
            .checked_add(offset)
            .expect("node address beyond x.x.x.255");
        let mut mac = self.base_mac;
        mac[5] = mac[5].wrapping_add(offset);
        (ip, mac, self.seed.wrapping_add(self.made))
    }

    /// The next address of the rotation (offset 1 ..= [`ROTATION`]).
    fn next_offset(&self) -> u8 {
        1 + (self.made % u64::from(ROTATION)) as u8
    }

    /// The offset of `ip` from the first node's address.
    pub fn offset_of(&self, ip: [u8; 4]) -> u8 {
        assert_eq!(ip[..3], self.base_ip[..3], "{ip:?} is off the probe's /24");
        ip[3].checked_sub(self.base_ip[3]).expect("below --local")
    }

    /// Adds a Brick-client node at the next address; returns its index.
    pub fn add_client(&mut self) -> usize {
        let offset = self.next_offset();
        self.add_client_at(offset)
    }

    /// Adds a Brick-client node at `offset`; returns its index.
    pub fn add_client_at(&mut self, offset: u8) -> usize {
        let (ip, mac, seed) = self.host(offset);
        self.clients
            .push(Node::new(mac, ip, CLIENT_QUEUE_DEPTH, seed));
        self.clients.len() - 1
    }

    /// Adds a raw node at the next address; returns its index.
    pub fn add_raw(&mut self) -> usize {
        let offset = self.next_offset();
        self.add_raw_at(offset)
    }

    /// Adds a raw node at `offset`; returns its index.
    pub fn add_raw_at(&mut self, offset: u8) -> usize {
        let (ip, mac, seed) = self.host(offset);
        self.raws.push(RawNode::new(mac, ip, seed));
        self.raws.len() - 1
    }

    /// [`Fabric::raw_connect`], the connection (if accepted) held for
    /// [`Wire::reset`] to disconnect.
    pub fn raw_connect_held(
        &mut self,
        r: usize,
        private_data: &[u8],
    ) -> Result<(verbs::ConnId, rtrs::wire::ConnRsp), RawRefusal> {
        let result = self.raw_connect(r, private_data);
        if let Ok((conn, _)) = &result {
            self.held.push((r, *conn));
        }
        result
    }

    /// Steps for `ns` nanoseconds.
    pub fn run_for(&mut self, ns: u64) {
        let until = self.clock.now() + ns;
        while self.clock.now() < until {
            self.step();
        }
    }

    /// Best effort after a case, passed or not: closes every session and
    /// connection the case left, waits (bounded) for them to go, and drops
    /// the nodes (but the first [`Wire::keep`] clients).
    pub fn reset(&mut self) {
        let now = self.clock.now();
        let keep = self.keep;
        for node in self.clients.iter_mut().skip(keep).filter(|n| n.alive) {
            if node.client.is_up() {
                node.client.close_session(now);
            }
        }
        for (r, conn) in std::mem::take(&mut self.held) {
            if let Some(node) = self.raws.get_mut(r).filter(|n| n.alive) {
                let down = node
                    .cm_events
                    .iter()
                    .any(|e| matches!(e, verbs::CmEvent::Disconnected { conn: c } if *c == conn));
                if !down {
                    let _ = node.hca.disconnect(conn);
                }
            }
        }
        for node in self.raws.iter_mut().filter(|n| n.alive) {
            let down: Vec<verbs::ConnId> = node
                .cm_events
                .iter()
                .filter_map(|e| match e {
                    verbs::CmEvent::Disconnected { conn } => Some(*conn),
                    _ => None,
                })
                .collect();
            let mut conns: Vec<verbs::ConnId> = node
                .cm_events
                .iter()
                .filter_map(|e| match e {
                    verbs::CmEvent::Established { conn, .. } => Some(*conn),
                    _ => None,
                })
                .collect();
            if let Some(session) = node.session.take() {
                conns.extend(session.conns);
            }
            for conn in conns.iter().filter(|c| !down.contains(c)) {
                let _ = node.hca.disconnect(*conn);
            }
        }
        let deadline = self.clock.now() + CLEANUP_NS;
        while self.clock.now() < deadline
            && self
                .clients
                .iter()
                .skip(keep)
                .any(|n| n.alive && n.client.is_up())
        {
            self.step();
        }
        // Let DREQs, DREPs and their retransmissions go out.
        self.run_for(200_000_000);
        self.clients.truncate(keep);
        self.raws.clear();
    }
}

/// Sends one HCA frame (headers + payload pieces + trailer) on `link`;
/// transmit errors are drops (the transport and CM retransmit).
fn transmit(link: &mut FrameLink, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) -> bool {
    let mut pieces: [&[u8]; 8] = [&[]; 8];
    let mut count = 0;
    for piece in payload.iter().copied().chain([trailer]) {
        if piece.is_empty() {
            continue;
        }
        let Some(slot) = pieces.get_mut(count) else {
            return false; // more pieces than any HCA frame has
        };
        *slot = piece;
        count += 1;
    }
    link.transmit(headers, &pieces[..count]).is_ok()
}

impl Fabric for Wire {
    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn server(&self) -> SocketAddr {
        self.server
    }

    fn clients(&self) -> &[Node] {
        &self.clients
    }

    fn clients_mut(&mut self) -> &mut Vec<Node> {
        &mut self.clients
    }

    fn raws(&self) -> &[RawNode] {
        &self.raws
    }

    fn raws_mut(&mut self) -> &mut Vec<RawNode> {
        &mut self.raws
    }

    /// A bounded burst of frames in (routed by destination MAC, broadcasts
    /// to every node), every node polled; when nothing moved, blocks on the
    /// link until it is readable or the nodes' next deadline (at most
    /// [`IDLE_NAP_NS`]).
    fn step(&mut self) {
        let now = self.clock.now();
        let mut busy = false;
        let Self {
            link,
            clients,
            raws,
            frames_in,
            frames_out,
            ..
        } = self;
        for _ in 0..RX_BURST {
            let received = link.receive(|frame| {
                let Some(dest) = frame.get(..6) else {
                    return;
                };
                let broadcast = dest == [0xff; 6];
                for node in clients
                    .iter_mut()
                    .filter(|n| n.alive && (broadcast || n.mac == dest))
                {
                    node.receive(now, frame);
                }
                for node in raws
                    .iter_mut()
                    .filter(|n| n.alive && (broadcast || n.mac == dest))
                {
                    node.receive(now, frame);
                }
            });
            match received {
                Ok(Some(())) => {
                    busy = true;
                    *frames_in += 1;
                }
                Ok(None) | Err(NicError::LinkDown) => break,
                Err(error) => panic!("link receive: {error}"),
            }
        }
        let mut sent = 0u64;
        let mut sink = |h: &[u8], p: &[&[u8]], t: &[u8]| {
            if transmit(link, h, p, t) {
                sent += 1;
            }
        };
        for node in clients.iter_mut().filter(|n| n.alive) {
            node.poll(now, &mut sink);
        }
        for node in raws.iter_mut().filter(|n| n.alive) {
            node.poll(now, &mut sink);
        }
        *frames_out += sent;
        busy |= sent > 0;
        if link.has_pending_output() {
            let _ = link.flush();
        }
        if busy {
            return;
        }
        let now = self.clock.now();
        let wake = self
            .clients
            .iter()
            .filter(|n| n.alive)
            .filter_map(|n| n.poll_at(now))
            .chain(
                self.raws
                    .iter()
                    .filter(|n| n.alive)
                    .filter_map(|n| n.poll_at(now)),
            )
            .fold(now + IDLE_NAP_NS, u64::min);
        if wake <= now {
            return;
        }
        let fds: Vec<RawFd> = self.link.raw_fd().into_iter().collect();
        if fds.is_empty() {
            std::thread::sleep(Duration::from_nanos(wake - now));
        } else if let Err(error) = wait_readable(&fds, Some(wake)) {
            panic!("waiting on the link: {error}");
        }
    }

    /// Steps until `done`, at most `--wait` seconds.
    fn run_until(&mut self, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
        let deadline = self.clock.now() + self.wait_ns;
        loop {
            if done(self) {
                return;
            }
            if self.clock.now() >= deadline {
                panic!(
                    "timed out after {} s waiting for {what}",
                    self.wait_ns / 1_000_000_000
                );
            }
            self.step();
        }
    }
}
