//! One RTRS server over two ports: a multipath session across interfaces.
//!
//! The end-to-end tests run Brick's RTRS client and a two-port
//! [`Server`] lent two ports, over three software HCAs (`roce::hca::Hca`): the
//! client (10.77.0.2) and the server's port 0 (10.77.0.1) and port 1
//! (10.78.0.1), each with its own MAC. A simulated switch routes Ethernet
//! frames by destination MAC (ARP broadcasts by target IP) under virtual
//! time, and can cut port 1's link. The admission tests drive the mock
//! provider of `server_support` on both ports.

mod server_support;
#[path = "common/counting_alloc.rs"]
#[macro_use]
mod counting_alloc;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use roce::hca::{Hca, HcaConfig};
use rtrs::client::{
    Client, ClientConfig, ClientIo, Direction, Event as ClientEvent, MultipathPolicy, PathError,
    PathStatus, ReadBuffer,
};
use rtrs::server::{
    errno, AdmitAll, CloseReason, Event, IoDirection, ReadData, Server, ServerConfig, StartError,
    Usage,
};
use rtrs::wire::{ConnReq, ConnRsp, InfoReq, Uuid};
use server_support::{small_config, MockVerbs, PROVIDER_DEPTH};
use verbs::{
    AccessFlags, CmEvent, ConnId, KeySource, Memory, MemoryRegion, PrivateData, Sge, Sgl, Verbs,
};

counting_allocator!(PROVIDER_DEPTH);

// ----- the simulated network ---------------------------------------------------

/// Key source: splitmix64, seeded.
struct Keys(u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 32) as u32
    }
}

/// 64 regions, 16 QPs, 1024 completions.
type TestHca = Hca<Vec<u8>, Keys, 64, 16, 1024>;

const SECOND: u64 = 1_000_000_000;
const CLIENT_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x02];
const CLIENT_IP: [u8; 4] = [10, 77, 0, 2];
const PORT_MACS: [[u8; 6]; 2] = [
    [0x52, 0x54, 0x00, 0x77, 0x00, 0x01],
    [0x52, 0x54, 0x00, 0x78, 0x00, 0x01],
];
const PORT_IPS: [[u8; 4]; 2] = [[10, 77, 0, 1], [10, 78, 0, 1]];

fn hca(mac: [u8; 6], ip: [u8; 4], pool: usize, seed: u64) -> TestHca {
    Hca::new(vec![0u8; pool], Keys(seed), HcaConfig { mac, ip })
}

/// Where a frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Client,
    Port(usize),
}

fn server_config() -> ServerConfig {
    let mut config = ServerConfig::brick_default();
    config.queue_depth = 8;
    config.chunk_size = 16 * 1024;
    config.max_hdr_size = 4096;
    config.max_sessions = 2;
    config.max_paths_per_session = 2;
    config.max_connections_per_path = 4;
    config
}

fn client_config() -> ClientConfig {
    let mut config = ClientConfig::default_with_seed([9; 16]);
    config.max_paths = 2;
    config.max_connections_per_path = 4;
    config.max_queue_depth = 16;
    config.max_header_len = 256;
    config.policy = MultipathPolicy::RoundRobin;
    config
}

/// The test backend's header: 1 byte op, 7 pad, 8 bytes LE offset.
fn header(op: u8, offset: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0] = op;
    h[8..].copy_from_slice(&offset.to_le_bytes());
    h
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// Client, two-port server, switch, clock and a RAM disk behind the server.
struct World {
    client: Client<TestHca>,
    server: Server<TestHca>,
    /// The server's two ports, lent to it on every call.
    ports: Vec<TestHca>,
    now: u64,
    /// Frames in flight: (delivery time, sequence) -> (to, frame).
    link: BTreeMap<(u64, u64), (Node, Vec<u8>)>,
    seq: u64,
    latency: u64,
    /// Ports whose link is cut (frames to and from them are lost).
    cut: [bool; 2],
    disk: Vec<u8>,
    client_events: Vec<ClientEvent>,
    server_events: Vec<Event>,
    /// (port, direction) of every IO the server handed out.
    served: Vec<(usize, IoDirection)>,
}

impl World {
    fn new() -> Self {
        let mut ports: Vec<TestHca> = (0..2)
            .map(|i| hca(PORT_MACS[i], PORT_IPS[i], 2 << 20, 0x1000 + i as u64))
            .collect();
        let mut server = Server::new(server_config()).expect("server config");
        server.start(&mut ports).expect("listen on both ports");
        assert!(server.is_listening());
        let client = Client::new(hca(CLIENT_MAC, CLIENT_IP, 4 << 20, 0x77), client_config())
            .expect("client config");
        Self {
            client,
            server,
            ports,
            now: 1_000_000,
            link: BTreeMap::new(),
            seq: 0,
            latency: 10_000,
            cut: [false; 2],
            disk: vec![0; 1 << 20],
            client_events: Vec::new(),
            server_events: Vec::new(),
            served: Vec::new(),
        }
    }

    fn server_addr(&self, port: usize) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::from(PORT_IPS[port]), self.server.config().port))
    }

    /// The port a client frame is for: by destination MAC, ARP broadcasts
    /// by target IP.
    fn route(frame: &[u8]) -> Option<usize> {
        let dest = frame.get(0..6)?;
        if dest == [0xff; 6] {
            // Ethernet 14 + ARP: target protocol address at 24..28.
            if frame.get(12..14)? != [0x08, 0x06] {
                return None;
            }
            let target = frame.get(38..42)?;
            return PORT_IPS.iter().position(|ip| ip == target);
        }
        PORT_MACS.iter().position(|mac| mac == dest)
    }

    fn send(&mut self, from: Node, frame: Vec<u8>) {
        let to = match from {
            Node::Client => match Self::route(&frame) {
                Some(port) => Node::Port(port),
                None => return,
            },
            Node::Port(_) => Node::Client,
        };
        let cut = |node: Node| matches!(node, Node::Port(port) if self.cut[port]);
        if cut(from) || cut(to) {
            return;
        }
        self.seq += 1;
        self.link
            .insert((self.now + self.latency, self.seq), (to, frame));
    }

    /// Polls every HCA into the switch; returns whether a frame left.
    fn transmit(&mut self) -> bool {
        fn collect(frames: &mut Vec<Vec<u8>>) -> impl FnMut(&[u8], &[&[u8]], &[u8]) + '_ {
            |headers: &[u8], payload: &[&[u8]], trailer: &[u8]| {
                let mut frame = headers.to_vec();
                for piece in payload {
                    frame.extend_from_slice(piece);
                }
                frame.extend_from_slice(trailer);
                frames.push(frame);
            }
        }
        let now = self.now;
        let mut out: Vec<(Node, Vec<u8>)> = Vec::new();
        let mut frames = Vec::new();
        while self.client.verbs_mut().poll(now, &mut collect(&mut frames)) {}
        out.extend(frames.drain(..).map(|frame| (Node::Client, frame)));
        for port in 0..self.server.port_count() {
            let hca = &mut self.ports[port];
            while hca.poll(now, &mut collect(&mut frames)) {}
            out.extend(frames.drain(..).map(|frame| (Node::Port(port), frame)));
        }
        let busy = !out.is_empty();
        for (from, frame) in out {
            self.send(from, frame);
        }
        busy
    }

    /// Delivers the frames due now; returns whether any was.
    fn deliver(&mut self) -> bool {
        let mut busy = false;
        while let Some(entry) = self.link.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (to, frame) = entry.remove();
            busy = true;
            match to {
                Node::Client => self.client.verbs_mut().receive(self.now, &frame),
                Node::Port(port) => self.ports[port].receive(self.now, &frame),
            }
        }
        busy
    }

    /// Serves one IO against the RAM disk through the event's port.
    fn serve(&mut self, event: &Event) {
        let Event::Io {
            token,
            direction,
            header,
            data,
            port,
            ..
        } = event
        else {
            return;
        };
        assert_eq!(self.server.path_port(token.path), Some(*port));
        self.served.push((*port, *direction));
        let memory = &self.ports[*port];
        let mut h = vec![0u8; header.len() as usize];
        memory.read(*header, 0, &mut h).expect("header");
        let offset = u64::from_le_bytes(h[8..16].try_into().unwrap()) as usize;
        match direction {
            IoDirection::Write => {
                let mut bytes = vec![0u8; data.len() as usize];
                memory.read(*data, 0, &mut bytes).expect("write data");
                self.disk[offset..offset + bytes.len()].copy_from_slice(&bytes);
            }
            IoDirection::Read { read_len } => {
                let bytes = self.disk[offset..offset + *read_len as usize].to_vec();
                self.ports[*port]
                    .write(*data, 0, &bytes)
                    .expect("read data");
            }
        }
        let now = self.now;
        self.server
            .complete_io(*token, 0, ReadData::Chunk, now, &mut self.ports)
            .expect("complete");
    }

    /// One round at the current time; returns whether anything moved.
    fn round(&mut self) -> bool {
        let now = self.now;
        let mut busy = self.client.poll(now);
        busy |= self.server.poll(now, &mut self.ports, &mut AdmitAll);
        while let Some(event) = self.server.next_event() {
            busy = true;
            if matches!(event, Event::Io { .. }) {
                self.serve(&event);
            } else {
                self.server_events.push(event);
            }
        }
        while let Some(event) = self.client.next_event() {
            busy = true;
            self.client_events.push(event);
        }
        busy |= self.transmit();
        busy |= self.deliver();
        busy
    }

    /// The next time anything has to happen.
    fn next_deadline(&self) -> Option<u64> {
        let ports = self.ports.iter().filter_map(|hca| hca.poll_at(self.now));
        [
            self.client.poll_at(),
            self.server.poll_at(),
            self.client.verbs().poll_at(self.now),
            self.link.keys().next().map(|key| key.0),
        ]
        .into_iter()
        .flatten()
        .chain(ports)
        .min()
    }

    /// Runs for `duration` of virtual time, or until `done` holds.
    fn run_until(&mut self, duration: u64, mut done: impl FnMut(&World) -> bool) -> bool {
        let end = self.now + duration;
        let mut rounds = 0u32;
        loop {
            while self.round() {
                rounds += 1;
                assert!(rounds < 2_000_000, "livelock at t={}", self.now);
            }
            if done(self) {
                return true;
            }
            if self.now >= end {
                return false;
            }
            let next = self.next_deadline().unwrap_or(end);
            self.now = next.clamp(self.now + 1, end);
        }
    }

    fn run(&mut self, duration: u64) {
        self.run_until(duration, |_| false);
    }

    fn client_buffer(&mut self, len: u32, access: AccessFlags) -> MemoryRegion {
        let verbs = self.client.verbs_mut();
        let handle = verbs.alloc(len, 64).expect("client alloc");
        verbs.reg_mr(handle, access).expect("client reg_mr")
    }

    fn completion(&self, tag: u64) -> Option<u16> {
        self.client_events.iter().find_map(|e| match e {
            ClientEvent::IoCompleted { tag: t, errno, .. } if *t == tag => Some(*errno),
            _ => None,
        })
    }

    /// Writes `data` at `offset`; runs until it completes; returns the port
    /// that served it.
    fn write(&mut self, tag: u64, offset: u64, data: &[u8]) -> usize {
        let buffer = self.client_buffer(data.len() as u32, AccessFlags::LOCAL_WRITE);
        self.client
            .verbs_mut()
            .write(buffer.handle, 0, data)
            .unwrap();
        let served = self.served.len();
        self.client
            .submit(ClientIo {
                tag,
                header: &header(b'W', offset),
                direction: Direction::Write {
                    data: Sgl::single(Sge::new(buffer.lkey, 0, data.len() as u32)),
                },
                admin: false,
                hint: None,
            })
            .expect("submit write");
        assert!(self.run_until(SECOND, |w| w.completion(tag).is_some()));
        assert_eq!(self.completion(tag), Some(0), "write {tag}");
        assert_eq!(self.served.len(), served + 1);
        assert_eq!(self.served[served].1, IoDirection::Write);
        self.served[served].0
    }

    /// Reads `len` bytes at `offset`; runs until done; returns the data
    /// and the port that served it.
    fn read(&mut self, tag: u64, offset: u64, len: u32) -> (Vec<u8>, usize) {
        let sink = self.client_buffer(
            len,
            AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
        );
        let served = self.served.len();
        self.client
            .submit(ClientIo {
                tag,
                header: &header(b'R', offset),
                direction: Direction::Read {
                    dest: ReadBuffer {
                        region: sink,
                        offset: 0,
                        len,
                    },
                },
                admin: false,
                hint: None,
            })
            .expect("submit read");
        assert!(self.run_until(SECOND, |w| w.completion(tag).is_some()));
        assert_eq!(self.completion(tag), Some(0), "read {tag}");
        assert_eq!(self.served.len(), served + 1);
        let mut bytes = vec![0u8; len as usize];
        self.client
            .verbs()
            .read(sink.handle, 0, &mut bytes)
            .expect("read sink");
        (bytes, self.served[served].0)
    }

    /// Connects the two-path session (path i to port i) and checks it.
    fn connect(&mut self) {
        let addrs = [self.server_addr(0), self.server_addr(1)];
        let now = self.now;
        self.client
            .connect_session("multiport", &addrs, 2, now)
            .expect("connect_session");
        let up = self.run_until(10 * SECOND, |w| {
            w.client.path_status(0) == Some(PathStatus::Connected)
                && w.client.path_status(1) == Some(PathStatus::Connected)
        });
        assert!(up, "client events {:?}", self.client_events);
        self.run(SECOND / 100);
    }

    fn path_ups(&self) -> Vec<usize> {
        self.server_events
            .iter()
            .filter_map(|e| match e {
                Event::PathUp { port, .. } => Some(*port),
                _ => None,
            })
            .collect()
    }
}

// ----- end to end over two HCAs ----------------------------------------------

/// Runs `test` on a thread with a stack big enough for three HCAs.
fn with_big_stack(test: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(test)
        .expect("spawn")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

#[test]
fn one_session_two_paths_on_two_ports() {
    with_big_stack(one_session_two_paths_on_two_ports_body);
}

fn one_session_two_paths_on_two_ports_body() {
    let mut world = Box::new(World::new());
    world.connect();
    let opened = world
        .server_events
        .iter()
        .filter(|e| matches!(e, Event::SessionOpened { .. }))
        .count();
    assert_eq!(opened, 1, "{:?}", world.server_events);
    let mut ups = world.path_ups();
    ups.sort_unstable();
    assert_eq!(ups, [0, 1], "{:?}", world.server_events);
    // Both paths belong to one session.
    let sessions: Vec<_> = world
        .server_events
        .iter()
        .filter_map(|e| match e {
            Event::PathUp { session, .. } => Some(*session),
            _ => None,
        })
        .collect();
    assert_eq!(sessions[0], sessions[1]);
    let usage = world.server.usage();
    assert_eq!((usage.sessions, usage.paths), (1, 2), "{usage:?}");
    assert_eq!(usage.connections, 4);
    // Each port holds one path's memory (qd chunks + 3 control buffers).
    for port in 0..2 {
        let path = world
            .server_events
            .iter()
            .find_map(|e| match e {
                Event::PathUp { path, port: p, .. } if *p == port => Some(*path),
                _ => None,
            })
            .unwrap();
        assert_eq!(world.server.path_port(path), Some(port));
    }

    // A write served on one port is read back byte-exact through the other
    // (round robin alternates the paths).
    let data = pattern(3, 3000);
    let write_port = world.write(1, 8192, &data);
    let (bytes, read_port) = world.read(2, 8192, data.len() as u32);
    assert_eq!(bytes, data);
    assert_ne!(write_port, read_port, "the IOs used both paths");
    // And the other way round: one more read shifts the round robin.
    let (again, _) = world.read(5, 8192, 3000);
    assert_eq!(again, pattern(3, 3000));
    let data = pattern(77, 5000);
    let write_port2 = world.write(3, 65536, &data);
    let (bytes, read_port2) = world.read(4, 65536, data.len() as u32);
    assert_eq!(bytes, data);
    assert_ne!(write_port2, read_port2);
    assert_ne!(write_port, write_port2);
    let mut ports: Vec<usize> = world.served.iter().map(|(port, _)| *port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports, [0, 1]);

    // Shutdown drains both ports.
    let now = world.now;
    world.server.close_all(now, &mut world.ports);
    let idle = world.run_until(10 * SECOND, |w| w.server.usage() == Usage::default());
    assert!(idle, "{:?}", world.server.usage());
    assert_eq!(world.server.stats().paths_closed, 2);
}

#[test]
fn session_survives_losing_a_port_and_the_path_comes_back_on_it() {
    with_big_stack(session_survives_losing_a_port_body);
}

fn session_survives_losing_a_port_body() {
    let mut world = Box::new(World::new());
    world.connect();
    let data = pattern(11, 4096);
    world.write(1, 0, &data);

    let on_port_1 = world
        .server_events
        .iter()
        .find_map(|e| match e {
            Event::PathUp { path, port: 1, .. } => Some(*path),
            _ => None,
        })
        .expect("a path on port 1");

    // Port 1's link is cut: heartbeats declare the path on it dead on both
    // sides (rtrs.md §5: 5 missed 5 s intervals); the session lives on
    // through port 0.
    world.cut[1] = true;
    let start = world.now;
    let down = world.run_until(60 * SECOND, |w| {
        w.client.path_status(1) != Some(PathStatus::Connected)
            && w.server_events.iter().any(|e| {
                matches!(e, Event::PathDown { path, reason: CloseReason::HeartbeatTimeout, .. }
                    if *path == on_port_1)
            })
    });
    assert!(
        down,
        "path on port 1 not declared dead: {:?}",
        world.server_events
    );
    assert!(world.client_events.iter().any(|e| matches!(
        e,
        ClientEvent::PathDown {
            path: 1,
            reason: PathError::HeartbeatTimeout
        }
    )));
    assert!(world.now - start <= 60 * SECOND);
    assert!(
        !world
            .server_events
            .iter()
            .any(|e| matches!(e, Event::SessionClosed { .. })),
        "{:?}",
        world.server_events
    );
    assert_eq!(world.client.path_status(0), Some(PathStatus::Connected));
    let usage = world.server.usage();
    assert_eq!(usage.sessions, 1);
    // IO goes on, all of it through port 0.
    for i in 0..4u64 {
        let data = pattern(40 + i as u8, 1000 + 100 * i as usize);
        assert_eq!(world.write(10 + i, 4096 * (i + 4), &data), 0);
        let (bytes, port) = world.read(20 + i, 4096 * (i + 4), data.len() as u32);
        assert_eq!(bytes, data);
        assert_eq!(port, 0);
    }
    let (bytes, _) = world.read(30, 0, data.len() as u32);
    assert_eq!(bytes, data, "data written before the cut");

    // Heal: the client reconnects path 1, on port 1 again.
    let ups_before = world.path_ups().len();
    world.cut[1] = false;
    let back = world.run_until(60 * SECOND, |w| {
        w.client.path_status(1) == Some(PathStatus::Connected) && w.path_ups().len() > ups_before
    });
    assert!(back, "client events {:?}", world.client_events);
    assert_eq!(world.path_ups()[ups_before..], [1]);
    // The stale path drains; two paths again, one per port.
    let settled = world.run_until(30 * SECOND, |w| w.server.usage().paths == 2);
    assert!(settled, "{:?}", world.server.usage());
    assert_eq!(world.server.usage().sessions, 1);
    let opened = world
        .server_events
        .iter()
        .filter(|e| matches!(e, Event::SessionOpened { .. }))
        .count();
    assert_eq!(opened, 1, "one session throughout");
    // Both ports serve again.
    let data = pattern(99, 2048);
    let a = world.write(50, 1 << 19, &data);
    let (bytes, b) = world.read(51, 1 << 19, data.len() as u32);
    assert_eq!(bytes, data);
    assert_ne!(a, b);
}

// ----- admission across ports, on the mock provider ----------------------------

/// A server and the two mock ports it is lent.
struct MockServer {
    server: Server<MockVerbs>,
    ports: [MockVerbs; 2],
}

impl MockServer {
    fn poll(&mut self, now: u64) -> bool {
        self.server.poll(now, &mut self.ports, &mut AdmitAll)
    }

    fn port(&self, port: usize) -> Option<&MockVerbs> {
        self.ports.get(port)
    }

    fn port_mut(&mut self, port: usize) -> Option<&mut MockVerbs> {
        self.ports.get_mut(port)
    }

    fn next_event(&mut self) -> Option<Event> {
        self.server.next_event()
    }

    fn usage(&self) -> Usage {
        self.server.usage()
    }
}

/// A server started on two mock ports; `start` refuses zero ports.
fn mock_server() -> MockServer {
    let mut server = Server::new(small_config()).expect("config");
    assert_eq!(server.start(&mut []), Err(StartError::NoPorts));
    assert!(!server.is_listening());
    let mut ports = [MockVerbs::new(4 << 20), MockVerbs::new(4 << 20)];
    server.start(&mut ports).expect("listen");
    assert!(server.is_listening());
    assert_eq!(server.port_count(), 2);
    for port in &ports {
        assert_eq!(port.listening, Some(small_config().port));
    }
    MockServer { server, ports }
}

fn req(cid: u16, cid_num: u16, path: u8, session: u8, first_conn: bool) -> Vec<u8> {
    let req = ConnReq {
        version: rtrs::wire::VERSION,
        cid,
        cid_num,
        recon_cnt: 1,
        path_uuid: Uuid([path; 16]),
        session_uuid: Uuid([session; 16]),
        first_conn,
    };
    let mut buf = vec![0; ConnReq::LEN];
    req.emit(&mut buf).unwrap();
    buf
}

/// Injects a connect request on `port` (ConnIds are per port: the same
/// number may be used on both) and polls.
fn request(server: &mut MockServer, port: usize, conn: u32, private_data: &[u8]) {
    let local = IpAddr::V4(Ipv4Addr::from(PORT_IPS[port]));
    let mock = server.port_mut(port).unwrap();
    let conn = ConnId(conn);
    mock.live.insert(conn);
    mock.cm_events.push_back(CmEvent::ConnectRequest {
        conn,
        local: SocketAddr::new(local, 1234),
        remote: SocketAddr::from((Ipv4Addr::new(10, 99, private_data[12], 2), 40000)),
        private_data: PrivateData::try_from_slice(private_data).unwrap(),
    });
    poll(server, 1);
}

/// Polls a few times, counting the server's allocations (there must be none).
fn poll(server: &mut MockServer, now: u64) {
    armed(|| {
        for _ in 0..16 {
            server.poll(now);
        }
    });
}

fn accepted(server: &MockServer, port: usize, conn: u32) -> bool {
    let mock = server.port(port).unwrap();
    mock.accepted.iter().any(|a| a.conn == ConnId(conn))
}

fn reject_errno(server: &MockServer, port: usize, conn: u32) -> Option<i16> {
    let mock = server.port(port).unwrap();
    mock.rejected
        .iter()
        .find(|(c, _)| *c == ConnId(conn))
        .map(|(_, pd)| ConnRsp::parse(pd).expect("CONN_RSP").errno)
}

#[test]
fn a_path_stays_on_its_port_and_unknown_sessions_are_refused_on_both() {
    let mut server = mock_server();
    // The counter works.
    COUNT.with(|count| count.set(0));
    armed(|| drop(std::hint::black_box(vec![1u8; 10])));
    assert_eq!(COUNT.with(std::cell::Cell::get), 1);
    COUNT.with(|count| count.set(0));
    // Path 1 of session 5 starts on port 0 (cid 0 of 2).
    request(&mut server, 0, 100, &req(0, 2, 1, 5, true));
    assert!(accepted(&server, 0, 100));
    // Its cid 1 arriving on port 1 is refused like any inconsistent
    // CON_REQ, and does not disturb the path.
    request(&mut server, 1, 100, &req(1, 2, 1, 5, true));
    assert!(!accepted(&server, 1, 100));
    assert_eq!(
        reject_errno(&server, 1, 100),
        Some(-(errno::ECONNRESET as i16))
    );
    // The same cid on port 0 completes the path.
    request(&mut server, 0, 101, &req(1, 2, 1, 5, true));
    assert!(accepted(&server, 0, 101));
    // first_conn = 0 for an unknown session: ENXIO on either port.
    for port in 0..2 {
        let conn = 200 + port as u32;
        request(&mut server, port, conn, &req(0, 1, 9, 42, false));
        assert_eq!(
            reject_errno(&server, port, conn),
            Some(-(errno::ENXIO as i16)),
            "port {port}"
        );
    }
    // The session's second path (first_conn = 0 on cid 0) is found by uuid
    // on port 1; ConnId 100 there is a different connection from port 0's.
    request(&mut server, 1, 101, &req(0, 1, 2, 5, false));
    assert!(accepted(&server, 1, 101));
    // Both paths half-open: no session until an INFO_REQ is admitted.
    let usage = server.usage();
    assert_eq!((usage.sessions, usage.paths, usage.connections), (0, 2, 3));

    // INFO_REQ on both paths: both come up, on their ports.
    let mut info = vec![0u8; InfoReq::LEN];
    InfoReq {
        session_name: "multi",
    }
    .emit(&mut info)
    .unwrap();
    server.port_mut(0).unwrap().deliver_send(ConnId(100), &info);
    server.port_mut(1).unwrap().deliver_send(ConnId(101), &info);
    poll(&mut server, 2);
    let events: Vec<Event> = std::iter::from_fn(|| server.next_event()).collect();
    let ups: Vec<(usize, usize)> = events
        .iter()
        .filter_map(|e| match e {
            Event::PathUp { path, port, .. } => {
                Some((*port, server.server.path_port(*path).expect("live path")))
            }
            _ => None,
        })
        .collect();
    assert_eq!(ups, [(0, 0), (1, 1)], "{events:?}");
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Event::SessionOpened { .. }))
            .count(),
        1
    );
    // Each path's memory lives on its own port.
    let buffers = |server: &MockServer, port: usize| server.port(port).unwrap().arena.buffers();
    assert!(buffers(&server, 0) > 0);
    assert_eq!(buffers(&server, 0), buffers(&server, 1));
    // An up path's cid re-sent on the other port is still refused.
    request(&mut server, 1, 102, &req(1, 2, 1, 5, true));
    assert_eq!(
        reject_errno(&server, 1, 102),
        Some(-(errno::ECONNRESET as i16))
    );

    // A disconnect of ConnId 100 on port 1 (never accepted there) leaves
    // port 0's connection 100 alone.
    server
        .port_mut(1)
        .unwrap()
        .cm_events
        .push_back(CmEvent::Disconnected { conn: ConnId(100) });
    poll(&mut server, 3);
    assert_eq!(server.usage().paths, 2);
    assert!(
        std::iter::from_fn(|| server.next_event()).all(|e| !matches!(e, Event::PathDown { .. }))
    );
    // Disconnecting the port 1 path closes it alone; the session stays.
    server
        .port_mut(1)
        .unwrap()
        .cm_events
        .push_back(CmEvent::Disconnected { conn: ConnId(101) });
    poll(&mut server, 4);
    let events: Vec<Event> = std::iter::from_fn(|| server.next_event()).collect();
    assert!(events.iter().any(|e| matches!(e, Event::PathDown { .. })));
    assert!(!events
        .iter()
        .any(|e| matches!(e, Event::SessionClosed { .. })));
    assert_eq!(server.usage().paths, 1);
    assert_eq!(buffers(&server, 1), 0, "port 1's memory is back");
    assert!(buffers(&server, 0) > 0);
    // Admission, INFO and teardown on both ports allocated nothing.
    assert_eq!(COUNT.with(std::cell::Cell::get), 0, "server allocations");
}

/// Queues a CON_REQ too short to parse on `port` (without polling).
fn malformed_request(server: &mut MockServer, port: usize, conn: u32) {
    let local = Ipv4Addr::from(PORT_IPS[port]);
    let mock = server.port_mut(port).unwrap();
    mock.live.insert(ConnId(conn));
    mock.cm_events.push_back(CmEvent::ConnectRequest {
        conn: ConnId(conn),
        local: SocketAddr::from((local, 1234)),
        remote: SocketAddr::from((Ipv4Addr::new(10, 99, 0, 2), 40000)),
        private_data: PrivateData::try_from_slice(&[0; 8]).unwrap(),
    });
}

#[test]
fn poll_budgets_are_totals_shared_round_robin_between_ports() {
    let mut config = small_config();
    config.cm_budget = 2;
    let mut ports = [MockVerbs::new(1 << 20), MockVerbs::new(1 << 20)];
    let mut inner = Server::new(config).expect("config");
    inner.start(&mut ports).expect("listen");
    let mut server = MockServer {
        server: inner,
        ports,
    };
    // Three malformed requests on each port: each costs one CM event and
    // is rejected on its own port.
    for port in 0..2 {
        for conn in 0..3 {
            malformed_request(&mut server, port, conn);
        }
    }
    let rejected =
        |server: &MockServer| [0, 1].map(|port| server.port(port).unwrap().rejected.len());
    // A budget of 2 in total, one per port: neither port starves.
    assert!(server.poll(1));
    assert_eq!(rejected(&server), [1, 1]);
    assert!(server.poll(1));
    assert_eq!(rejected(&server), [2, 2]);
    assert!(server.poll(1));
    assert_eq!(rejected(&server), [3, 3]);
    // Port 1 alone keeps the whole budget; the starting port rotates.
    for conn in 3..6 {
        malformed_request(&mut server, 1, conn);
    }
    assert!(server.poll(1));
    assert_eq!(rejected(&server), [3, 5]);
    assert!(server.poll(1));
    assert_eq!(rejected(&server), [3, 6]);
    assert!(!server.poll(1));
    assert_eq!(server.server.stats().rejected, 9);
    assert_eq!(server.usage(), Usage::default());
}
