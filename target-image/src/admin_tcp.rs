//! The image's admin endpoint (docs/ADMIN.md): HTTP over smoltcp TCP on
//! the manifest interface whose address is the `[admin]` address.
//!
//! The engine keeps every frame it serves now: ARP, ICMP echo and RoCEv2
//! (UDP 4791). [`AdminTcp::receive`] takes a received frame first: an
//! IPv4 TCP segment to the admin address is the endpoint's alone (the
//! engine never sees it); an ARP packet for the admin address is copied to
//! smoltcp *and* left to the engine, so smoltcp learns its peer's MAC from
//! the peer's request or from the reply to its own request, while the
//! engine alone answers requests (smoltcp's own ARP replies are dropped
//! on the way out). Frames wait in a ring of [`FRAME_SLOTS`] slots for
//! [`AdminTcp::poll`], which runs smoltcp, serves the connections and
//! hands smoltcp's frames to the caller.
//!
//! [`MAX_CONNECTIONS`] listening sockets take connections (more at once
//! are reset by smoltcp); a connection from outside the manifest's admin
//! sources is reset as soon as its SYN arrives, logged and counted
//! (`brick_admin_connections_refused_total`). Requests are served one at
//! a time, in order: the request head ([`admin_http::parse_head`]) is
//! routed ([`admin_http::route`]), the engine renders the snapshot between
//! two of its polls ([`admin_render::render`]: consistent, nothing
//! half-handled) into one [`FixedText`] of
//! [`admin_render::snapshot_capacity`] bytes, and the head and body are
//! streamed out through the socket's buffer over the following polls; then
//! the connection is closed (`Connection: close`). A connection that has
//! not been answered and closed within [`PEER_TIMEOUT_NS`] is reset.
//!
//! Everything — the interface, sockets, their buffers, the frame rings,
//! the snapshot — is allocated in [`AdminTcp::new`]. Peers must be on the
//! interface's own network: the endpoint has no route beyond it.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt::{self, Write as _};
use core::net::SocketAddrV4;

use hal::block::BlockDevice;
use manifest::binary::{Admin, Manifest};
use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet, SocketStorage};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{
    EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint,
};
use thin::{PoolBuf, ThinVolume};

pub use crate::admin_frames::FRAME_SLOTS;
use crate::admin_frames::{classify, is_arp_reply, Frames, Ring, ETH_HEADER};
use crate::admin_http::{self, Head};
use crate::admin_render::{self, AdminCounters};
use crate::{Chunk, Engine, FixedText, Port};

/// Connections open at once (listening sockets).
pub const MAX_CONNECTIONS: usize = 4;
/// How long a connection may take from its SYN to its close.
pub const PEER_TIMEOUT_NS: u64 = 5_000_000_000;
/// Each socket's receive buffer (the head is copied out as it arrives).
const SOCKET_RX_BYTES: usize = 4 << 10;
/// Each socket's send buffer.
const SOCKET_TX_BYTES: usize = 32 << 10;
/// Room for the response status line and headers.
const RESPONSE_HEAD_BYTES: usize = 256;
/// smoltcp rounds per [`AdminTcp::poll`]: each sends at most one segment
/// per socket.
const MAX_ROUNDS: usize = 16;

/// Why the manifest's admin endpoint cannot be served by the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminTcpError {
    /// The admin address is none of the interfaces' addresses.
    NotAnInterfaceAddress(SocketAddrV4),
}

impl fmt::Display for AdminTcpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAnInterfaceAddress(address) => write!(
                f,
                "admin address {address}: expected the address of one of the manifest's \
                 interfaces (the image serves its admin endpoint on an interface)"
            ),
        }
    }
}

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Its socket listens.
    Listening,
    /// Accepted (allowed source) at `since`: reading the head.
    Reading,
    /// The head is whole; waits for the snapshot buffer.
    Waiting,
    /// Its answer is being sent (it owns the snapshot buffer).
    Sending,
    /// Closed or reset by us; the socket is reopened once it is done.
    Closing,
}

struct Connection {
    handle: SocketHandle,
    phase: Phase,
    since: u64,
    head: Vec<u8>,
}

/// The image's admin endpoint: see the module docs.
pub struct AdminTcp {
    interface: usize,
    admin: Admin,
    iface: Interface,
    device: Frames,
    sockets: SocketSet<'static>,
    connections: Vec<Connection>,
    /// The answer being sent: head, then body.
    response_head: FixedText,
    body: FixedText,
    sent: usize,
    counters: AdminCounters,
}

/// Bytes [`AdminTcp::new`] allocates besides the snapshot, on an
/// interface of `mtu`: the sockets' buffers, the request heads and the two
/// frame rings (counted by `brick manifest check` as
/// `manifest::capacity::sizes::ADMIN_ENDPOINT`, a bound for every MTU).
pub const fn fixed_bytes(mtu: u16) -> usize {
    MAX_CONNECTIONS * (SOCKET_RX_BYTES + SOCKET_TX_BYTES + admin_http::MAX_HEAD + SOCKET_RX_BYTES)
        + 2 * FRAME_SLOTS * (ETH_HEADER + mtu as usize)
        + RESPONSE_HEAD_BYTES
}

impl AdminTcp {
    /// The endpoint for `manifest`'s `[admin]` section, if it has one:
    /// on the interface whose address is the admin address. `seed` seeds
    /// TCP's initial sequence numbers; `now` is the loop's clock (ns).
    ///
    /// # Errors
    /// [`AdminTcpError`] if no interface has the admin address.
    pub fn new(
        manifest: &Manifest<'_>,
        seed: u64,
        now: u64,
    ) -> Result<Option<Self>, AdminTcpError> {
        let Some(admin) = manifest.admin() else {
            return Ok(None);
        };
        let Some((interface, iface)) = manifest
            .interfaces()
            .enumerate()
            .find(|(_, i)| i.address.address == *admin.address.ip())
        else {
            return Err(AdminTcpError::NotAnInterfaceAddress(admin.address));
        };
        let frame_bytes = ETH_HEADER + usize::from(iface.mtu);
        let mut device = Frames {
            rx: Ring::new(FRAME_SLOTS, frame_bytes),
            tx: Ring::new(FRAME_SLOTS, frame_bytes),
            frame_bytes,
        };
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(iface.mac.0)));
        config.random_seed = seed;
        let mut net = Interface::new(config, &mut device, instant(now));
        let cidr = IpCidr::new(IpAddress::Ipv4(iface.address.address), iface.address.prefix);
        net.update_ip_addrs(|addresses| {
            let _ = addresses.push(cidr);
        });
        let mut sockets = SocketSet::new(Vec::<SocketStorage<'static>>::with_capacity(
            MAX_CONNECTIONS,
        ));
        let mut connections = Vec::with_capacity(MAX_CONNECTIONS);
        for _ in 0..MAX_CONNECTIONS {
            let socket = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0u8; SOCKET_RX_BYTES]),
                tcp::SocketBuffer::new(vec![0u8; SOCKET_TX_BYTES]),
            );
            let handle = sockets.add(socket);
            connections.push(Connection {
                handle,
                phase: Phase::Closing,
                since: now,
                head: Vec::with_capacity(admin_http::MAX_HEAD + SOCKET_RX_BYTES),
            });
        }
        let mut tcp = Self {
            interface,
            admin,
            iface: net,
            device,
            sockets,
            connections,
            response_head: FixedText::with_capacity(RESPONSE_HEAD_BYTES),
            body: FixedText::with_capacity(admin_render::snapshot_capacity(manifest)),
            sent: 0,
            counters: AdminCounters::default(),
        };
        for index in 0..MAX_CONNECTIONS {
            tcp.reopen(index);
        }
        Ok(Some(tcp))
    }

    /// The manifest interface the endpoint is on.
    pub fn interface(&self) -> usize {
        self.interface
    }

    /// The manifest's admin section.
    pub fn admin(&self) -> Admin {
        self.admin
    }

    /// The endpoint's counters (refused connections, requests rendered).
    pub fn counters(&self) -> AdminCounters {
        self.counters
    }

    /// Offers a frame received on `interface`. Returns `true` if it is
    /// the endpoint's alone (a TCP segment to the admin address): do not
    /// hand it to the engine. ARP for the admin address is copied and
    /// left to the engine (`false`). A frame that finds the ring full is
    /// dropped (TCP sends it again).
    pub fn receive(&mut self, interface: usize, frame: &[u8]) -> bool {
        if interface != self.interface {
            return false;
        }
        let (ours, alone) = classify(frame, self.admin.address.ip().octets());
        if ours {
            if let Some(slot) = self.device.rx.back(frame.len()) {
                slot.copy_from_slice(frame);
                self.device.rx.push_back();
            }
        }
        alone
    }

    /// When [`poll`](Self::poll) next has work (ns; `now`: at once).
    pub fn poll_at(&mut self, now: u64) -> Option<u64> {
        if self.device.rx.count > 0 || self.device.tx.count > 0 {
            return Some(now);
        }
        let waiting = self
            .connections
            .iter()
            .any(|c| c.phase == Phase::Waiting && !self.sending());
        if waiting {
            return Some(now);
        }
        let timeout = self
            .connections
            .iter()
            .filter(|c| c.phase != Phase::Listening)
            .map(|c| c.since.saturating_add(PEER_TIMEOUT_NS))
            .min();
        let smoltcp = self.iface.poll_at(instant(now), &self.sockets).map(|at| {
            u64::try_from(at.total_micros())
                .unwrap_or(0)
                .saturating_mul(1000)
        });
        match (smoltcp, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs smoltcp on the frames received, serves the connections (a
    /// snapshot of `engine` for the one whose turn it is: `thin(device)`
    /// is a volume's thin view) and gives each frame to send to `send`.
    /// `log` takes one line per refused connection. Bounded work; returns
    /// whether anything happened.
    pub fn poll<P, D, TD, H>(
        &mut self,
        now: u64,
        engine: &Engine<'_, P, D>,
        thin: &dyn Fn(&D) -> Option<&ThinVolume<TD, H>>,
        send: &mut dyn FnMut(&[u8]),
        log: &mut dyn FnMut(fmt::Arguments<'_>),
    ) -> bool
    where
        P: Port,
        D: BlockDevice<Chunk>,
        TD: BlockDevice<PoolBuf<H>>,
        H: Copy,
    {
        let mut busy = false;
        for _ in 0..MAX_ROUNDS {
            let received = self.device.rx.count;
            let changed = self
                .iface
                .poll(instant(now), &mut self.device, &mut self.sockets)
                != PollResult::None;
            let served = self.serve(now, engine, thin, log);
            let mut sent = 0;
            while let Some(frame) = self.device.tx.front() {
                if !is_arp_reply(frame) {
                    send(frame);
                }
                self.device.tx.pop_front();
                sent += 1;
            }
            let round = changed || served || sent > 0 || received != self.device.rx.count;
            busy |= round;
            if !round {
                break;
            }
        }
        busy
    }

    fn sending(&self) -> bool {
        self.connections.iter().any(|c| c.phase == Phase::Sending)
    }

    /// One pass over the connections; returns whether anything moved.
    fn serve<P, D, TD, H>(
        &mut self,
        now: u64,
        engine: &Engine<'_, P, D>,
        thin: &dyn Fn(&D) -> Option<&ThinVolume<TD, H>>,
        log: &mut dyn FnMut(fmt::Arguments<'_>),
    ) -> bool
    where
        P: Port,
        D: BlockDevice<Chunk>,
        TD: BlockDevice<PoolBuf<H>>,
        H: Copy,
    {
        let mut moved = false;
        for index in 0..self.connections.len() {
            moved |= self.step(index, now, log);
        }
        if !self.sending() {
            if let Some(index) = self
                .connections
                .iter()
                .position(|c| c.phase == Phase::Waiting)
            {
                self.answer(index, engine, thin);
                moved = true;
            }
        }
        if let Some(index) = self
            .connections
            .iter()
            .position(|c| c.phase == Phase::Sending)
        {
            moved |= self.send_some(index);
        }
        moved
    }

    /// Moves connection `index` on from what its socket says.
    fn step(&mut self, index: usize, now: u64, log: &mut dyn FnMut(fmt::Arguments<'_>)) -> bool {
        let connection = &mut self.connections[index];
        let socket = self.sockets.get_mut::<tcp::Socket>(connection.handle);
        let state = socket.state();
        match connection.phase {
            Phase::Listening if state != tcp::State::Listen => {
                let peer = socket.remote_endpoint();
                let admin = self.admin;
                if peer.is_some_and(|peer| allows(&admin, peer)) {
                    connection.phase = Phase::Reading;
                    connection.since = now;
                    connection.head.clear();
                } else {
                    socket.abort();
                    connection.phase = Phase::Closing;
                    connection.since = now;
                    self.counters.refused += 1;
                    if let Some(peer) = peer {
                        log(format_args!(
                            "admin: refused a connection from {peer} (not an admin source)"
                        ));
                    }
                }
                true
            }
            Phase::Listening => false,
            Phase::Closing => match state {
                tcp::State::Closed if socket.remote_endpoint().is_none() => {
                    self.reopen(index);
                    true
                }
                tcp::State::TimeWait | tcp::State::Closed => {
                    // We closed first: skip TIME-WAIT (every byte was sent
                    // and acknowledged, the peer closed too).
                    socket.abort();
                    false
                }
                _ if now.saturating_sub(connection.since) > PEER_TIMEOUT_NS => {
                    socket.abort();
                    false
                }
                _ => false,
            },
            _ if state == tcp::State::Closed
                || now.saturating_sub(connection.since) > PEER_TIMEOUT_NS =>
            {
                // Reset by the peer, or too slow.
                socket.abort();
                connection.phase = Phase::Closing;
                true
            }
            Phase::Reading => {
                let mut moved = false;
                while socket.can_recv() {
                    let room = connection.head.capacity() - connection.head.len();
                    let head = &mut connection.head;
                    let taken = socket.recv(|data| {
                        let n = data.len().min(room);
                        head.extend_from_slice(&data[..n]);
                        (n, n)
                    });
                    match taken {
                        Ok(n) if n > 0 => moved = true,
                        _ => break,
                    }
                }
                match parse_head(&connection.head) {
                    Head::Incomplete if !socket.may_recv() && state != tcp::State::SynReceived => {
                        // The peer closed before a whole request.
                        socket.abort();
                        connection.phase = Phase::Closing;
                        true
                    }
                    Head::Incomplete => moved,
                    _ => {
                        connection.phase = Phase::Waiting;
                        true
                    }
                }
            }
            Phase::Waiting | Phase::Sending => false,
        }
    }

    /// Renders connection `index`'s answer into the snapshot buffer.
    fn answer<P, D, TD, H>(
        &mut self,
        index: usize,
        engine: &Engine<'_, P, D>,
        thin: &dyn Fn(&D) -> Option<&ThinVolume<TD, H>>,
    ) where
        P: Port,
        D: BlockDevice<Chunk>,
        TD: BlockDevice<PoolBuf<H>>,
        H: Copy,
    {
        let connection = &mut self.connections[index];
        connection.phase = Phase::Sending;
        self.sent = 0;
        self.response_head.clear();
        let routed = match parse_head(&connection.head) {
            Head::Request { method, target } => {
                admin_http::route(method, target, engine.manifest()).map_err(Some)
            }
            Head::Refused(error) => Err(Some(error)),
            Head::Incomplete => Err(None),
        };
        let (status, content_type) = match routed {
            Ok(request) => {
                self.counters.requests += 1;
                let answer =
                    admin_render::render(engine, request, thin, self.counters, &mut self.body);
                match admin_http::rendered(request, answer) {
                    Ok(framing) => framing,
                    Err(error) => error_body(&mut self.body, &error),
                }
            }
            Err(Some(error)) => error_body(&mut self.body, &error),
            Err(None) => error_body(&mut self.body, &admin_http::ErrorAnswer::timeout()),
        };
        let _ = admin_http::write_response_head(
            &mut self.response_head,
            status,
            content_type,
            self.body.as_bytes().len(),
        );
    }

    /// Sends what the socket takes of the answer; closes once all is in.
    fn send_some(&mut self, index: usize) -> bool {
        let connection = &mut self.connections[index];
        let socket = self.sockets.get_mut::<tcp::Socket>(connection.handle);
        let head = self.response_head.as_bytes();
        let body = self.body.as_bytes();
        let total = head.len() + body.len();
        let mut moved = false;
        while self.sent < total && socket.can_send() {
            let rest = if self.sent < head.len() {
                &head[self.sent..]
            } else {
                &body[self.sent - head.len()..]
            };
            match socket.send_slice(rest) {
                Ok(n) if n > 0 => {
                    self.sent += n;
                    moved = true;
                }
                _ => break,
            }
        }
        if self.sent == total {
            socket.close();
            connection.phase = Phase::Closing;
            moved = true;
        }
        moved
    }

    /// Reopens connection `index`'s socket for the next connection.
    fn reopen(&mut self, index: usize) {
        let connection = &mut self.connections[index];
        let socket = self.sockets.get_mut::<tcp::Socket>(connection.handle);
        let endpoint = IpListenEndpoint {
            addr: Some(IpAddress::Ipv4(*self.admin.address.ip())),
            port: self.admin.address.port(),
        };
        // The socket is closed (the callers check), the port is not zero
        // (the manifest compiler refuses it).
        if socket.listen(endpoint).is_ok() {
            connection.phase = Phase::Listening;
            connection.head.clear();
        }
    }
}

/// Whether `admin` lets `peer` connect.
fn allows(admin: &Admin, peer: IpEndpoint) -> bool {
    match peer.addr {
        IpAddress::Ipv4(ip) => admin.allows(ip),
    }
}

/// Reads a head (whole, incomplete or refused).
fn parse_head(head: &[u8]) -> Head<'_> {
    admin_http::parse_head(head)
}

/// Writes `error`'s JSON body; its status and content type.
fn error_body(body: &mut FixedText, error: &admin_http::ErrorAnswer<'_>) -> (u16, &'static str) {
    body.clear();
    let _ = write!(body, "{error}");
    (error.status(), admin_http::JSON_TYPE)
}

fn instant(ns: u64) -> Instant {
    Instant::from_micros(i64::try_from(ns / 1000).unwrap_or(i64::MAX))
}
