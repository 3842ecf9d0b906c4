//! RNBD messages of every capture in `tests/vectors/`, decoded with `rnbd::wire`.
//!
//! The RTRS walker of `brick-rtrs` (shared source) locates each request's user
//! header in its chunk and matches read data to its request; here the user
//! headers are parsed as RNBD messages and the RDMA-written responses as
//! SESS_INFO_RSP / OPEN_RSP, and checked against the README: session "s1",
//! device_path "ram0" opened read-write, brd ram0 of 64 MiB, the 4 KiB and
//! 128 KiB IOs at the offsets the test script used.

#[path = "../../rtrs/tests/common/mod.rs"]
mod common;

use common::{decode, Session};
use rnbd::wire::{
    AccessMode, CachePolicy, IoFlags, IoOp, Message, OpenRsp, RtrsDirection, SessInfoRsp,
};
use rtrs::wire::IoMsg;

/// The RNBD message of every request, with the RTRS direction checked.
fn messages(session: &Session) -> Vec<Message<'_>> {
    session
        .requests
        .iter()
        .map(|request| {
            let message = Message::parse(&request.user_header)
                .unwrap_or_else(|e| panic!("frame {}: {e}", request.frame));
            let direction = match request.msg {
                IoMsg::Read(_) => RtrsDirection::Read,
                IoMsg::Write(_) => RtrsDirection::Write,
            };
            assert_eq!(
                message.rtrs_direction(),
                Some(direction),
                "frame {}",
                request.frame
            );
            if let Message::Io(io) = message {
                // rnbd.md §8.3 #34: bi_size equals the RTRS data length.
                assert_eq!(
                    io.bi_size as usize, request.data_len,
                    "frame {}",
                    request.frame
                );
                assert_eq!(io.device_id, 0);
            }
            // Round trip, and byte-exact: in these captures the Linux client's
            // unzeroed padding and reserved bytes happen to be zero, so what
            // Brick's client emits is exactly what Linux sent.
            let mut buf = [0u8; 264];
            let len = message.emit(&mut buf).unwrap();
            assert_eq!(Message::parse(&buf[..len]), Ok(message));
            assert_eq!(
                buf[..len],
                request.user_header[..],
                "frame {}",
                request.frame
            );
            message
        })
        .collect()
}

/// The response RDMA-written for request `index`, if any.
fn read_data(session: &Session, index: usize) -> Option<&[u8]> {
    session
        .read_data
        .iter()
        .find(|(_, request, _)| *request == index)
        .map(|(_, _, data)| data.as_slice())
}

/// SESS_INFO{ver 2} -> SESS_INFO_RSP{ver 2}; OPEN{rw, "ram0"} -> OPEN_RSP of
/// the 64 MiB brd ram0 (131072 sectors, 512-byte logical blocks).
fn check_map(session: &Session, messages: &[Message<'_>]) -> OpenRsp {
    assert_eq!(
        messages[0],
        Message::SessInfo(rnbd::wire::SessInfo { ver: 2 })
    );
    let data = read_data(session, 0).expect("SESS_INFO_RSP");
    let rsp = SessInfoRsp::parse(data).unwrap();
    assert_eq!(rsp, SessInfoRsp { ver: 2 });
    // The Linux server zeroes its responses: Brick's emit is byte-exact.
    let mut buf = [0u8; 36];
    rsp.emit(&mut buf).unwrap();
    assert_eq!(buf[..], *data);
    let Message::Open(open) = messages[1] else {
        panic!("OPEN second")
    };
    assert_eq!(open.access_mode, AccessMode::ReadWrite);
    assert_eq!(open.device_path, "ram0");
    let data = read_data(session, 1).expect("OPEN_RSP");
    let rsp = OpenRsp::parse(data).unwrap();
    let mut buf = [0u8; 56];
    rsp.emit(&mut buf).unwrap();
    assert_eq!(buf[..], *data, "byte-exact");
    assert_eq!(rsp.device_id, 0);
    assert_eq!(rsp.nsectors, 131_072, "brd rd_size=65536 KiB");
    assert_eq!(rsp.capacity_bytes(), Some(64 << 20));
    assert_eq!(rsp.logical_block_size, 512);
    rsp
}

fn ios(messages: &[Message<'_>]) -> Vec<(IoOp, u64, u32, u32)> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Io(io) => Some((io.op, io.sector, io.bi_size, io.rw())),
            _ => None,
        })
        .collect()
}

#[test]
fn linux_srv_linux_clt() {
    let session = decode("rnbd-linux-srv-linux-clt");
    let messages = messages(&session);
    let open_rsp = check_map(&session, &messages);
    // brd: 4096-byte physical blocks, max_hw_sectors 255 (ignored by the
    // client), no discard, no volatile cache (cache_policy 0: the server never
    // sees FLUSH or FUA, rnbd.md §3).
    assert_eq!(
        open_rsp,
        OpenRsp {
            device_id: 0,
            nsectors: 131_072,
            max_hw_sectors: 255,
            max_write_same_sectors: 0,
            max_discard_sectors: 0,
            discard_granularity: 0,
            discard_alignment: 0,
            physical_block_size: 4096,
            logical_block_size: 512,
            max_segments: 128,
            secure_discard: 0,
            rotational: 0,
            cache_policy: CachePolicy(0),
        }
    );
    let ios = ios(&messages);
    // 3 partition-scan reads, write 4 KiB @0, write 128 KiB @1 MiB (split
    // 124 KiB + 4 KiB at 248 sectors), read 4 KiB @0, read 128 KiB @1 MiB.
    assert_eq!(ios.len(), 9);
    // Partition scan: sectors 0, 8, 24; reads carry rw 0x100 (READ|SYNC),
    // O_DIRECT writes 0x101 (WRITE|SYNC).
    assert_eq!(
        &ios[..6],
        &[
            (IoOp::Read, 0, 4096, 0x100),
            (IoOp::Read, 8, 4096, 0x100),
            (IoOp::Read, 24, 4096, 0x100),
            (IoOp::Write, 0, 4096, 0x101),
            (IoOp::Write, 2048, 126_976, 0x101),
            (IoOp::Write, 2048 + 248, 4096, 0x101),
        ]
    );
    assert_eq!(ios[6], (IoOp::Read, 0, 4096, 0x100));
    let mut big_read = [ios[7], ios[8]];
    big_read.sort_by_key(|io| io.1);
    assert_eq!(
        big_read,
        [
            (IoOp::Read, 2048, 126_976, 0x100),
            (IoOp::Read, 2296, 4096, 0x100)
        ]
    );
    assert!(messages.iter().all(|m| match m {
        Message::Io(io) => io.op != IoOp::Read || io.flags.contains(IoFlags::SYNC),
        _ => true,
    }));
    assert_eq!(
        messages.last(),
        Some(&Message::Close(rnbd::wire::Close { device_id: 0 }))
    );
    // Read data came back for every read: 4096 / 126976 bytes.
    for (index, request) in session.requests.iter().enumerate() {
        if let IoMsg::Read(read) = request.msg {
            let data = read_data(&session, index).expect("read data");
            assert_eq!(data.len() as u32, read.desc.unwrap().len);
        }
    }
}

#[test]
fn two_cpus() {
    let session = decode("rnbd-2cpu");
    let messages = messages(&session);
    check_map(&session, &messages);
    let ios = ios(&messages);
    assert_eq!(ios.len(), 5, "3 scans, 4 KiB write, 4 KiB read");
    assert_eq!((ios[3].0, ios[3].2), (IoOp::Write, 4096));
    assert_eq!((ios[4].0, ios[4].2), (IoOp::Read, 4096));
    assert!(matches!(messages.last(), Some(Message::Close(_))));
}

#[test]
fn multipath() {
    let session = decode("rnbd-multipath");
    let messages = messages(&session);
    check_map(&session, &messages);
    let ios = ios(&messages);
    assert_eq!(
        ios.len(),
        5,
        "3 scans, 4 KiB write, 4 KiB read, all on path 1"
    );
    assert!(matches!(messages.last(), Some(Message::Close(_))));
}

#[test]
fn lossy() {
    let session = decode("rnbd-lossy");
    let messages = messages(&session);
    check_map(&session, &messages);
    let ios = ios(&messages);
    assert_eq!(ios.len(), 9);
    assert_eq!((ios[4].0, ios[4].1, ios[4].2), (IoOp::Write, 2048, 126_976));
}

#[test]
fn lossy_stall() {
    let session = decode("rnbd-lossy-stall");
    let messages = messages(&session);
    check_map(&session, &messages);
    assert!(ios(&messages).iter().all(|io| io.0 == IoOp::Read));
}

#[test]
fn every_capture_decodes() {
    for name in common::capture_names() {
        let session = decode(&name);
        let messages = messages(&session);
        assert_eq!(messages.len(), session.requests.len(), "{name}");
    }
}
