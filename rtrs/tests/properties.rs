//! Property tests: `parse(emit(r)) == r` for every RTRS message, the
//! immediate round trip, and no parser panics on arbitrary bytes.

use proptest::prelude::*;
use rtrs::wire::{
    peek_type, BufferDesc, ConnReq, ConnRsp, ConnRspFlags, Imm, ImmLayout, InfoReq, InfoRsp,
    IoRequest, ReadFlags, ReadMsg, RkeyRsp, SgDesc, Uuid, WriteMsg, MAX_CID_NUM,
};
use verbs::Rkey;

fn conn_req() -> impl Strategy<Value = ConnReq> {
    (
        1..=MAX_CID_NUM,
        any::<u8>(),
        any::<u16>(),
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        any::<bool>(),
    )
        .prop_flat_map(|(cid_num, minor, recon_cnt, path, session, first_conn)| {
            (0..cid_num).prop_map(move |cid| ConnReq {
                version: 0x0200 | u16::from(minor),
                cid,
                cid_num,
                recon_cnt,
                path_uuid: Uuid(path),
                session_uuid: Uuid(session),
                first_conn,
            })
        })
}

fn conn_rsp() -> impl Strategy<Value = ConnRsp> {
    prop_oneof![
        (
            1..=u16::MAX,
            1..=u32::MAX / 2,
            0..=u32::MAX / 2,
            any::<u32>()
        )
            .prop_map(|(qd, io, hdr, flags)| ConnRsp::accept(
                qd,
                io,
                hdr,
                ConnRspFlags(flags)
            )),
        (1..=i16::MAX).prop_map(ConnRsp::reject),
    ]
}

fn buffer_desc() -> impl Strategy<Value = BufferDesc> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(addr, rkey, len)| BufferDesc {
        addr,
        rkey: Rkey(rkey),
        len,
    })
}

fn session_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-]{1,254}"
}

fn imm() -> impl Strategy<Value = Imm> {
    prop_oneof![
        (0..1u32 << 28).prop_map(|payload| Imm::IoReq { payload }),
        (0..1u32 << 19, 0..512u16).prop_map(|(msg_id, errno)| Imm::IoRsp { msg_id, errno }),
        (0..1u32 << 19, 0..512u16)
            .prop_map(|(msg_id, errno)| Imm::IoRspWithInvalidate { msg_id, errno }),
        Just(Imm::HbMsg),
        Just(Imm::HbAck),
        prop_oneof![Just(3u32), 4..8u32, 10..16u32]
            .prop_flat_map(|kind| (0..1u32 << 28).prop_map(move |p| Imm::Unknown((kind << 28) | p))),
    ]
}

proptest! {
    #[test]
    fn conn_req_round_trip(req in conn_req()) {
        let mut buf = [0u8; 56];
        prop_assert_eq!(req.emit(&mut buf), Ok(56));
        prop_assert_eq!(ConnReq::parse(&buf), Ok(req));
    }

    #[test]
    fn conn_rsp_round_trip(rsp in conn_rsp()) {
        let mut buf = [0u8; 56];
        prop_assert_eq!(rsp.emit(&mut buf), Ok(56));
        prop_assert_eq!(ConnRsp::parse(&buf), Ok(rsp));
    }

    #[test]
    fn info_req_round_trip(name in session_name()) {
        let req = InfoReq { session_name: &name };
        let mut buf = [0u8; 272];
        prop_assert_eq!(req.emit(&mut buf), Ok(272));
        prop_assert_eq!(InfoReq::parse(&buf), Ok(req));
    }

    #[test]
    fn info_rsp_round_trip(descs in prop::collection::vec(buffer_desc(), 1..64)) {
        let descs: Vec<SgDesc> = descs.into_iter().map(SgDesc::new).collect();
        let rsp = InfoRsp { descriptors: &descs };
        let mut buf = vec![0u8; rsp.buffer_len()];
        prop_assert_eq!(rsp.emit(&mut buf), Ok(buf.len()));
        prop_assert_eq!(InfoRsp::parse(&buf), Ok(rsp));
    }

    #[test]
    fn read_round_trip(usr_len in any::<u16>(), flags in any::<u16>(), desc in prop::option::of(buffer_desc())) {
        let read = ReadMsg { usr_len, flags: ReadFlags(flags), desc };
        let mut buf = [0u8; 24];
        prop_assert_eq!(read.emit(&mut buf), Ok(read.buffer_len()));
        prop_assert_eq!(ReadMsg::parse(&buf), Ok(read));
    }

    #[test]
    fn write_and_rkey_round_trip(usr_len in any::<u16>(), buf_id in any::<u16>(), rkey in any::<u32>()) {
        let mut buf = [0u8; 8];
        WriteMsg { usr_len }.emit(&mut buf).unwrap();
        prop_assert_eq!(WriteMsg::parse(&buf), Ok(WriteMsg { usr_len }));
        let rsp = RkeyRsp { buf_id, rkey: Rkey(rkey) };
        rsp.emit(&mut buf).unwrap();
        prop_assert_eq!(RkeyRsp::parse(&buf), Ok(rsp));
    }

    #[test]
    fn imm_round_trip(imm in imm()) {
        let raw = imm.encode().unwrap();
        prop_assert_eq!(Imm::decode(raw), imm);
    }

    #[test]
    fn imm_layout_round_trip(qd in 1..=u16::MAX, buf_id in any::<u32>(), offset in any::<u32>()) {
        let layout = ImmLayout::for_queue_depth(qd).unwrap();
        let buf_id = buf_id % u32::from(qd);
        let offset = offset % (1 << layout.mem_bits());
        let payload = layout.join(buf_id, offset).unwrap();
        prop_assert!(payload < 1 << 28);
        prop_assert_eq!(layout.split(payload), (buf_id, offset));
    }

    #[test]
    fn parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400), offset in 0usize..500,
                           qd in any::<u16>(), chunk_size in any::<u32>(), imm in any::<u32>()) {
        let _ = ConnReq::parse(&bytes);
        let _ = ConnRsp::parse(&bytes);
        let _ = InfoReq::parse(&bytes);
        if let Ok(rsp) = InfoRsp::parse(&bytes) {
            let _ = rsp.check_layout(qd, chunk_size);
            let _ = rsp.chunk(chunk_size, imm);
            let _ = rsp.to_string();
        }
        let _ = ReadMsg::parse(&bytes);
        let _ = WriteMsg::parse(&bytes);
        let _ = RkeyRsp::parse(&bytes);
        let _ = peek_type(&bytes);
        let _ = IoRequest::parse(&bytes, offset).map(|r| r.to_string());
        let _ = Imm::decode(imm).to_string();
        let _ = Imm::decode(imm).encode();
        if let Ok(layout) = ImmLayout::for_queue_depth(qd) {
            let _ = layout.split(imm);
            let _ = layout.check_chunk_size(chunk_size);
            let _ = layout.join(imm, chunk_size);
        }
    }

    #[test]
    fn typed_prefix_never_panics(kind in 0u8..6, bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        // Arbitrary bodies behind a valid type, to get past the first check.
        let mut buf = vec![kind, 0];
        buf.extend_from_slice(&bytes);
        let _ = InfoReq::parse(&buf);
        let _ = InfoRsp::parse(&buf);
        let _ = ReadMsg::parse(&buf);
        let _ = IoRequest::parse(&buf, 0);
    }
}
