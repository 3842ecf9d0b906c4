//! Property tests: parsers never panic, reprs round-trip, PSN ordering laws.

mod common;

use core::net::Ipv4Addr;

use proptest::prelude::*;
use roce::types::{Gid, Msn, Mtu, Pkey, Psn, Qkey, Qpn, Rkey};
use roce::wire::cm::{self, Message, MessageKind, PathRepr, RepRepr, ReqRepr, TransportType};
use roce::wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, mad, parse_frame, rdma_cm, reth, udp,
    verify_icrc, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, EtherType,
    EthernetAddress, EthernetRepr, ExtHeaders, ExtSet, Frame, FrameHeaders, IethRepr, ImmDtRepr,
    Ipv4Repr, Opcode, PrettyPrinter, RethRepr, RoceFrame, Syndrome, Trailer, UdpRepr,
};

/// Runs every parser and printer over `bytes`; only panics count as failures.
fn parse_everything(bytes: &[u8]) {
    let _ = PrettyPrinter::new(bytes).to_string();
    if let Ok(frame) = Frame::parse(bytes) {
        let _ = frame.to_string();
    }
    let _ = parse_frame(bytes);
    let _ = verify_icrc(bytes);
    let _ = roce::wire::compute_icrc(bytes);
    let _ = bth::Packet::new_checked(bytes).and_then(|p| BthRepr::parse(&p));
    let _ = bth::Packet::new_unchecked(bytes).to_string();
    let _ = reth::Packet::new_unchecked(bytes).to_string();
    let _ = aeth::Packet::new_unchecked(bytes).to_string();
    let _ = deth::Packet::new_unchecked(bytes).to_string();
    let _ = immdt::Packet::new_unchecked(bytes).to_string();
    let _ = ieth::Packet::new_unchecked(bytes).to_string();
    let _ = atomic_eth::Packet::new_unchecked(bytes).to_string();
    let _ = atomic_ack_eth::Packet::new_unchecked(bytes).to_string();
    let _ = mad::Packet::new_unchecked(bytes).to_string();
    let _ = rdma_cm::Packet::new_unchecked(bytes).to_string();
    let _ = cm::ReqPacket::new_unchecked(bytes).to_string();
    let _ = cm::RepPacket::new_unchecked(bytes).to_string();
    let _ = cm::RejPacket::new_unchecked(bytes).to_string();
    let _ = cm::MraPacket::new_unchecked(bytes).to_string();
    let _ = cm::RtuPacket::new_unchecked(bytes).to_string();
    let _ = cm::DreqPacket::new_unchecked(bytes).to_string();
    let _ = cm::DrepPacket::new_unchecked(bytes).to_string();
    if let Ok(repr) = cm::Repr::parse(bytes) {
        let _ = repr.to_string();
    }
    for layout in [
        ExtSet::RETH.union(ExtSet::IMMDT),
        ExtSet::AETH.union(ExtSet::ATOMIC_ACK_ETH),
    ] {
        let _ = ExtHeaders::parse(layout, bytes);
    }
    if let Ok(reader) = roce::pcap::Reader::new(bytes) {
        reader.take(64).for_each(drop);
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        parse_everything(&bytes);
    }

    #[test]
    fn arbitrary_mad_bodies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 256)) {
        // The right length for every CM parser, with a CM MAD header in front.
        let mut mad = bytes;
        mad[..4].copy_from_slice(&[1, 7, 2, 3]);
        mad[16] = 0;
        mad[17] %= 0x20;
        parse_everything(&mad);
    }
}

fn sample_frames() -> Vec<Vec<u8>> {
    ["rping-linux", "rping-linux-S3000", "rnbd-2cpu"]
        .iter()
        .flat_map(|name| {
            let capture = common::Capture::load(name);
            capture
                .frames()
                .into_iter()
                .map(<[u8]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Real frames with a few bytes changed and maybe cut short: no parser
    /// panics, and whatever parses re-emits to a fixpoint.
    #[test]
    fn mutated_captures_never_panic(
        pick in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        thread_local!(static FRAMES: Vec<Vec<u8>> = sample_frames());
        let mut frame = FRAMES.with(|frames| pick.get(frames).clone());
        for (at, value) in edits {
            let index = at.index(frame.len());
            frame[index] = value;
        }
        if let Some(cut) = cut {
            frame.truncate(cut.index(frame.len() + 1));
        }
        parse_everything(&frame);
        if let Ok(parsed) = Frame::parse(&frame) {
            let mut once = vec![0; parsed.buffer_len()];
            prop_assert_eq!(parsed.emit(&mut once), Ok(once.len()));
            let reparsed = Frame::parse(&once).expect("emitted frames parse");
            let mut twice = vec![0; reparsed.buffer_len()];
            prop_assert_eq!(reparsed.emit(&mut twice), Ok(twice.len()));
            prop_assert_eq!(once, twice);
        }
    }
}

fn psn() -> impl Strategy<Value = Psn> {
    (0..=0xff_ffffu32).prop_map(Psn::new)
}

fn qpn() -> impl Strategy<Value = Qpn> {
    (0..=0xff_ffffu32).prop_map(Qpn::new)
}

fn bth_repr() -> impl Strategy<Value = BthRepr> {
    (
        any::<u8>().prop_map(Opcode::from),
        any::<(bool, bool, bool, bool, bool)>(),
        0..4u8,
        any::<u16>().prop_map(Pkey),
        qpn(),
        psn(),
    )
        .prop_map(
            |(opcode, (solicited, mig_req, fecn, becn, ack_req), pad_count, pkey, dest_qp, psn)| {
                BthRepr {
                    opcode,
                    solicited,
                    mig_req,
                    pad_count,
                    pkey,
                    fecn,
                    becn,
                    dest_qp,
                    ack_req,
                    psn,
                }
            },
        )
}

fn reth_repr() -> impl Strategy<Value = RethRepr> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, rkey, len)| RethRepr {
        virtual_address: va,
        rkey: Rkey(rkey),
        dma_length: len,
    })
}

fn aeth_repr() -> impl Strategy<Value = AethRepr> {
    (any::<u8>(), 0..=0xff_ffffu32).prop_map(|(syndrome, msn)| AethRepr {
        syndrome: Syndrome::from(syndrome),
        msn: Msn::new(msn),
    })
}

fn gid() -> impl Strategy<Value = Gid> {
    prop_oneof![
        any::<[u8; 16]>().prop_map(Gid),
        any::<[u8; 4]>().prop_map(|ip| Gid::from_ipv4(Ipv4Addr::from(ip))),
    ]
}

fn path_repr() -> impl Strategy<Value = PathRepr> {
    (
        any::<(u16, u16)>(),
        gid(),
        gid(),
        0..(1u32 << 20),
        0..64u8,
        any::<(u8, u8)>(),
        0..16u8,
        any::<bool>(),
        0..32u8,
    )
        .prop_map(
            |(
                (local_lid, remote_lid),
                local_gid,
                remote_gid,
                flow_label,
                packet_rate,
                (tc, hop),
                sl,
                subnet_local,
                ack,
            )| {
                PathRepr {
                    local_lid,
                    remote_lid,
                    local_gid,
                    remote_gid,
                    flow_label,
                    packet_rate,
                    traffic_class: tc,
                    hop_limit: hop,
                    sl,
                    subnet_local,
                    local_ack_timeout: ack,
                }
            },
        )
}

/// The owned parts of a REQ (its private data is borrowed by the repr).
#[derive(Debug, Clone)]
struct ReqParts {
    ids: (u32, u32, u64, u64, u32),
    qpns: (Qpn, u32, u32),
    resources: (u8, u8),
    bits: (u8, u8, bool, u8, u8, u8, bool, u8, u8, bool, u8),
    psn: Psn,
    pkey: Pkey,
    paths: (PathRepr, PathRepr),
    private_data: Vec<u8>,
}

impl ReqParts {
    fn repr(&self) -> ReqRepr<'_> {
        let (local_comm_id, vendor_id, service_id, local_ca_guid, qkey) = self.ids;
        let (local_qpn, local_eecn, remote_eecn) = self.qpns;
        let (rcm, transport, e2e, lcm, retry, mtu, rdc, rnr, max_cm, srq, ext) = self.bits;
        ReqRepr {
            local_comm_id,
            vendor_id,
            service_id,
            local_ca_guid,
            local_qkey: Qkey(qkey),
            local_qpn,
            responder_resources: self.resources.0,
            local_eecn,
            initiator_depth: self.resources.1,
            remote_eecn,
            remote_cm_response_timeout: rcm,
            transport_type: TransportType::from(transport),
            end_to_end_flow_control: e2e,
            starting_psn: self.psn,
            local_cm_response_timeout: lcm,
            retry_count: retry,
            pkey: self.pkey,
            path_mtu: Mtu::from(mtu),
            rdc_exists: rdc,
            rnr_retry_count: rnr,
            max_cm_retries: max_cm,
            srq,
            extended_transport_type: ext,
            // Both values of Brick's reserved bit, from bits already drawn.
            brick_selective: rdc ^ srq,
            primary_path: self.paths.0,
            alternate_path: self.paths.1,
            private_data: &self.private_data,
        }
    }
}

fn req_parts() -> impl Strategy<Value = ReqParts> {
    let u24 = 0..=0xff_ffffu32;
    (
        (
            any::<u32>(),
            u24.clone(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
        ),
        (qpn(), u24.clone(), u24),
        any::<(u8, u8)>(),
        (
            0..32u8,
            0..4u8,
            any::<bool>(),
            0..32u8,
            0..8u8,
            0..16u8,
            any::<bool>(),
            0..8u8,
            0..16u8,
            any::<bool>(),
            0..8u8,
        ),
        psn(),
        any::<u16>().prop_map(Pkey),
        (path_repr(), path_repr()),
        proptest::collection::vec(any::<u8>(), cm::req::PRIVATE_DATA_LEN),
    )
        .prop_map(
            |(ids, qpns, resources, bits, psn, pkey, paths, private_data)| ReqParts {
                ids,
                qpns,
                resources,
                bits,
                psn,
                pkey,
                paths,
                private_data,
            },
        )
}

#[derive(Debug, Clone)]
#[allow(clippy::type_complexity)]
struct RepParts {
    fields: (u32, u32, u32, Qpn, u32, u32, Psn, u8, u8),
    bits: (u8, u8, bool, u8, bool),
    guid: u64,
    private_data: Vec<u8>,
}

impl RepParts {
    fn repr(&self) -> RepRepr<'_> {
        let (
            local_comm_id,
            remote_comm_id,
            qkey,
            local_qpn,
            vendor_id,
            local_eecn,
            starting_psn,
            rr,
            id,
        ) = self.fields;
        let (target_ack_delay, failover_accepted, end_to_end_flow_control, rnr_retry_count, srq) =
            self.bits;
        RepRepr {
            local_comm_id,
            remote_comm_id,
            local_qkey: Qkey(qkey),
            local_qpn,
            vendor_id,
            local_eecn,
            starting_psn,
            responder_resources: rr,
            initiator_depth: id,
            target_ack_delay,
            failover_accepted,
            end_to_end_flow_control,
            rnr_retry_count,
            srq,
            brick_selective: srq ^ end_to_end_flow_control,
            local_ca_guid: self.guid,
            private_data: &self.private_data,
        }
    }
}

fn rep_parts() -> impl Strategy<Value = RepParts> {
    let u24 = 0..=0xff_ffffu32;
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            qpn(),
            u24.clone(),
            u24,
            psn(),
            any::<u8>(),
            any::<u8>(),
        ),
        (0..32u8, 0..4u8, any::<bool>(), 0..8u8, any::<bool>()),
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), cm::rep::PRIVATE_DATA_LEN),
    )
        .prop_map(|(fields, bits, guid, private_data)| RepParts {
            fields,
            bits,
            guid,
            private_data,
        })
}

proptest! {
    #[test]
    fn bth_round_trips(repr in bth_repr()) {
        let mut buf = [0u8; bth::HEADER_LEN];
        repr.emit(&mut bth::Packet::new_unchecked(&mut buf[..]));
        prop_assert_eq!(BthRepr::parse(&bth::Packet::new_unchecked(&buf[..])), Ok(repr));
    }

    #[test]
    fn reth_round_trips(repr in reth_repr()) {
        let mut buf = [0u8; reth::HEADER_LEN];
        repr.emit(&mut reth::Packet::new_unchecked(&mut buf[..]));
        prop_assert_eq!(RethRepr::parse(&reth::Packet::new_unchecked(&buf[..])), Ok(repr));
    }

    #[test]
    fn aeth_round_trips(repr in aeth_repr()) {
        let mut buf = [0u8; aeth::HEADER_LEN];
        repr.emit(&mut aeth::Packet::new_unchecked(&mut buf[..]));
        prop_assert_eq!(AethRepr::parse(&aeth::Packet::new_unchecked(&buf[..])), Ok(repr));
    }

    #[test]
    fn cm_req_round_trips(parts in req_parts(), tid in any::<u64>()) {
        let repr = cm::Repr { transaction_id: tid, attribute_modifier: 0, message: Message::Req(parts.repr()) };
        let mut buf = [0xa5u8; mad::MAD_LEN];
        repr.emit(&mut buf);
        prop_assert_eq!(cm::Repr::parse(&buf), Ok(repr));
    }

    #[test]
    fn cm_rep_round_trips(parts in rep_parts(), tid in any::<u64>(), attr_mod in any::<u32>()) {
        let repr = cm::Repr { transaction_id: tid, attribute_modifier: attr_mod, message: Message::Rep(parts.repr()) };
        let mut buf = [0xa5u8; mad::MAD_LEN];
        repr.emit(&mut buf);
        prop_assert_eq!(cm::Repr::parse(&buf), Ok(repr));
    }

    #[test]
    fn cm_short_messages_round_trip(
        ids in any::<(u32, u32)>(),
        qpn in qpn(),
        kind in 0..4u8,
        timeout in 0..32u8,
        reason in any::<u16>(),
        ari_len in 0..=cm::rej::ARI_LEN,
        fill in any::<u8>(),
    ) {
        let (local_comm_id, remote_comm_id) = ids;
        let ari = vec![fill; ari_len];
        let area = [fill; 224];
        let messages = [
            Message::Mra(cm::MraRepr { local_comm_id, remote_comm_id, message_mraed: MessageKind::from(kind), service_timeout: timeout, private_data: &area[..cm::mra::PRIVATE_DATA_LEN] }),
            Message::Rej(cm::RejRepr { local_comm_id, remote_comm_id, message_rejected: MessageKind::from(kind), reason: cm::RejectReason::from(reason), ari: &ari, private_data: &area[..cm::rej::PRIVATE_DATA_LEN] }),
            Message::Rtu(cm::RtuRepr { local_comm_id, remote_comm_id, private_data: &area[..cm::rtu::PRIVATE_DATA_LEN] }),
            Message::Dreq(cm::DreqRepr { local_comm_id, remote_comm_id, remote_qpn: qpn, private_data: &area[..cm::dreq::PRIVATE_DATA_LEN] }),
            Message::Drep(cm::DrepRepr { local_comm_id, remote_comm_id, private_data: &area[..cm::drep::PRIVATE_DATA_LEN] }),
        ];
        for message in messages {
            let repr = cm::Repr { transaction_id: 7, attribute_modifier: 0, message };
            let mut buf = [0u8; mad::MAD_LEN];
            repr.emit(&mut buf);
            prop_assert_eq!(cm::Repr::parse(&buf), Ok(repr));
        }
    }

    #[test]
    fn cma_header_round_trips(port in any::<u16>(), src in any::<[u8; 4]>(), dst in any::<[u8; 4]>()) {
        let repr = rdma_cm::Repr { src_port: port, src_addr: Ipv4Addr::from(src), dst_addr: Ipv4Addr::from(dst) };
        let mut buf = [0xa5u8; rdma_cm::HEADER_LEN];
        repr.emit(&mut rdma_cm::Packet::new_unchecked(&mut buf[..]));
        prop_assert_eq!(rdma_cm::Repr::parse(&rdma_cm::Packet::new_unchecked(&buf[..])), Ok(repr));
    }
}

/// Opcodes with a known layout, and extended headers to match.
fn opcode_and_ext() -> impl Strategy<Value = (Opcode, ExtHeaders)> {
    let known: Vec<Opcode> = (0..=255u8)
        .map(Opcode::from)
        .filter(|opcode| opcode.ext_headers().is_some())
        .collect();
    (
        proptest::sample::select(known),
        (any::<u32>(), qpn()),
        reth_repr(),
        any::<(u64, u32, u64, u64)>(),
        aeth_repr(),
        any::<(u64, u32, u32)>(),
    )
        .prop_map(
            |(opcode, (qkey, src_qp), reth, atomic, aeth, (orig, imm, inv))| {
                let layout = opcode.ext_headers().unwrap_or_default();
                let has = |header| layout.contains(header).then_some(());
                let ext = ExtHeaders {
                    deth: has(ExtSet::DETH).map(|_| DethRepr {
                        qkey: Qkey(qkey),
                        src_qp,
                    }),
                    reth: has(ExtSet::RETH).map(|_| reth),
                    atomic_eth: has(ExtSet::ATOMIC_ETH).map(|_| AtomicEthRepr {
                        virtual_address: atomic.0,
                        rkey: Rkey(atomic.1),
                        swap_add: atomic.2,
                        compare: atomic.3,
                    }),
                    aeth: has(ExtSet::AETH).map(|_| aeth),
                    atomic_ack_eth: has(ExtSet::ATOMIC_ACK_ETH)
                        .map(|_| AtomicAckEthRepr { original: orig }),
                    immdt: has(ExtSet::IMMDT).map(|_| ImmDtRepr { immediate: imm }),
                    ieth: has(ExtSet::IETH).map(|_| IethRepr { rkey: Rkey(inv) }),
                };
                (opcode, ext)
            },
        )
}

fn frame_headers() -> impl Strategy<Value = FrameHeaders> {
    (
        any::<([u8; 6], [u8; 6])>(),
        any::<([u8; 4], [u8; 4], u8, u8, u16, bool)>(),
        any::<u16>(),
        bth_repr(),
        opcode_and_ext(),
    )
        .prop_map(
            |((src_mac, dst_mac), (src, dst, ttl, tos, ident, df), sport, bth, (opcode, ext))| {
                FrameHeaders {
                    eth: EthernetRepr {
                        src_addr: EthernetAddress(src_mac),
                        dst_addr: EthernetAddress(dst_mac),
                        ethertype: EtherType::Ipv4,
                    },
                    ip: Ipv4Repr {
                        src_addr: Ipv4Addr::from(src),
                        dst_addr: Ipv4Addr::from(dst),
                        protocol: roce::wire::ipv4::Protocol::Udp,
                        payload_len: 0,
                        ttl,
                        tos,
                        ident,
                        dont_frag: df,
                    },
                    udp: UdpRepr {
                        src_port: sport,
                        dst_port: udp::ROCE_V2_PORT,
                    },
                    bth: BthRepr { opcode, ..bth },
                    ext,
                }
            },
        )
}

proptest! {
    /// emit_headers + chained payload + Trailer == emit_frame, and parse_frame
    /// gives back the headers and the payload.
    #[test]
    fn frames_round_trip(
        headers in frame_headers(),
        payload in proptest::collection::vec(any::<u8>(), 0..1100),
        split in any::<prop::sample::Index>(),
    ) {
        let mut contiguous = vec![0u8; headers.frame_len(payload.len())];
        prop_assert_eq!(headers.emit_frame(&mut contiguous, &payload), Ok(contiguous.len()));

        let mut header_buf = [0u8; roce::wire::MAX_HEADERS_LEN];
        let len = headers.emit_headers(&mut header_buf, payload.len()).unwrap();
        let (first, second) = payload.split_at(split.index(payload.len() + 1));
        let trailer = Trailer::new(&header_buf[..len], &[first, second]);
        let chained = [&header_buf[..len], first, second, trailer.as_bytes()].concat();
        prop_assert_eq!(&chained, &contiguous);

        let parsed: RoceFrame<'_> = parse_frame(&contiguous).unwrap();
        prop_assert_eq!(parsed.payload, &payload[..]);
        prop_assert_eq!(parsed.icrc, trailer.icrc());
        let expected = FrameHeaders {
            ip: Ipv4Repr { payload_len: contiguous.len() - 34, ..headers.ip },
            bth: BthRepr { pad_count: roce::wire::pad_len(payload.len()) as u8, ..headers.bth },
            ..headers
        };
        prop_assert_eq!(parsed.headers(), expected);
    }

    #[test]
    fn psn_order_is_a_window(a in psn(), k in 1..(1u32 << 23)) {
        let b = a.wrapping_add(k);
        prop_assert!(a.is_before(b));
        prop_assert!(b.is_after(a));
        prop_assert!(!b.is_before(a));
        prop_assert!(!a.is_after(b));
        prop_assert_eq!(a.distance_to(b), k);
        prop_assert_eq!(a.signed_distance_to(b), k as i32);
        prop_assert_eq!(b.signed_distance_to(a), -(k as i32));
        prop_assert_eq!(b.wrapping_sub(k), a);
    }

    #[test]
    fn psn_trichotomy(a in psn(), b in psn()) {
        let relations = [a == b, a.is_before(b), b.is_before(a), a.distance_to(b) == Psn::HALF];
        prop_assert_eq!(relations.iter().filter(|&&r| r).count(), 1);
        prop_assert_eq!(a.wrapping_add(a.signed_distance_to(b) as u32), b);
        prop_assert_eq!((a.distance_to(b) + b.distance_to(a)) % (1 << 24), 0);
    }

    #[test]
    fn psn_order_is_transitive_within_half(a in psn(), d1 in 1..(1u32 << 22), d2 in 1..(1u32 << 22)) {
        let b = a.wrapping_add(d1);
        let c = b.wrapping_add(d2);
        prop_assert!(a.is_before(b) && b.is_before(c) && a.is_before(c));
    }
}
