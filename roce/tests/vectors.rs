//! The real Linux captures in `tests/vectors/` against the wire layer.
//!
//! Every frame of every capture parses, pretty-prints, re-emits byte for byte
//! from its reprs and, if RoCEv2, verifies its ICRC; the decoded fields agree
//! with tshark's decode (`*.decoded.txt`) and the CM decode (`*.cm.txt`).

mod common;

use std::collections::HashMap;

use common::Capture;
use roce::types::{Mtu, Psn, Qpn, Rkey};
use roce::wire::cm::{self, Message};
use roce::wire::{
    parse_frame, rdma_cm, verify_icrc, ArpRepr, Frame, Opcode, PrettyPrinter, RoceFrame, Syndrome,
};

#[test]
fn every_frame_parses_prints_and_round_trips() {
    let mut total = 0;
    for capture in Capture::all() {
        for (index, bytes) in capture.frames().into_iter().enumerate() {
            let at = format!("{} frame {}", capture.name, index + 1);
            let frame = Frame::parse(bytes).unwrap_or_else(|e| panic!("{at}: {e}"));
            assert!(
                !PrettyPrinter::new(bytes).to_string().contains("(RoCEv2"),
                "{at}"
            );

            let mut emitted = vec![0xa5; frame.buffer_len()];
            let len = frame
                .emit(&mut emitted)
                .unwrap_or_else(|e| panic!("{at}: {e}"));
            assert_eq!(len, bytes.len(), "{at}");
            assert_eq!(emitted, bytes, "{at}: emit(parse(frame)) != frame");

            if let Frame::Roce(roce) = frame {
                assert!(verify_icrc(bytes), "{at}: ICRC");
                assert_eq!(parse_frame(bytes), Ok(roce), "{at}");
                assert!(roce.bth.pkey.is_default_partition(), "{at}");
            }
            total += 1;
        }
    }
    assert!(total > 1900, "only {total} frames");
}

/// tshark's opcode names in `*.decoded.txt`.
fn tshark_opcode(name: &str) -> Option<Opcode> {
    Some(match name {
        "SEND_FIRST" => Opcode::RcSendFirst,
        "SEND_MIDDLE" => Opcode::RcSendMiddle,
        "SEND_LAST" => Opcode::RcSendLast,
        "SEND_ONLY" => Opcode::RcSendOnly,
        "SEND_ONLY_IMM" => Opcode::RcSendOnlyWithImmediate,
        "SEND_ONLY_INV" => Opcode::RcSendOnlyWithInvalidate,
        "RDMA_WRITE_FIRST" => Opcode::RcRdmaWriteFirst,
        "RDMA_WRITE_MIDDLE" => Opcode::RcRdmaWriteMiddle,
        "RDMA_WRITE_LAST" => Opcode::RcRdmaWriteLast,
        "RDMA_WRITE_LAST_IMM" => Opcode::RcRdmaWriteLastWithImmediate,
        "RDMA_WRITE_ONLY" => Opcode::RcRdmaWriteOnly,
        "RDMA_WRITE_ONLY_IMM" => Opcode::RcRdmaWriteOnlyWithImmediate,
        "RDMA_READ_REQ" => Opcode::RcRdmaReadRequest,
        "RDMA_READ_RESP_FIRST" => Opcode::RcRdmaReadResponseFirst,
        "RDMA_READ_RESP_MIDDLE" => Opcode::RcRdmaReadResponseMiddle,
        "RDMA_READ_RESP_LAST" => Opcode::RcRdmaReadResponseLast,
        "RDMA_READ_RESP_ONLY" => Opcode::RcRdmaReadResponseOnly,
        "ACK" => Opcode::RcAcknowledge,
        "UD_SEND_ONLY" => Opcode::UdSendOnly,
        _ => return None,
    })
}

fn hex_u32(text: &str) -> u32 {
    u32::from_str_radix(text.trim_start_matches("0x"), 16).expect(text)
}

/// Checks one RoCEv2 line of a `*.decoded.txt` table against the parsed frame.
fn check_roce_line(at: &str, tokens: &[&str], roce: &RoceFrame<'_>) {
    let opcode = tshark_opcode(tokens[4]).unwrap_or_else(|| panic!("{at}: {}", tokens[4]));
    assert_eq!(roce.bth.opcode, opcode, "{at}");
    assert_eq!(roce.bth.dest_qp, Qpn::new(hex_u32(tokens[5])), "{at}");
    assert_eq!(roce.bth.psn, Psn::new(tokens[6].parse().unwrap()), "{at}");
    let udp_len: usize = tokens[7].parse().unwrap();
    assert_eq!(
        udp_len,
        8 + roce.headers().frame_len(roce.payload.len()) - 14 - 20 - 8,
        "{at}: udplen"
    );
    let mut ack_req = false;
    for token in &tokens[8..] {
        let (key, value) = token.split_once('=').unwrap_or((token, ""));
        match key {
            "ackreq" => ack_req = true,
            "reth.len" => {
                let reth = roce.ext.reth.expect("RETH");
                assert_eq!(reth.dma_length, value.parse::<u32>().unwrap(), "{at}");
            }
            "rkey" => assert_eq!(
                roce.ext.reth.expect("RETH").rkey,
                Rkey(hex_u32(value)),
                "{at}"
            ),
            "imm" => assert_eq!(
                roce.ext.immdt.expect("ImmDt").immediate,
                hex_u32(value),
                "{at}"
            ),
            "ieth(inv_rkey)" => {
                assert_eq!(
                    roce.ext.ieth.expect("IETH").rkey,
                    Rkey(hex_u32(value)),
                    "{at}"
                )
            }
            "aeth" => {
                let syndrome = Syndrome::from(value.parse::<u8>().unwrap());
                assert_eq!(roce.ext.aeth.expect("AETH").syndrome, syndrome, "{at}");
            }
            "msn" => assert_eq!(
                roce.ext.aeth.expect("AETH").msn.value(),
                value.parse::<u32>().unwrap(),
                "{at}"
            ),
            cm_kind if cm_kind.starts_with("CM_") => {
                let cm = cm::Repr::parse(roce.payload).unwrap_or_else(|e| panic!("{at}: {e}"));
                let name = format!("CM_{:?}", cm.message.attribute_id()).to_uppercase();
                assert_eq!(name, cm_kind, "{at}");
            }
            other => panic!("{at}: unexpected decode token {other}"),
        }
    }
    assert_eq!(roce.bth.ack_req, ack_req, "{at}: ackreq");
}

#[test]
fn fields_match_the_tshark_decode() {
    let mut checked = 0;
    for capture in Capture::all() {
        let decoded = capture
            .companion("decoded.txt")
            .expect("every capture has a decode");
        let frames = capture.frames();
        let lines: Vec<&str> = decoded
            .lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert_eq!(lines.len(), frames.len(), "{}: frame count", capture.name);
        for line in lines {
            let tokens: Vec<&str> = line.split_whitespace().collect();
            let number: usize = tokens[0].parse().unwrap();
            let at = format!("{} frame {number}", capture.name);
            match Frame::parse(frames[number - 1]).unwrap() {
                Frame::Roce(roce) => {
                    assert_eq!(roce.ip.src_addr.to_string(), tokens[2], "{at}");
                    assert_eq!(roce.ip.dst_addr.to_string(), tokens[3], "{at}");
                    check_roce_line(&at, &tokens, &roce);
                }
                Frame::Arp {
                    arp: ArpRepr::EthernetIpv4 { operation, .. },
                    ..
                } => {
                    let request = line.contains("Who has");
                    assert!(request || line.contains(" is at "), "{at}");
                    let expected = if request { 1 } else { 2 };
                    assert_eq!(u16::from(operation), expected, "{at}");
                }
                Frame::Ipv4 { ip, .. } => {
                    assert!(line.contains("Echo (ping)"), "{at}");
                    assert_eq!(ip.protocol, roce::wire::ipv4::Protocol::Icmp, "{at}");
                }
                other => panic!("{at}: unexpected {other:?}"),
            }
            checked += 1;
        }
    }
    assert!(checked > 1900, "only {checked} lines");
}

/// `key=value` tokens of a `*.cm.txt` line.
fn key_values(line: &str) -> HashMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|token| token.split_once('='))
        .collect()
}

#[test]
fn cm_fields_match_the_cm_decode() {
    let mut checked = 0;
    for capture in Capture::all() {
        let Some(text) = capture.companion("cm.txt") else {
            continue;
        };
        let frames = capture.frames();
        let mut current: Option<(String, RoceFrame<'_>)> = None;
        for line in text.lines() {
            let fields = key_values(line);
            if !line.starts_with(' ') {
                let tokens: Vec<&str> = line.split_whitespace().collect();
                let number: usize = tokens[0].parse().unwrap();
                let at = format!("{} frame {number}", capture.name);
                let roce = parse_frame(frames[number - 1]).unwrap();
                let (src, dst) = tokens[2].split_once("->").unwrap();
                assert_eq!(roce.ip.src_addr.to_string(), src, "{at}");
                assert_eq!(roce.ip.dst_addr.to_string(), dst, "{at}");
                let cm = cm::Repr::parse(roce.payload).unwrap();
                check_cm_message(&at, line, &cm.message);
                current = Some((at, roce));
                checked += 1;
                continue;
            }
            let (at, roce) = current
                .as_ref()
                .expect("a continuation line follows a message");
            let message = cm::Repr::parse(roce.payload).unwrap().message;
            let trimmed = line.trim_start();
            if trimmed.starts_with("rdma-cm hdr:") {
                let Message::Req(req) = message else {
                    panic!("{at}: CMA header outside a REQ")
                };
                let cma = rdma_cm::Repr::parse(&rdma_cm::Packet::new_unchecked(req.private_data))
                    .unwrap();
                assert_eq!(fields["ipver"], "4", "{at}");
                assert_eq!(cma.src_port.to_string(), fields["sport"], "{at}");
                assert_eq!(cma.src_addr.to_string(), fields["src"], "{at}");
                assert_eq!(cma.dst_addr.to_string(), fields["dst"], "{at}");
            } else if let Some(magic) = fields.get("magic") {
                // RTRS messages are little-endian; roce only checks where they sit.
                // conn_req keeps two AF_IB placeholder bytes before its magic
                // (rtrs.md); conn_rsp starts with it.
                let data = match message {
                    Message::Req(req) => &req.private_data[rdma_cm::HEADER_LEN + 2..],
                    other => other.private_data(),
                };
                let magic = u16::from_str_radix(magic.trim_start_matches("0x"), 16).unwrap();
                assert_eq!(data[..2], magic.to_le_bytes(), "{at}: {trimmed}");
            }
        }
    }
    assert!(checked >= 40, "only {checked} CM messages");
}

fn check_cm_message(at: &str, line: &str, message: &Message<'_>) {
    let fields = key_values(line);
    let kind = line.split_whitespace().nth(3).unwrap_or_default();
    let comm = |key: &str| hex_u32(fields[key]);
    match (kind, message) {
        ("CM_REQ", Message::Req(req)) => {
            assert_eq!(req.local_comm_id, comm("lcomm"), "{at}");
            let svc = fields["svc"].split('(').next().unwrap();
            assert_eq!(
                req.service_id,
                u64::from_str_radix(svc, 16).unwrap(),
                "{at}"
            );
            let port = rdma_cm::tcp_port(req.service_id).expect("an RDMA_PS_TCP service");
            assert!(line.contains(&format!("(port {port})")), "{at}");
            assert_eq!(req.local_qpn, Qpn::new(hex_u32(fields["qpn"])), "{at}");
            assert_eq!(req.starting_psn.to_string(), fields["startPSN"], "{at}");
            assert_eq!(
                req.responder_resources.to_string(),
                fields["resp_res"],
                "{at}"
            );
            assert_eq!(
                req.initiator_depth.to_string(),
                fields["init_depth"],
                "{at}"
            );
            assert_eq!(req.retry_count.to_string(), fields["retry"], "{at}");
            assert_eq!(req.rnr_retry_count.to_string(), fields["rnr_retry"], "{at}");
            assert_eq!(u8::from(req.path_mtu).to_string(), fields["pmtu"], "{at}");
            let timeout = req.primary_path.local_ack_timeout.to_string();
            assert_eq!(timeout, fields["local_ack_timeout"], "{at}");
            assert_eq!(req.transport_type, cm::TransportType::Rc, "{at}");
        }
        ("CM_REP", Message::Rep(rep)) => {
            assert_eq!(rep.local_comm_id, comm("lcomm"), "{at}");
            assert_eq!(rep.remote_comm_id, comm("rcomm"), "{at}");
            assert_eq!(rep.local_qpn, Qpn::new(hex_u32(fields["qpn"])), "{at}");
            assert_eq!(rep.starting_psn.to_string(), fields["startPSN"], "{at}");
            assert_eq!(
                rep.responder_resources.to_string(),
                fields["resp_res"],
                "{at}"
            );
            assert_eq!(
                rep.initiator_depth.to_string(),
                fields["init_depth"],
                "{at}"
            );
        }
        ("CM_RTU", Message::Rtu(rtu)) => {
            assert_eq!(rtu.local_comm_id, comm("lcomm"), "{at}");
            assert_eq!(rtu.remote_comm_id, comm("rcomm"), "{at}");
        }
        ("CM_DREQ", Message::Dreq(dreq)) => {
            assert_eq!(dreq.local_comm_id, comm("lcomm"), "{at}");
            assert_eq!(dreq.remote_comm_id, comm("rcomm"), "{at}");
            assert_eq!(
                dreq.remote_qpn,
                Qpn::new(hex_u32(fields["remote_qpn"])),
                "{at}"
            );
        }
        ("CM_DREP", Message::Drep(drep)) => {
            assert_eq!(drep.local_comm_id, comm("lcomm"), "{at}");
            assert_eq!(drep.remote_comm_id, comm("rcomm"), "{at}");
        }
        (kind, message) => panic!("{at}: decode says {kind}, parsed {message:?}"),
    }
}

/// The facts the vectors README states about rping-linux.pcap.
#[test]
fn rping_connection_and_first_ping() {
    let capture = Capture::load("rping-linux");
    let frames = capture.frames();
    let roce = |n: usize| parse_frame(frames[n - 1]).unwrap();
    let cm = |n: usize| cm::Repr::parse(roce(n).payload).unwrap().message;

    let Message::Req(req) = cm(5) else {
        panic!("frame 5 is the REQ")
    };
    assert_eq!(req.service_id, 0x0000_0000_0106_1c06);
    assert_eq!(rdma_cm::tcp_port(req.service_id), Some(7174));
    assert_eq!(req.local_qpn, Qpn::new(0x11));
    assert_eq!(req.path_mtu, Mtu::Mtu1024);
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    let Message::Rep(rep) = cm(6) else {
        panic!("frame 6 is the REP")
    };
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    assert_eq!(rep.target_ack_delay, 15);
    assert!(matches!(cm(7), Message::Rtu(_)));

    // The client sends with REP.StartingPSN, the server with REQ.StartingPSN.
    assert_eq!(roce(8).bth.psn, rep.starting_psn);
    assert_eq!(roce(8).payload.len(), 16);
    let read = roce(10);
    assert_eq!(read.bth.opcode, Opcode::RcRdmaReadRequest);
    assert_eq!(read.bth.psn, req.starting_psn);
    let reth = read.ext.reth.unwrap();
    assert_eq!(reth.virtual_address, 0x0000_564f_97ad_6d50);
    assert_eq!((reth.rkey, reth.dma_length), (Rkey(0x584), 64));
    let response = roce(11);
    assert_eq!(response.bth.psn, read.bth.psn);
    assert_eq!(&response.payload[..12], b"rdma-ping-0:");
    // A one-packet READ consumes one PSN.
    assert_eq!(roce(12).bth.psn, req.starting_psn.wrapping_add(1));
    let write = roce(16);
    assert_eq!(write.ext.reth.unwrap().rkey, Rkey(0x467));
    assert_eq!(write.payload.len(), 64);

    let Message::Dreq(dreq) = cm(44) else {
        panic!("frame 44 is the DREQ")
    };
    assert_eq!(dreq.remote_qpn, rep.local_qpn);
    assert!(matches!(cm(45), Message::Drep(_)));
}

/// Multi-packet READ responses and WRITEs of rping-linux-S3000.pcap.
#[test]
fn rping_3000_segments_at_the_path_mtu() {
    let capture = Capture::load("rping-linux-S3000");
    let frames = capture.frames();
    let roce = |n: usize| parse_frame(frames[n - 1]).unwrap();
    let read = roce(10);
    assert_eq!(read.ext.reth.unwrap().dma_length, 3000);
    let psn = read.bth.psn;
    assert_eq!(psn, Psn::new(3_820_200));
    let expected = [
        (Opcode::RcRdmaReadResponseFirst, 1024, true),
        (Opcode::RcRdmaReadResponseMiddle, 1024, false),
        (Opcode::RcRdmaReadResponseLast, 952, true),
    ];
    for (i, (opcode, len, has_aeth)) in expected.into_iter().enumerate() {
        let response = roce(11 + i);
        assert_eq!(response.bth.opcode, opcode);
        assert_eq!(response.bth.psn, psn.wrapping_add(i as u32));
        assert_eq!(response.payload.len(), len);
        assert_eq!(response.ext.aeth.is_some(), has_aeth);
        assert!(!response.bth.ack_req);
    }
    assert_eq!(roce(14).bth.psn, psn.wrapping_add(3));
    // WRITE FIRST carries the total length; only LAST asks for an ACK.
    assert_eq!(roce(18).ext.reth.unwrap().dma_length, 3000);
    assert!(!roce(18).bth.ack_req && !roce(19).bth.ack_req && roce(20).bth.ack_req);
    assert_eq!(roce(20).payload.len(), 3000 - 2 * 1024);
    assert_eq!(roce(20).bth.pad_count, 0);
}

/// rnbd-lossy.pcap frame 76: the responder's NAK (PSN sequence error).
#[test]
fn lossy_nak_carries_the_expected_psn() {
    let capture = Capture::load("rnbd-lossy");
    let frames = capture.frames();
    let nak = parse_frame(frames[75]).unwrap();
    assert_eq!(nak.bth.opcode, Opcode::RcAcknowledge);
    assert_eq!(nak.bth.psn, Psn::new(14_368_216));
    let aeth = nak.ext.aeth.unwrap();
    assert_eq!(
        aeth.syndrome,
        Syndrome::Nak(roce::wire::NakCode::PsnSequenceError)
    );
    assert_eq!(aeth.msn.value(), 3);
}

/// The CMA header's addresses equal the IP header's on every REQ.
#[test]
fn cma_addresses_match_the_ip_header() {
    for capture in Capture::all() {
        for bytes in capture.frames() {
            let Ok(roce) = parse_frame(bytes) else {
                continue;
            };
            let Ok(cm) = cm::Repr::parse(roce.payload) else {
                continue;
            };
            let Message::Req(req) = cm.message else {
                continue;
            };
            let cma =
                rdma_cm::Repr::parse(&rdma_cm::Packet::new_unchecked(req.private_data)).unwrap();
            assert_eq!(cma.src_addr, roce.ip.src_addr);
            assert_eq!(cma.dst_addr, roce.ip.dst_addr);
            let gid_ip = req.primary_path.local_gid.to_ipv4();
            assert_eq!(gid_ip, Some(roce.ip.src_addr));
            // The client will use the path's traffic class and hop limit.
            assert_eq!(req.primary_path.hop_limit, roce.ip.ttl);
            assert_eq!(req.primary_path.traffic_class, roce.ip.tos);
        }
    }
}
