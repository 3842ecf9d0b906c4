//! Replays real Linux sessions against Brick's RC QPs, frame by frame.
//!
//! The captures in `tests/vectors/` hold a Linux 6.1 rxe client and server.
//! Brick takes the server's place (10.77.0.1) with the parameters the CM
//! negotiated in the capture (start PSNs, MTU 1024, the peer's QPNs, one QP
//! per RC connection): every client->server RC frame is fed into
//! `Hca::receive` (re-addressed to Brick's QPN; RETHs naming the Linux
//! server's memory re-pointed at Brick regions; ICRC refreshed), and where
//! the capture shows the server sending a request, Brick is given the same
//! work request (READ/WRITE with the captured RETH, SEND with the captured
//! payload, invalidate rkey and immediate). Brick must then put the same
//! frames on the wire, per QP and in order: opcode, PSN, AckReq, RETH, IETH,
//! ImmDt, AETH syndrome and MSN, payload, addresses and ports. Only the IPv4
//! identification (rxe's varies per packet) and therefore the ICRC differ.
//! Responder output (ACKs) and requester output are compared as two streams
//! per QP, since their interleaving depends on poll timing.

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};

use common::Capture;
use roce::hca::{Hca, HcaConfig};
use roce::qp::{Path, QpParams};
use roce::types::{Mtu, Psn, Qpn};
use roce::wire::{fill_icrc, parse_frame, Opcode, RethRepr, RoceFrame, Transport};
use verbs::{
    AccessFlags, ConnId, KeySource, Memory, MemoryRegion, RecvWr, Rkey, SendOp, SendWr, Sge, Sgl,
    Verbs, WcStatus, WorkCompletion, WrId,
};

struct Keys(u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (self.0 >> 33) as u32
    }
}

type ReplayHca = Hca<Vec<u8>, Keys, 256, 4, 4096>;

const SERVER_IP: [u8; 4] = [10, 77, 0, 1];
const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// The frame as a comparable string, IPv4 identification and ICRC cleared.
fn normalised(frame: &RoceFrame<'_>) -> String {
    let mut frame = *frame;
    frame.ip.ident = 0;
    frame.icrc = 0;
    format!("{frame:?}")
}

fn is_response(opcode: Opcode) -> bool {
    matches!(
        opcode,
        Opcode::RcAcknowledge
            | Opcode::RcRdmaReadResponseFirst
            | Opcode::RcRdmaReadResponseMiddle
            | Opcode::RcRdmaReadResponseLast
            | Opcode::RcRdmaReadResponseOnly
    )
}

fn starts_message(opcode: Opcode) -> bool {
    use Opcode::*;
    matches!(
        opcode,
        RcSendFirst
            | RcSendOnly
            | RcSendOnlyWithImmediate
            | RcSendOnlyWithInvalidate
            | RcRdmaWriteFirst
            | RcRdmaWriteOnly
            | RcRdmaWriteOnlyWithImmediate
            | RcRdmaReadRequest
    )
}

fn ends_message(opcode: Opcode) -> bool {
    use Opcode::*;
    !matches!(
        opcode,
        RcSendFirst | RcSendMiddle | RcRdmaWriteFirst | RcRdmaWriteMiddle
    )
}

/// A server message reassembled from the capture: what to post.
struct Message {
    first: usize,
    opcode: Opcode,
    reth: Option<RethRepr>,
    payload: Vec<u8>,
    imm: Option<u32>,
    invalidate: Option<Rkey>,
}

struct Replay {
    compared: usize,
    completions: Vec<WorkCompletion>,
}

fn replay(name: &str) -> Replay {
    let capture = Capture::load(name);
    let frames = capture.frames();
    let (times, rc): (Vec<u64>, Vec<RoceFrame<'_>>) = frames
        .iter()
        .zip(capture.timestamps())
        .filter_map(|(frame, at)| Some((at, parse_frame(frame).ok()?)))
        .filter(|(_, frame)| frame.bth.opcode.transport() == Transport::Rc)
        .map(|(at, frame)| (u64::try_from(at.as_nanos()).unwrap(), frame))
        .unzip();
    let from_client = |frame: &RoceFrame<'_>| frame.ip.dst_addr.octets() == SERVER_IP;

    // Connections, in order of appearance: server QPN (client frames' DestQP)
    // and client QPN (server frames' DestQP).
    let mut server_qpns: Vec<Qpn> = Vec::new();
    let mut client_qpns: Vec<Qpn> = Vec::new();
    for frame in &rc {
        let list = if from_client(frame) {
            &mut server_qpns
        } else {
            &mut client_qpns
        };
        if !list.contains(&frame.bth.dest_qp) {
            list.push(frame.bth.dest_qp);
        }
    }
    assert_eq!(server_qpns.len(), client_qpns.len());

    // Server messages (grouped per QP, FIRST..LAST) and client RETH ranges.
    let mut messages: BTreeMap<usize, Message> = BTreeMap::new();
    let mut open: HashMap<Qpn, usize> = HashMap::new();
    let mut ranges: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (index, frame) in rc.iter().enumerate() {
        if from_client(frame) {
            if let Some(reth) = frame.ext.reth.filter(|reth| reth.dma_length > 0) {
                let end = reth.virtual_address + u64::from(reth.dma_length);
                let range = ranges
                    .entry(reth.rkey.0)
                    .or_insert((reth.virtual_address, end));
                range.0 = range.0.min(reth.virtual_address);
                range.1 = range.1.max(end);
            }
            continue;
        }
        if is_response(frame.bth.opcode) {
            continue;
        }
        let qpn = frame.bth.dest_qp;
        if starts_message(frame.bth.opcode) {
            messages.insert(
                index,
                Message {
                    first: index,
                    opcode: frame.bth.opcode,
                    reth: frame.ext.reth,
                    payload: Vec::new(),
                    imm: None,
                    invalidate: None,
                },
            );
            open.insert(qpn, index);
        }
        let first = open[&qpn];
        let message = messages.get_mut(&first).unwrap();
        message.payload.extend_from_slice(frame.payload);
        message.imm = message.imm.or(frame.ext.immdt.map(|immdt| immdt.immediate));
        message.invalidate = message.invalidate.or(frame.ext.ieth.map(|ieth| ieth.rkey));
        if ends_message(frame.bth.opcode) {
            open.remove(&qpn);
        }
    }

    let server_frame = rc.iter().find(|frame| !from_client(frame)).unwrap();
    let client_frame = rc.iter().find(|frame| from_client(frame)).unwrap();
    let mut hca: Box<ReplayHca> = Box::new(Hca::new(
        vec![0; 16 << 20],
        Keys(7),
        HcaConfig {
            mac: server_frame.eth.src_addr.0,
            ip: SERVER_IP,
        },
    ));

    // One QP per connection with the capture's parameters.
    let mut conns: HashMap<Qpn, ConnId> = HashMap::new();
    let mut ours: HashMap<Qpn, Qpn> = HashMap::new();
    let scratch = {
        let handle = hca.alloc(8 << 20, 64).unwrap();
        hca.reg_mr(handle, RW).unwrap()
    };
    let mut recv_slot = 0u32;
    for (server_qpn, client_qpn) in server_qpns.iter().zip(&client_qpns) {
        let recv_psn = rc
            .iter()
            .find(|frame| from_client(frame) && frame.bth.dest_qp == *server_qpn)
            .unwrap()
            .bth
            .psn;
        let first_request = rc.iter().find(|frame| {
            !from_client(frame)
                && frame.bth.dest_qp == *client_qpn
                && !is_response(frame.bth.opcode)
        });
        let any_server = rc
            .iter()
            .find(|frame| !from_client(frame) && frame.bth.dest_qp == *client_qpn)
            .unwrap();
        let conn = hca.create_qp().unwrap();
        let params = QpParams {
            peer_qpn: *client_qpn,
            send_psn: first_request.map_or(Psn::new(0), |frame| frame.bth.psn),
            recv_psn,
            mtu: Mtu::Mtu1024,
            local_ack_timeout: 19,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 0,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            remote_access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            path: Path {
                local_mac: any_server.eth.src_addr.0,
                peer_mac: client_frame.eth.src_addr.0,
                local_ip: SERVER_IP,
                peer_ip: client_frame.ip.src_addr.octets(),
                udp_src_port: any_server.udp.src_port,
                tos: any_server.ip.tos,
                ttl: any_server.ip.ttl,
            },
            selective_retransmission: false,
        };
        // The passive side: ready to receive before the REP, ready to send
        // once the connection is established (here: its first request).
        hca.ready_to_receive(conn, params).unwrap();
        for _ in 0..64 {
            let request = RecvWr {
                wr_id: WrId(u64::from(recv_slot)),
                sgl: Sgl::single(Sge::new(scratch.lkey, recv_slot * 8192, 8192)),
            };
            recv_slot += 1;
            hca.post_recv(conn, &[request]).unwrap();
        }
        ours.insert(*server_qpn, hca.qpn(conn).unwrap());
        conns.insert(*client_qpn, conn);
    }
    // Brick regions standing in for the Linux server's registered memory.
    let mut regions: HashMap<u32, (MemoryRegion, u64)> = HashMap::new();
    for (rkey, (start, end)) in &ranges {
        let len = u32::try_from(end - start).unwrap().max(64);
        let handle = hca.alloc(len, 64).unwrap();
        regions.insert(*rkey, (hca.reg_mr(handle, RW).unwrap(), *start));
    }

    // Per client QPN: Brick's responder stream and requester stream.
    let mut streams: HashMap<(Qpn, bool), VecDeque<Vec<u8>>> = HashMap::new();
    let poll =
        |hca: &mut ReplayHca, now: u64, streams: &mut HashMap<(Qpn, bool), VecDeque<Vec<u8>>>| {
            let mut out: Vec<Vec<u8>> = Vec::new();
            while hca.poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                let mut frame = h.to_vec();
                for piece in p {
                    frame.extend_from_slice(piece);
                }
                frame.extend_from_slice(t);
                out.push(frame);
            }) {}
            for frame in out {
                let parsed = parse_frame(&frame).expect("Brick's frames parse");
                let key = (parsed.bth.dest_qp, is_response(parsed.bth.opcode));
                streams.entry(key).or_default().push_back(frame);
            }
        };

    let mut compared = 0;
    let mut next_wr = 1u64;
    let mut scratch_offset = 1 << 20;
    for (index, captured) in rc.iter().enumerate() {
        // The capture's own clock: Brick's retransmit timer sees the round
        // trips the Linux client really took.
        let now = times[index];
        if from_client(captured) {
            let mut headers = captured.headers();
            headers.bth.dest_qp = ours[&captured.bth.dest_qp];
            if let Some(reth) = headers.ext.reth.as_mut() {
                if let Some((region, start)) = regions.get(&reth.rkey.0) {
                    reth.virtual_address = region.iova + (reth.virtual_address - start);
                    reth.rkey = region.rkey;
                }
            }
            let mut frame = vec![0u8; headers.frame_len(captured.payload.len())];
            let len = headers.emit_frame(&mut frame, captured.payload).unwrap();
            frame.truncate(len);
            fill_icrc(&mut frame).unwrap();
            hca.receive(now, &frame);
            poll(&mut hca, now, &mut streams);
            continue;
        }
        if let Some(message) = messages.get(&index) {
            assert_eq!(message.first, index);
            let len = message.payload.len() as u32;
            let op = if message.opcode == Opcode::RcRdmaReadRequest {
                let reth = message.reth.unwrap();
                let sgl = Sgl::single(Sge::new(scratch.lkey, scratch_offset, reth.dma_length));
                scratch_offset += reth.dma_length.max(64);
                SendOp::RdmaRead {
                    sgl,
                    remote_addr: reth.virtual_address,
                    rkey: reth.rkey,
                }
            } else {
                hca.write(scratch.handle, scratch_offset, &message.payload)
                    .unwrap();
                let sgl = if len == 0 {
                    Sgl::new()
                } else {
                    Sgl::single(Sge::new(scratch.lkey, scratch_offset, len))
                };
                scratch_offset += len.max(64);
                match (message.reth, message.invalidate) {
                    (Some(reth), _) => SendOp::RdmaWrite {
                        sgl,
                        remote_addr: reth.virtual_address,
                        rkey: reth.rkey,
                        imm: message.imm,
                    },
                    (None, Some(invalidate)) => SendOp::SendWithInv { sgl, invalidate },
                    (None, None) => SendOp::Send {
                        sgl,
                        imm: message.imm,
                    },
                }
            };
            let conn = conns[&captured.bth.dest_qp];
            if hca.qp_state(conn) == Some(roce::qp::QpState::Rtr) {
                hca.ready_to_send(conn).unwrap();
            }
            let request = SendWr {
                wr_id: WrId(next_wr),
                signaled: true,
                op,
            };
            next_wr += 1;
            hca.post_send(conn, &[request]).unwrap();
        }
        poll(&mut hca, now, &mut streams);
        let key = (captured.bth.dest_qp, is_response(captured.bth.opcode));
        let ours = streams
            .get_mut(&key)
            .and_then(VecDeque::pop_front)
            .unwrap_or_else(|| {
                panic!("{name} #{index}: Brick sent nothing where Linux sent {captured}")
            });
        let ours = parse_frame(&ours).unwrap();
        assert_eq!(
            normalised(&ours),
            normalised(captured),
            "{name} #{index}: Brick {ours} vs Linux {captured}"
        );
        compared += 1;
    }
    for (key, stream) in &streams {
        assert!(stream.is_empty(), "{name}: Brick sent more on {key:?}");
    }
    let mut completions = vec![WorkCompletion::default(); 4096];
    let n = hca.poll_cq(&mut completions);
    completions.truncate(n);
    assert_eq!(hca.counters().drop_bad_checksum, 0);
    assert_eq!(hca.counters().naks_sent, 0);
    // Under the capture's real round trips the adaptive timer never fires.
    assert_eq!(hca.counters().timeouts, 0, "{name}: {:?}", hca.counters());
    assert!(
        hca.counters().rtt_samples > 0,
        "{name}: {:?}",
        hca.counters()
    );
    for conn in conns.values() {
        eprintln!("{name}: {:?}", hca.qp(*conn).unwrap().rtt_estimate());
    }
    Replay {
        compared,
        completions,
    }
}

#[test]
fn rping_server_side_matches_linux() {
    let replay = replay("rping-linux");
    assert_eq!(
        replay.compared, 18,
        "3 pings: 6 ACKs, 3 READs, 6 SENDs, 3 WRITEs"
    );
    assert!(replay
        .completions
        .iter()
        .all(|wc| wc.status == WcStatus::Success));
    let reads = replay
        .completions
        .iter()
        .filter(|wc| wc.opcode == verbs::WcOpcode::RdmaRead && wc.byte_len == 64)
        .count();
    assert_eq!(reads, 3);
    let receives = replay
        .completions
        .iter()
        .filter(|wc| wc.opcode.is_receive())
        .count();
    assert_eq!(receives, 6);
}

#[test]
fn rnbd_server_side_matches_linux() {
    let replay = replay("rnbd-linux-srv-linux-clt");
    eprintln!("rnbd replay: {} frames compared", replay.compared);
    assert!(replay.compared > 150, "{}", replay.compared);
    assert!(replay
        .completions
        .iter()
        .all(|wc| wc.status == WcStatus::Success));
}
