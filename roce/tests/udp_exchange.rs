//! The HCA in UDP mode over two real sockets (127.0.0.1 and 127.0.0.2).
//!
//! Two `Hca`s made with `LinkMode::Udp`, each on a `hal::hosted::UdpNic`
//! bound to the same port on its own loopback address, in one process and
//! one thread, on the real clock: RDMA CM connect with private data, SEND /
//! SEND_WITH_IMM / RDMA WRITE / WRITE_WITH_IMM / RDMA READ in both
//! directions with byte-exact data (400 one at a time, sizes from 0 B to
//! 1 MiB, then 48 in flight at once), disconnect;
//! hostile datagrams (truncated, bad TVer, bad ICRC, wrong sender port) are
//! dropped and counted. `BRICK_TEST_UDP_PORT=P` makes the tests use ports P
//! and P + 1 instead of free ones.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};

use hal::hosted::{wait_readable, MonotonicClock, UdpNic};
use hal::{Clock, DatagramNic, NicError};
use roce::hca::{Hca, HcaConfig, LinkMode};
use roce::qp::QpState;
use roce::udp::{datagram_icrc, PSEUDO_HEADERS_LEN};
use verbs::{
    AccessFlags, CmEvent, ConnId, ConnParams, KeySource, Memory, MemoryRegion, RecvWr, SendOp,
    SendWr, Sge, Sgl, Verbs, WcOpcode, WcStatus, WorkCompletion, WrId,
};

const CLIENT: usize = 0;
const SERVER: usize = 1;
const CM_PORT: u16 = 7174;
const SECOND: u64 = 1_000_000_000;
const MIB: u32 = 1 << 20;

struct TestKeys(u64);

impl KeySource for TestKeys {
    fn next_u32(&mut self) -> u32 {
        (splitmix(&mut self.0) >> 32) as u32
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

type UdpHca = Hca<Vec<u8>, TestKeys, 16, 4, 1024>;

/// Binds 127.0.0.1 and 127.0.0.2 on one free port (as two RoCEv2 hosts on
/// port 4791 would be). `BRICK_TEST_UDP_PORT=P` picks the port: P + `test`,
/// so that the tests of this file may run in parallel.
fn pair(test: u16) -> (UdpNic, UdpNic) {
    if let Ok(port) = std::env::var("BRICK_TEST_UDP_PORT") {
        let port: u16 = port.parse().expect("BRICK_TEST_UDP_PORT is a port number");
        let port = port
            .checked_add(test)
            .expect("BRICK_TEST_UDP_PORT too high");
        let a = UdpNic::bind(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
        let b = UdpNic::bind(SocketAddr::from(([127, 0, 0, 2], port))).unwrap();
        return (a, b);
    }
    for _ in 0..20 {
        let a = UdpNic::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = a.local_addr().port();
        if let Ok(b) = UdpNic::bind(SocketAddr::from(([127, 0, 0, 2], port))) {
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

/// One endpoint: HCA, socket, what it surfaced, and its regions.
struct Side {
    hca: Box<UdpHca>,
    nic: UdpNic,
    events: Vec<CmEvent>,
    completions: Vec<WorkCompletion>,
    /// Datagrams the socket refused (`Busy`): lost, the transport resends.
    busy: u64,
    /// Source of SENDs and WRITEs, target of the peer's READs.
    src: MemoryRegion,
    /// Target of the peer's WRITEs and of our READs.
    dst: MemoryRegion,
    /// Receive buffers.
    recv: MemoryRegion,
}

struct Net {
    sides: [Side; 2],
    clock: MonotonicClock,
}

fn region(hca: &mut UdpHca, len: u32) -> MemoryRegion {
    let handle = hca.alloc(len, 4096).expect("alloc");
    hca.reg_mr(
        handle,
        AccessFlags::LOCAL_WRITE
            .union(AccessFlags::REMOTE_WRITE)
            .union(AccessFlags::REMOTE_READ),
    )
    .expect("reg_mr")
}

fn side(nic: UdpNic, last: u8) -> Side {
    let SocketAddr::V4(local) = nic.local_addr() else {
        unreachable!("bound to IPv4")
    };
    let config = HcaConfig {
        mac: [0x52, 0x54, 0, 0, 0, last],
        ip: local.ip().octets(),
    };
    let mut hca = Box::new(Hca::with_link(
        vec![0u8; 4 << 20],
        TestKeys(u64::from(last) * 7919),
        config,
        LinkMode::Udp { port: local.port() },
    ));
    let src = region(&mut hca, MIB);
    let dst = region(&mut hca, MIB);
    let recv = region(&mut hca, MIB);
    Side {
        hca,
        nic,
        events: Vec::new(),
        completions: Vec::new(),
        busy: 0,
        src,
        dst,
        recv,
    }
}

/// Sends one datagram: the HCA's header, payload pieces and trailer as one
/// gather list.
fn send(
    nic: &mut UdpNic,
    to: SocketAddrV4,
    header: &[u8],
    payload: &[&[u8]],
    trailer: &[u8],
) -> Result<(), NicError> {
    let mut pieces: [&[u8]; 16] = [&[]; 16];
    let count = payload.len();
    if count >= pieces.len() {
        return Err(NicError::FrameTooLong);
    }
    pieces[..count].copy_from_slice(payload);
    pieces[count] = trailer;
    nic.transmit(SocketAddr::V4(to), header, &pieces[..=count])
}

impl Side {
    /// Receives what is there (bounded), sends what is due, collects events
    /// and completions. Returns whether anything happened.
    fn pump(&mut self, now: u64) -> bool {
        let mut busy = false;
        for _ in 0..64 {
            let hca = &mut self.hca;
            let got = self
                .nic
                .receive(|datagram, from| hca.receive_datagram(now, from, datagram))
                .expect("receive");
            if got.is_none() {
                break;
            }
            busy = true;
        }
        let nic = &mut self.nic;
        let refused = &mut self.busy;
        busy |= self.hca.poll_datagrams(
            now,
            &mut |to: SocketAddrV4, header: &[u8], payload: &[&[u8]], trailer: &[u8]| match send(
                nic, to, header, payload, trailer,
            ) {
                Ok(()) => {}
                Err(NicError::Busy) => *refused += 1,
                Err(error) => panic!("transmit: {error}"),
            },
        );
        while let Some(event) = self.hca.poll_cm_event() {
            self.events.push(event);
            busy = true;
        }
        let mut completions = [WorkCompletion::default(); 64];
        loop {
            let count = self.hca.poll_cq(&mut completions);
            if count == 0 {
                break;
            }
            self.completions.extend_from_slice(&completions[..count]);
            busy = true;
        }
        busy
    }
}

impl Net {
    fn new(test: u16) -> Self {
        let (a, b) = pair(test);
        Net {
            sides: [side(a, 1), side(b, 2)],
            clock: MonotonicClock::new(),
        }
    }

    fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Runs both endpoints until `done` or `timeout` ns passed; sleeps in
    /// poll(2) on both sockets when idle.
    fn run_until(&mut self, timeout: u64, mut done: impl FnMut(&mut Net) -> bool) -> bool {
        let deadline = self.now() + timeout;
        loop {
            if done(self) {
                return true;
            }
            let now = self.now();
            if now >= deadline {
                return false;
            }
            let mut busy = false;
            for side in &mut self.sides {
                busy |= side.pump(now);
            }
            if !busy {
                let wake = self
                    .sides
                    .iter()
                    .filter_map(|side| side.hca.poll_at(now))
                    .min()
                    .unwrap_or(u64::MAX)
                    .min(now + 10_000_000)
                    .min(deadline);
                if wake > now {
                    let fds = [self.sides[0].nic.raw_fd(), self.sides[1].nic.raw_fd()];
                    wait_readable(&fds, Some(wake)).expect("poll");
                }
            }
        }
    }

    fn take_event(&mut self, side: usize, pick: impl Fn(&CmEvent) -> bool) -> Option<CmEvent> {
        let events = &mut self.sides[side].events;
        let index = events.iter().position(pick)?;
        Some(events.remove(index))
    }

    fn wait_completion(&mut self, side: usize, id: u64) -> WorkCompletion {
        assert!(
            self.run_until(30 * SECOND, |net| net.sides[side]
                .completions
                .iter()
                .any(|wc| wc.wr_id == WrId(id))),
            "no completion {id} on side {side}"
        );
        let completions = &mut self.sides[side].completions;
        let index = completions
            .iter()
            .position(|wc| wc.wr_id == WrId(id))
            .unwrap();
        completions.remove(index)
    }

    fn server_addr(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), CM_PORT)
    }
}

fn params(private_data: &[u8]) -> ConnParams<'_> {
    ConnParams {
        responder_resources: 4,
        initiator_depth: 4,
        ..ConnParams::new(private_data, 64, 64)
    }
}

/// listen / connect / accept with private data both ways; returns the
/// client's and the server's connection.
fn connect(net: &mut Net) -> [ConnId; 2] {
    net.sides[SERVER].hca.listen(CM_PORT).expect("listen");
    let client = net.sides[CLIENT]
        .hca
        .connect(net.server_addr(), &params(b"hello over udp"))
        .expect("connect");
    assert!(net.run_until(10 * SECOND, |net| net.sides[SERVER]
        .events
        .iter()
        .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))));
    let Some(CmEvent::ConnectRequest {
        conn: server,
        local,
        remote,
        private_data,
    }) = net.take_event(SERVER, |e| matches!(e, CmEvent::ConnectRequest { .. }))
    else {
        unreachable!()
    };
    assert!(private_data.as_slice().starts_with(b"hello over udp"));
    assert_eq!(local, net.server_addr());
    assert_eq!(remote.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    net.sides[SERVER]
        .hca
        .accept(server, &params(b"welcome, udp"))
        .expect("accept");
    assert!(net.run_until(10 * SECOND, |net| net.sides[CLIENT]
        .events
        .iter()
        .any(|e| matches!(e, CmEvent::Established { .. }))));
    let Some(CmEvent::Established { conn, private_data }) =
        net.take_event(CLIENT, |e| matches!(e, CmEvent::Established { .. }))
    else {
        unreachable!()
    };
    assert_eq!(conn, client);
    assert!(private_data.as_slice().starts_with(b"welcome, udp"));
    assert!(net
        .run_until(10 * SECOND, |net| net.sides[SERVER].events.iter().any(
            |e| matches!(e, CmEvent::Established { conn, .. } if *conn == server)
        )));
    net.sides[SERVER].events.clear();
    assert_eq!(net.sides[CLIENT].hca.qp_state(client), Some(QpState::Rts));
    assert_eq!(net.sides[SERVER].hca.qp_state(server), Some(QpState::Rts));
    [client, server]
}

fn pattern(seed: u64, len: u32) -> Vec<u8> {
    let mut state = seed;
    let mut bytes = Vec::with_capacity(len as usize + 8);
    while bytes.len() < len as usize {
        bytes.extend_from_slice(&splitmix(&mut state).to_le_bytes());
    }
    bytes.truncate(len as usize);
    bytes
}

fn write_memory(side: &mut Side, region: MemoryRegion, bytes: &[u8]) {
    let len = bytes.len() as u32;
    side.hca
        .with_slice_mut(region.handle, 0, len, |target| {
            target.copy_from_slice(bytes)
        })
        .expect("write memory");
}

fn read_memory(side: &Side, region: MemoryRegion, len: u32) -> Vec<u8> {
    side.hca
        .with_slice(region.handle, 0, len, <[u8]>::to_vec)
        .expect("read memory")
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Send,
    SendWithImm,
    Write,
    WriteWithImm,
    Read,
}

/// One work request from `from` to the other side, checked end to end.
fn run_op(net: &mut Net, conns: [ConnId; 2], from: usize, kind: Kind, len: u32, id: u64) {
    let to = 1 - from;
    let data = pattern(id, len);
    let imm = (id as u32) ^ 0x5a5a_0000;
    // What the bytes land on is poisoned first, so stale data cannot pass.
    let poison = vec![0xee; len as usize];
    let (source, target) = match kind {
        Kind::Read => ((to, net.sides[to].src), (from, net.sides[from].dst)),
        Kind::Send | Kind::SendWithImm => ((from, net.sides[from].src), (to, net.sides[to].recv)),
        Kind::Write | Kind::WriteWithImm => ((from, net.sides[from].src), (to, net.sides[to].dst)),
    };
    write_memory(&mut net.sides[source.0], source.1, &data);
    write_memory(&mut net.sides[target.0], target.1, &poison);
    let consumes_receive = matches!(kind, Kind::Send | Kind::SendWithImm | Kind::WriteWithImm);
    if consumes_receive {
        let recv = net.sides[to].recv;
        let request = RecvWr {
            wr_id: WrId(id),
            sgl: Sgl::single(Sge::new(recv.lkey, 0, MIB)),
        };
        net.sides[to]
            .hca
            .post_recv(conns[to], &[request])
            .expect("post_recv");
    }
    let src = net.sides[from].src;
    // Gather from up to three pieces of the source.
    let sgl = if len >= 3 && id % 3 == 0 {
        let (a, b) = (len / 3, len / 3 + len / 5);
        Sgl::try_from_slice(&[
            Sge::new(src.lkey, 0, a),
            Sge::new(src.lkey, a, b - a),
            Sge::new(src.lkey, b, len - b),
        ])
        .unwrap()
    } else {
        Sgl::single(Sge::new(src.lkey, 0, len))
    };
    let peer_dst = net.sides[to].dst;
    let peer_src = net.sides[to].src;
    let dst = net.sides[from].dst;
    let op = match kind {
        Kind::Send => SendOp::Send { sgl, imm: None },
        Kind::SendWithImm => SendOp::Send {
            sgl,
            imm: Some(imm),
        },
        Kind::Write | Kind::WriteWithImm => SendOp::RdmaWrite {
            sgl,
            remote_addr: peer_dst.remote_addr(0),
            rkey: peer_dst.rkey,
            imm: matches!(kind, Kind::WriteWithImm).then_some(imm),
        },
        Kind::Read => SendOp::RdmaRead {
            sgl: Sgl::single(Sge::new(dst.lkey, 0, len)),
            remote_addr: peer_src.remote_addr(0),
            rkey: peer_src.rkey,
        },
    };
    let request = SendWr {
        wr_id: WrId(id),
        signaled: true,
        op,
    };
    net.sides[from]
        .hca
        .post_send(conns[from], &[request])
        .expect("post_send");
    let wc = net.wait_completion(from, id);
    assert_eq!(wc.status, WcStatus::Success, "{kind:?} {len} B: {wc:?}");
    if consumes_receive {
        let wc = net.wait_completion(to, id);
        assert_eq!(wc.status, WcStatus::Success, "{kind:?} {len} B: {wc:?}");
        assert_eq!(wc.byte_len, len);
        match kind {
            Kind::Send => assert_eq!((wc.opcode, wc.imm), (WcOpcode::Recv, None)),
            Kind::SendWithImm => assert_eq!((wc.opcode, wc.imm), (WcOpcode::Recv, Some(imm))),
            _ => assert_eq!((wc.opcode, wc.imm), (WcOpcode::RecvRdmaWithImm, Some(imm))),
        }
    }
    let landed = read_memory(&net.sides[target.0], target.1, len);
    assert!(
        landed == data,
        "{kind:?} of {len} B (id {id}): data differs"
    );
}

/// Sizes log-uniform from 0 to 1 MiB, with both ends included.
fn size(state: &mut u64, index: u64) -> u32 {
    match index {
        0 => 0,
        1 => MIB,
        _ => {
            let random = splitmix(state);
            let exponent = (random % 21) as u32;
            ((random >> 8) % (u64::from(1u32 << exponent) + 1)) as u32
        }
    }
}

/// 48 work requests in flight at once, client to server: SEND_WITH_IMM,
/// RDMA WRITE and RDMA READ into separate 32 KiB slots, checked afterwards.
fn pipelined(net: &mut Net, conns: [ConnId; 2], state: &mut u64) {
    const SLOT: u32 = 32 << 10;
    const COUNT: u32 = 16;
    let (client, server) = (&net.sides[CLIENT], &net.sides[SERVER]);
    let (src, dst, peer_src, peer_dst, peer_recv) =
        (client.src, client.dst, server.src, server.dst, server.recv);
    let lens: Vec<u32> = (0..COUNT)
        .map(|_| (splitmix(state) % u64::from(SLOT + 1)) as u32)
        .collect();
    let data: Vec<Vec<u8>> = (0..COUNT)
        .map(|k| pattern(1000 + u64::from(k), SLOT))
        .collect();
    for k in 0..COUNT {
        let offset = k * SLOT;
        for (side, region) in [(CLIENT, src), (SERVER, peer_src)] {
            net.sides[side]
                .hca
                .with_slice_mut(region.handle, offset, SLOT, |target| {
                    target.copy_from_slice(&data[k as usize])
                })
                .unwrap();
        }
        let request = RecvWr {
            wr_id: WrId(5000 + u64::from(k)),
            sgl: Sgl::single(Sge::new(peer_recv.lkey, offset, SLOT)),
        };
        net.sides[SERVER]
            .hca
            .post_recv(conns[SERVER], &[request])
            .unwrap();
    }
    let mut requests = Vec::new();
    for k in 0..COUNT {
        let (offset, len, id) = (k * SLOT, lens[k as usize], 5000 + u64::from(k));
        let sgl = Sgl::single(Sge::new(src.lkey, offset, len));
        requests.push(SendWr {
            wr_id: WrId(id),
            signaled: true,
            op: SendOp::Send {
                sgl: sgl.clone(),
                imm: Some(k),
            },
        });
        requests.push(SendWr {
            wr_id: WrId(id + 100),
            signaled: true,
            op: SendOp::RdmaWrite {
                sgl,
                remote_addr: peer_dst.remote_addr(offset),
                rkey: peer_dst.rkey,
                imm: None,
            },
        });
        requests.push(SendWr {
            wr_id: WrId(id + 200),
            signaled: true,
            op: SendOp::RdmaRead {
                sgl: Sgl::single(Sge::new(dst.lkey, offset, len)),
                remote_addr: peer_src.remote_addr(offset),
                rkey: peer_src.rkey,
            },
        });
    }
    net.sides[CLIENT]
        .hca
        .post_send(conns[CLIENT], &requests)
        .unwrap();
    let want = 3 * COUNT as usize;
    assert!(net.run_until(30 * SECOND, |net| {
        net.sides[CLIENT].completions.len() >= want
            && net.sides[SERVER].completions.len() >= COUNT as usize
    }));
    let client_ids: Vec<u64> = net.sides[CLIENT]
        .completions
        .drain(..)
        .map(|wc| {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            wc.wr_id.0
        })
        .collect();
    let expected: Vec<u64> = requests.iter().map(|request| request.wr_id.0).collect();
    assert_eq!(client_ids, expected, "completions in posting order");
    for (k, wc) in net.sides[SERVER].completions.drain(..).enumerate() {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!((wc.wr_id, wc.imm), (WrId(5000 + k as u64), Some(k as u32)));
        assert_eq!(wc.byte_len, lens[k]);
    }
    for k in 0..COUNT {
        let (offset, len) = (k * SLOT, lens[k as usize]);
        let want = &data[k as usize][..len as usize];
        for (side, region) in [(SERVER, peer_recv), (SERVER, peer_dst), (CLIENT, dst)] {
            let got = net.sides[side]
                .hca
                .with_slice(region.handle, offset, len, <[u8]>::to_vec)
                .unwrap();
            assert!(got == want, "slot {k} of side {side}: data differs");
        }
    }
}

#[test]
fn connect_exchange_disconnect_over_udp() {
    let mut net = Net::new(0);
    let conns = connect(&mut net);
    let kinds = [
        Kind::Send,
        Kind::SendWithImm,
        Kind::Write,
        Kind::WriteWithImm,
        Kind::Read,
    ];
    let mut state = 0x0bad_cafe;
    let mut bytes = 0u64;
    let count = 400;
    for id in 0..count {
        let kind = kinds[(id % 5) as usize];
        let from = ((id / 5) % 2) as usize;
        let len = size(&mut state, id);
        bytes += u64::from(len);
        run_op(&mut net, conns, from, kind, len, id + 1);
    }
    pipelined(&mut net, conns, &mut state);
    eprintln!(
        "{count} + 48 WRs, {} MiB, busy drops {} / {}, retransmits: {:?}",
        bytes >> 20,
        net.sides[0].busy,
        net.sides[1].busy,
        [
            net.sides[0].hca.counters().retransmissions,
            net.sides[1].hca.counters().retransmissions
        ]
    );
    for side in &net.sides {
        let counters = side.hca.counters();
        assert_eq!(counters.drop_bad_checksum, 0);
        assert_eq!(counters.drop_malformed, 0);
        assert_eq!(counters.drop_bad_address, 0);
    }
    net.sides[CLIENT]
        .hca
        .disconnect(conns[CLIENT])
        .expect("disconnect");
    assert!(net.run_until(10 * SECOND, |net| {
        net.sides[SERVER]
            .events
            .iter()
            .any(|e| matches!(e, CmEvent::Disconnected { conn } if *conn == conns[SERVER]))
            && net.sides[CLIENT]
                .events
                .iter()
                .any(|e| matches!(e, CmEvent::Disconnected { conn } if *conn == conns[CLIENT]))
    }));
    for (side, conn) in conns.into_iter().enumerate() {
        assert_eq!(net.sides[side].hca.qp_state(conn), Some(QpState::Err));
        net.sides[side].hca.destroy(conn).expect("destroy");
    }
    for side in &net.sides {
        assert!(side.hca.control_counters().mads_in >= 2);
        assert_eq!(side.hca.control_counters().arp_out, 0);
    }
}

#[test]
fn hostile_datagrams_are_dropped_and_counted() {
    let mut net = Net::new(1);
    let conns = connect(&mut net);
    let server = net.sides[SERVER].nic.local_addr();
    let SocketAddr::V4(server_v4) = server else {
        unreachable!()
    };
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let SocketAddr::V4(stranger_addr) = stranger.local_addr().unwrap() else {
        unreachable!()
    };

    // A well-formed RC SEND_ONLY to QPN 0x123456 with the ICRC the stranger's
    // address gives: it passes the ICRC and is dropped for its QPN.
    let mut good = vec![0x04, 0, 0xff, 0xff, 0, 0x12, 0x34, 0x56, 0x80, 0, 0, 1];
    good.extend_from_slice(b"data");
    good.extend_from_slice(&[0; 4]);
    let icrc = datagram_icrc(stranger_addr, *server_v4.ip(), &good).unwrap();
    let end = good.len();
    good[end - 4..].copy_from_slice(&icrc.to_le_bytes());

    let mut bad_icrc = good.clone();
    bad_icrc[13] ^= 0x40;
    let mut bad_tver = good.clone();
    bad_tver[1] |= 0x01;
    let mut bad_pad = good.clone();
    bad_pad[1] |= 0x30; // PadCnt 3: covered by the ICRC
    let truncated = good[..10].to_vec();
    let opcode_unknown = {
        let mut d = good.clone();
        d[0] = 0x1f; // reserved RC opcode
        d
    };
    let hostile: [(&str, &[u8]); 6] = [
        ("good", &good),
        ("bad icrc", &bad_icrc),
        ("bad tver", &bad_tver),
        ("bad pad", &bad_pad),
        ("truncated", &truncated),
        ("unknown opcode", &opcode_unknown),
    ];
    let before = *net.sides[SERVER].hca.counters();
    for (_, datagram) in hostile {
        stranger.send_to(datagram, server).unwrap();
    }
    // The same good datagram from the client's socket (another port, other
    // address) does not verify: addresses and ports are in the ICRC.
    let client_nic = &mut net.sides[CLIENT].nic;
    client_nic.transmit(server, &good, &[]).unwrap();
    let want = before.frames_in + 7;
    assert!(
        net.run_until(5 * SECOND, |net| net.sides[SERVER].hca.counters().frames_in
            >= want)
    );
    let after = *net.sides[SERVER].hca.counters();
    assert_eq!(after.drop_unknown_qpn - before.drop_unknown_qpn, 1, "good");
    // bad icrc, bad pad, from the client's socket.
    assert_eq!(after.drop_bad_checksum - before.drop_bad_checksum, 3);
    // bad tver, truncated, unknown opcode.
    assert_eq!(after.drop_malformed - before.drop_malformed, 3);
    assert_eq!(
        PSEUDO_HEADERS_LEN, 42,
        "Ethernet + IPv4 + UDP, stripped on send"
    );

    // The connection is unharmed.
    run_op(&mut net, conns, CLIENT, Kind::SendWithImm, 5000, 77);
    run_op(&mut net, conns, SERVER, Kind::Read, 70_000, 78);
}
