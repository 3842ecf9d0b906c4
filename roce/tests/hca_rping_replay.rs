//! Replays the client half of `tests/vectors/rping-linux.pcap` (Linux rping
//! client over rxe) into an `Hca` acting as the rping server (the example's
//! server session: listen on 7174, accept, RDMA READ, SEND, RDMA WRITE, SEND),
//! and checks every frame Brick emits against the captured server frame in
//! every field the spec fixes.
//!
//! Brick picks its own QPN, starting PSN and comm ID: the client frames are
//! rewritten to Brick's choices (DestQP, the PSNs of the client's requests,
//! the RTU/DREQ comm IDs and the DREQ's remote QPN) before they are fed in,
//! and those fields — plus the IP identification, header checksum and ICRC,
//! which follow from them or are free — are compared by structure only. The
//! captured ICMP echo (frames 3-4) is not replayed: Brick does not answer
//! ICMP.
//!
//! The second test does the same the other way round: the server half of the
//! capture replayed into an `Hca` running the example's rping client, its
//! ARP request, REQ, RTU, SENDs, READ responses, ACKs and DREQ compared with
//! the Linux client's.

mod common;
mod hca_support;

#[path = "../examples/rping/hosted.rs"]
mod hosted;
#[path = "../examples/rping/session.rs"]
mod session;

use common::Capture;
use hca_support::TestKeys;
use roce::wire::{parse_frame, Opcode, RoceFrame};
use session::{Server, Status};

const SERVER_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x01];
const SERVER_IP: [u8; 4] = [10, 77, 0, 1];
/// Where the CM body starts in a QP1 frame: Eth 14 + IP 20 + UDP 8 + BTH 12 +
/// DETH 8 + MAD header 24.
const CM_BODY: usize = 86;
/// The client's first request PSN in the capture (the server's REP PSN).
const CAPTURED_CLIENT_PSN: u32 = 5_535_020;

fn is_icmp(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&[0x08, 0x00]) && frame.get(23) == Some(&1)
}

fn from_server(frame: &[u8]) -> bool {
    frame[6..12] == SERVER_MAC
}

/// What Brick chose, learned from its REP.
#[derive(Default, Clone, Copy)]
struct Choices {
    qpn: [u8; 3],
    comm_id: [u8; 4],
    psn: u32,
}

fn read_u24(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]])
}

/// Rewrites a captured client frame to Brick's choices (fresh ICRC).
fn rewrite(frame: &[u8], choices: &Choices) -> Vec<u8> {
    let Ok(parsed) = parse_frame(frame) else {
        return frame.to_vec(); // ARP
    };
    let mut payload = parsed.payload.to_vec();
    let mut bth = parsed.bth;
    if bth.dest_qp.value() == 1 {
        let body = CM_BODY - 62;
        match u16::from_be_bytes([payload[16], payload[17]]) {
            // RTU, DREQ: the remote comm ID is Brick's.
            0x14 | 0x15 => payload[body + 4..body + 8].copy_from_slice(&choices.comm_id),
            _ => {}
        }
        if u16::from_be_bytes([payload[16], payload[17]]) == 0x15 {
            payload[body + 8..body + 11].copy_from_slice(&choices.qpn);
        }
    } else {
        bth.dest_qp = roce::types::Qpn::new(read_u24(&choices.qpn));
        let is_request = !matches!(
            bth.opcode,
            Opcode::RcAcknowledge
                | Opcode::RcRdmaReadResponseFirst
                | Opcode::RcRdmaReadResponseMiddle
                | Opcode::RcRdmaReadResponseLast
                | Opcode::RcRdmaReadResponseOnly
        );
        if is_request {
            let offset = bth.psn.value().wrapping_sub(CAPTURED_CLIENT_PSN);
            bth.psn = roce::types::Psn::new_truncate(choices.psn.wrapping_add(offset));
        }
    }
    let rewritten = RoceFrame {
        bth,
        payload: &payload,
        ..parsed
    };
    let mut out = vec![0u8; rewritten.buffer_len()];
    let len = rewritten.emit(&mut out).expect("re-emit");
    out.truncate(len);
    out
}

/// Compares Brick's frame with the captured one; `masks` are byte ranges
/// Brick chooses itself.
fn compare(index: usize, brick: &[u8], captured: &[u8], choices: &Choices) {
    assert_eq!(brick.len(), captured.len(), "frame {index}: length");
    let mut masked = vec![false; brick.len()];
    let mut mask = |range: std::ops::Range<usize>| {
        for m in &mut masked[range] {
            *m = true;
        }
    };
    if captured.get(12..14) == Some(&[0x08, 0x06]) && brick[..6] == [0xff; 6] {
        // The first answer to a broadcast who-has is broadcast (roce::arp,
        // "Answering a first resolution twice"); the rest is Linux's reply.
        mask(0..6);
    }
    if captured.get(12..14) == Some(&[0x08, 0x00]) {
        mask(18..20); // IP identification: free
        mask(24..26); // IP header checksum: follows
        let len = brick.len();
        mask(len - 4..len); // ICRC: follows (checked valid below)
        let parsed = parse_frame(brick).unwrap_or_else(|e| panic!("frame {index}: {e}"));
        let wanted = parse_frame(captured).expect("captured frame parses");
        if parsed.bth.dest_qp.value() == 1 {
            let kind = u16::from_be_bytes([parsed.payload[16], parsed.payload[17]]);
            mask(CM_BODY..CM_BODY + 4); // our local comm ID
            if kind == 0x13 {
                mask(CM_BODY + 12..CM_BODY + 15); // our QPN
                mask(CM_BODY + 20..CM_BODY + 23); // our starting PSN
            }
        } else if parsed.bth.opcode == Opcode::RcAcknowledge {
            // ACK PSNs are in the client's PSN space: compare relative.
            mask(42 + 9..42 + 12);
            let ours = parsed.bth.psn.value().wrapping_sub(choices.psn);
            let theirs = wanted.bth.psn.value().wrapping_sub(CAPTURED_CLIENT_PSN);
            assert_eq!(ours, theirs, "frame {index}: ACK PSN offset");
        }
    }
    for (offset, ((a, b), m)) in brick.iter().zip(captured).zip(&masked).enumerate() {
        assert!(
            *m || a == b,
            "frame {index}: byte {offset} differs: brick {a:#04x}, capture {b:#04x}\nbrick:   {}\ncapture: {}",
            roce::wire::PrettyPrinter::new(brick),
            roce::wire::PrettyPrinter::new(captured),
        );
    }
}

#[test]
fn brick_rping_server_matches_linux_server() {
    let capture = Capture::load("rping-linux");
    let frames = capture.frames();
    let mut hca = hosted::new_hca(TestKeys(42), SERVER_MAC, SERVER_IP);
    let mut server = Server::new(&mut *hca, 7174, false).expect("server");
    let expected: Vec<(usize, &[u8])> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| from_server(f) && !is_icmp(f))
        .map(|(i, f)| (i + 1, *f))
        .collect();
    let mut emitted: Vec<Vec<u8>> = Vec::new();
    let mut choices = Choices::default();
    let mut now = 1_000_000_000u64;
    let mut status = Status::Running;
    let mut confirmations = 0;
    for frame in frames.iter().filter(|f| !from_server(f) && !is_icmp(f)) {
        now += 100_000;
        let frame = rewrite(frame, &choices);
        hca.receive(now, &frame);
        // Let Brick react completely (events, completions, next WRs).
        loop {
            let mut out: Vec<Vec<u8>> = Vec::new();
            hca.poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                let mut f = h.to_vec();
                p.iter().for_each(|piece| f.extend_from_slice(piece));
                f.extend_from_slice(t);
                out.push(f);
            });
            status = server.step(&mut *hca, &mut |_| {});
            if out.is_empty() && hca.poll_at(now) != Some(now) {
                break;
            }
            for f in out {
                if let Ok(p) = parse_frame(&f) {
                    if p.bth.dest_qp.value() == 1
                        && u16::from_be_bytes([p.payload[16], p.payload[17]]) == 0x13
                    {
                        let body = &f[CM_BODY..];
                        choices.comm_id.copy_from_slice(&body[0..4]);
                        choices.qpn.copy_from_slice(&body[12..15]);
                        choices.psn = read_u24(&body[20..23]);
                    }
                }
                // The unicast second answer to the who-has (roce::arp): not
                // in the capture, counted apart.
                if f.get(12..14) == Some(&[0x08, 0x06]) && f[..6] == CLIENT_MAC {
                    confirmations += 1;
                    continue;
                }
                emitted.push(f);
            }
        }
    }
    // The replay took less than the ARP confirm delay: the unicast second
    // answer comes once the clock passes it, and nothing else does.
    let mut late: Vec<Vec<u8>> = Vec::new();
    hca.poll(now + 100_000_000, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
        let mut f = h.to_vec();
        p.iter().for_each(|piece| f.extend_from_slice(piece));
        f.extend_from_slice(t);
        late.push(f);
    });
    confirmations += late
        .iter()
        .filter(|f| f.get(12..14) == Some(&[0x08, 0x06]) && f[..6] == CLIENT_MAC)
        .count();
    assert_eq!(
        confirmations, 1,
        "one unicast ARP reply after the broadcast one"
    );
    assert_eq!(
        status,
        Status::Done(3),
        "the server saw 3 pings and the DREQ"
    );
    let summary = |frames: &[Vec<u8>]| {
        frames
            .iter()
            .map(|f| roce::wire::PrettyPrinter::new(f).to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        emitted.len(),
        expected.len(),
        "Brick emitted:\n{}",
        summary(&emitted)
    );
    for ((index, captured), brick) in expected.iter().zip(&emitted) {
        compare(*index, brick, captured, &choices);
    }
}

const CLIENT_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x02];
const CLIENT_IP: [u8; 4] = [10, 77, 0, 2];
/// The server's first request PSN in the capture (the client's REQ PSN).
const CAPTURED_SERVER_PSN: u32 = 14_215_331;
/// The Linux client's buffers in the capture: (va, rkey) of source and sink.
const CAPTURED_SOURCE: (u64, u32) = (0x0000_564f_97ad_6d50, 0x584);
const CAPTURED_SINK: (u64, u32) = (0x0000_564f_97ad_6f30, 0x467);

/// What the Brick client chose, learned from what it sent.
#[derive(Default, Clone, Copy)]
struct ClientChoices {
    qpn: [u8; 3],
    comm_id: [u8; 4],
    psn: u32,
    req_tid: [u8; 8],
    dreq_tid: [u8; 8],
    source: (u64, u32),
    sink: (u64, u32),
    sends: usize,
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

/// Rewrites a captured server frame to the Brick client's choices.
fn rewrite_for_client(frame: &[u8], choices: &ClientChoices) -> Vec<u8> {
    let Ok(parsed) = parse_frame(frame) else {
        return frame.to_vec(); // ARP
    };
    let mut payload = parsed.payload.to_vec();
    let mut bth = parsed.bth;
    let mut ext = parsed.ext;
    if bth.dest_qp.value() == 1 {
        let body = CM_BODY - 62;
        match u16::from_be_bytes([payload[16], payload[17]]) {
            0x13 => {
                payload[8..16].copy_from_slice(&choices.req_tid);
                payload[body + 4..body + 8].copy_from_slice(&choices.comm_id);
            }
            0x16 => {
                payload[8..16].copy_from_slice(&choices.dreq_tid);
                payload[body + 4..body + 8].copy_from_slice(&choices.comm_id);
            }
            _ => {}
        }
    } else {
        bth.dest_qp = roce::types::Qpn::new(read_u24(&choices.qpn));
        if !is_response(bth.opcode) {
            let offset = bth.psn.value().wrapping_sub(CAPTURED_SERVER_PSN);
            bth.psn = roce::types::Psn::new_truncate(choices.psn.wrapping_add(offset));
        }
        if let Some(reth) = ext.reth.as_mut() {
            let (va, rkey) = if reth.rkey.0 == CAPTURED_SOURCE.1 {
                (reth.virtual_address - CAPTURED_SOURCE.0, choices.source)
            } else {
                (reth.virtual_address - CAPTURED_SINK.0, choices.sink)
            };
            reth.virtual_address = rkey.0 + va;
            reth.rkey = verbs::Rkey(rkey.1);
        }
    }
    let rewritten = RoceFrame {
        bth,
        ext,
        payload: &payload,
        ..parsed
    };
    let mut out = vec![0u8; rewritten.buffer_len()];
    let len = rewritten.emit(&mut out).expect("re-emit");
    out.truncate(len);
    out
}

/// Learns the Brick client's choices from a frame it sent.
fn learn(frame: &[u8], choices: &mut ClientChoices) {
    let Ok(parsed) = parse_frame(frame) else {
        return;
    };
    if parsed.bth.dest_qp.value() == 1 {
        match u16::from_be_bytes([parsed.payload[16], parsed.payload[17]]) {
            0x10 => {
                let body = &frame[CM_BODY..];
                choices.comm_id.copy_from_slice(&body[0..4]);
                choices.qpn.copy_from_slice(&body[32..35]);
                choices.psn = read_u24(&body[44..47]);
                choices.req_tid.copy_from_slice(&frame[70..78]);
            }
            0x15 => choices.dreq_tid.copy_from_slice(&frame[70..78]),
            _ => {}
        }
    } else if parsed.bth.opcode == Opcode::RcSendOnly && parsed.payload.len() == 16 {
        let info: [u8; 16] = parsed.payload.try_into().expect("16 bytes");
        let (va, rkey, _) = session::decode_info(&info);
        if choices.sends % 2 == 0 {
            choices.source = (va, rkey);
        } else {
            choices.sink = (va, rkey);
        }
        choices.sends += 1;
    }
}

/// Compares the Brick client's frame with the Linux client's.
fn compare_client(index: usize, brick: &[u8], captured: &[u8], choices: &ClientChoices) {
    assert_eq!(brick.len(), captured.len(), "frame {index}: length");
    let mut masked = vec![false; brick.len()];
    let mut mask = |range: std::ops::Range<usize>| {
        for m in &mut masked[range] {
            *m = true;
        }
    };
    if captured.get(12..14) == Some(&[0x08, 0x06]) && brick[..6] == [0xff; 6] {
        // The first answer to a broadcast who-has is broadcast (roce::arp,
        // "Answering a first resolution twice"); the rest is Linux's reply.
        mask(0..6);
    }
    if captured.get(12..14) == Some(&[0x08, 0x00]) {
        mask(18..20); // IP identification: free
        mask(24..26); // IP header checksum: follows
        let len = brick.len();
        mask(len - 4..len); // ICRC: follows (checked valid by parse_frame)
        let parsed = parse_frame(brick).unwrap_or_else(|e| panic!("frame {index}: {e}"));
        let wanted = parse_frame(captured).expect("captured frame parses");
        if parsed.bth.dest_qp.value() == 1 {
            mask(70..78); // TID: random
            mask(CM_BODY..CM_BODY + 4); // our local comm ID
            if u16::from_be_bytes([parsed.payload[16], parsed.payload[17]]) == 0x10 {
                // Brick's selective-retransmission offer, a reserved bit
                // the Linux server ignores (its REP answers 0, so the
                // connection runs standard go-back-N, byte for byte below).
                assert_eq!(brick[CM_BODY + 4], 0x01, "frame {index}: REQ offer bit");
                mask(CM_BODY + 4..CM_BODY + 5);
                mask(CM_BODY + 32..CM_BODY + 35); // our QPN
                mask(CM_BODY + 44..CM_BODY + 47); // our starting PSN
                mask(CM_BODY + 88..CM_BODY + 91); // flow label (from the source port)
                mask(CM_BODY + 142..CM_BODY + 144); // RDMA CM source port: random
            }
        } else {
            // The RC source port folds the (random) RDMA CM source port.
            mask(34..36);
            assert!(
                parsed.udp.src_port >= 0xc000,
                "frame {index}: UDP source port"
            );
            if is_response(parsed.bth.opcode) {
                // Responses to the server's requests: our PSN space.
                mask(42 + 9..42 + 12);
                let ours = parsed.bth.psn.value().wrapping_sub(choices.psn);
                let theirs = wanted.bth.psn.value().wrapping_sub(CAPTURED_SERVER_PSN);
                assert_eq!(ours, theirs, "frame {index}: PSN offset");
            }
            if parsed.bth.opcode == Opcode::RcSendOnly {
                let len = brick.len();
                mask(len - 20..len - 4); // our buffer addresses and rkeys
            }
        }
    }
    for (offset, ((a, b), m)) in brick.iter().zip(captured).zip(&masked).enumerate() {
        assert!(
            *m || a == b,
            "frame {index}: byte {offset} differs: brick {a:#04x}, capture {b:#04x}\nbrick:   {}\ncapture: {}",
            roce::wire::PrettyPrinter::new(brick),
            roce::wire::PrettyPrinter::new(captured),
        );
    }
}

#[test]
fn brick_rping_client_matches_linux_client() {
    let capture = Capture::load("rping-linux");
    let frames = capture.frames();
    let mut hca = hosted::new_hca(TestKeys(77), CLIENT_MAC, CLIENT_IP);
    let server = std::net::SocketAddr::from(([10, 77, 0, 1], 7174));
    let mut client = session::Client::new(&mut *hca, server, 64, 3, true).expect("client");
    let expected: Vec<(usize, &[u8])> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| !from_server(f) && !is_icmp(f))
        .map(|(i, f)| (i + 1, *f))
        .collect();
    let mut emitted: Vec<Vec<u8>> = Vec::new();
    let mut choices = ClientChoices::default();
    let mut now = 1_000_000_000u64;
    let mut status;
    let mut inputs = frames.iter().filter(|f| from_server(f) && !is_icmp(f));
    loop {
        // Let Brick react completely (events, completions, next WRs).
        loop {
            let mut out: Vec<Vec<u8>> = Vec::new();
            hca.poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                let mut f = h.to_vec();
                p.iter().for_each(|piece| f.extend_from_slice(piece));
                f.extend_from_slice(t);
                out.push(f);
            });
            status = client.step(&mut *hca, &mut |_| {});
            if out.is_empty() && hca.poll_at(now) != Some(now) {
                break;
            }
            for f in out {
                learn(&f, &mut choices);
                emitted.push(f);
            }
        }
        let Some(frame) = inputs.next() else { break };
        now += 100_000;
        hca.receive(now, &rewrite_for_client(frame, &choices));
    }
    assert_eq!(status, Status::Done(3), "3 verified pings, then DREQ/DREP");
    let summary = |frames: &[Vec<u8>]| {
        frames
            .iter()
            .map(|f| roce::wire::PrettyPrinter::new(f).to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        emitted.len(),
        expected.len(),
        "Brick emitted:\n{}",
        summary(&emitted)
    );
    for ((index, captured), brick) in expected.iter().zip(&emitted) {
        compare_client(*index, brick, captured, &choices);
    }
}
