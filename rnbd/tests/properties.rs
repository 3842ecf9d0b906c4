//! Property tests: `parse(emit(r)) == r` for every RNBD message, and no
//! parser panics on arbitrary bytes.

use proptest::prelude::*;
use rnbd::wire::{
    AccessMode, CachePolicy, Close, Io, IoFlags, IoOp, Message, Open, OpenRsp, SessInfo,
    SessInfoRsp,
};

fn device_path() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_/+:@,=-]([A-Za-z0-9_/+:@,=-]|\\.[A-Za-z0-9_/+:@,=-]){0,120}"
}

fn access_mode() -> impl Strategy<Value = AccessMode> {
    prop_oneof![
        Just(AccessMode::ReadOnly),
        Just(AccessMode::ReadWrite),
        Just(AccessMode::Migration)
    ]
}

fn block_sizes() -> impl Strategy<Value = (u16, u16)> {
    (9u32..=12, 0u32..=3).prop_map(|(l, extra)| (1u16 << l, 1u16 << (l + extra)))
}

fn open_rsp() -> impl Strategy<Value = OpenRsp> {
    (
        (
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        ),
        (
            any::<u32>(),
            any::<u32>(),
            block_sizes(),
            any::<u16>(),
            any::<u16>(),
        ),
        (any::<u8>(), any::<u8>()),
    )
        .prop_map(|(a, b, c)| OpenRsp {
            device_id: a.0,
            nsectors: a.1,
            max_hw_sectors: a.2,
            max_write_same_sectors: a.3,
            max_discard_sectors: a.4,
            discard_granularity: b.0,
            discard_alignment: b.1,
            physical_block_size: b.2 .1,
            logical_block_size: b.2 .0,
            max_segments: b.3,
            secure_discard: b.4,
            rotational: c.0,
            cache_policy: CachePolicy(c.1),
        })
}

fn io() -> impl Strategy<Value = Io> {
    let ranged = (
        prop_oneof![
            Just(IoOp::Read),
            Just(IoOp::Write),
            Just(IoOp::Discard),
            Just(IoOp::SecureErase)
        ],
        0u32..=(u32::MAX / 512),
        any::<u64>(),
    )
        .prop_map(|(op, sectors, sector)| {
            let bi_size = sectors * 512;
            let limit = u64::MAX / 512 - u64::from(sectors);
            (op, sector % (limit + 1), bi_size)
        });
    let flush = any::<u64>().prop_map(|sector| (IoOp::Flush, sector, 0));
    (
        prop_oneof![ranged, flush],
        any::<u32>(),
        any::<u32>(),
        any::<u16>(),
    )
        .prop_map(|((op, sector, bi_size), device_id, flags, prio)| Io {
            device_id,
            sector,
            op,
            flags: IoFlags::from_rw(flags),
            bi_size,
            prio,
        })
}

proptest! {
    #[test]
    fn open_round_trip(mode in access_mode(), path in device_path()) {
        let open = Open { access_mode: mode, device_path: &path };
        let mut buf = [0u8; 264];
        prop_assert_eq!(open.emit(&mut buf), Ok(264));
        prop_assert_eq!(Open::parse(&buf), Ok(open));
        prop_assert_eq!(Message::parse(&buf), Ok(Message::Open(open)));
    }

    #[test]
    fn open_rsp_round_trip(rsp in open_rsp()) {
        let mut buf = [0u8; 56];
        prop_assert_eq!(rsp.emit(&mut buf), Ok(56));
        prop_assert_eq!(OpenRsp::parse(&buf), Ok(rsp));
    }

    #[test]
    fn io_round_trip(io in io()) {
        let mut buf = [0u8; 32];
        prop_assert_eq!(io.emit(&mut buf), Ok(32));
        prop_assert_eq!(Io::parse(&buf), Ok(io));
        prop_assert_eq!(Message::parse(&buf), Ok(Message::Io(io)));
    }

    #[test]
    fn small_messages_round_trip(ver in any::<u8>(), device_id in any::<u32>()) {
        let mut buf = [0u8; 36];
        for message in [
            Message::SessInfo(SessInfo { ver }),
            Message::SessInfoRsp(SessInfoRsp { ver }),
            Message::Close(Close { device_id }),
        ] {
            let len = message.emit(&mut buf).unwrap();
            prop_assert_eq!(len, message.buffer_len());
            prop_assert_eq!(Message::parse(&buf[..len]), Ok(message));
        }
    }

    #[test]
    fn parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), capacity in any::<u64>()) {
        if let Ok(message) = Message::parse(&bytes) {
            let _ = message.to_string();
            let _ = message.rtrs_direction();
            if let Message::Io(io) = message {
                let _ = io.check_range(capacity);
                let _ = io.byte_offset();
            }
        }
        let _ = SessInfo::parse(&bytes);
        let _ = SessInfoRsp::parse(&bytes);
        let _ = Open::parse(&bytes);
        let _ = OpenRsp::parse(&bytes);
        let _ = Close::parse(&bytes);
        let _ = Io::parse(&bytes);
    }

    #[test]
    fn typed_prefix_never_panics(kind in 0u8..7, bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut buf = vec![kind, 0];
        buf.extend_from_slice(&bytes);
        let _ = Message::parse(&buf).map(|m| m.to_string());
    }
}
