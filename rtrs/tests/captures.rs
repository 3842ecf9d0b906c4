//! RTRS messages of every capture in `tests/vectors/`, decoded with `rtrs::wire`.
//!
//! The walker (`common`) replays each capture as the RC responder would see
//! it and models the server's chunks; it asserts the protocol invariants as it
//! goes (requests written with the chunk's newest rkey, message located by the
//! IO_REQ immediate, read data matching the read descriptor, RKEY_RSP buf_id ==
//! msg_id, type-2 responses exactly after a SEND_WITH_INV, heartbeats on cid 0
//! with VA 0 / rkey 0) and that `emit(parse(bytes)) == bytes` byte for byte
//! for every CON_REQ, CONN_RSP, INFO_REQ, INFO_RSP, IO trailer and RKEY_RSP.
//! The tests here check the values the README and the `*.cm.txt` decodes give.

mod common;

use common::{decode, Dir, Session};
use rtrs::wire::{ConnRsp, ConnRspFlags, Imm, IoMsg, ReadFlags, Uuid, MAGIC, VERSION};

fn uuid(text: &str) -> Uuid {
    let hex: Vec<u8> = text
        .bytes()
        .filter(|b| *b != b'-')
        .collect::<Vec<_>>()
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect();
    Uuid(hex.try_into().unwrap())
}

/// What every Linux 6.1 server REP in the captures says (README: qd 512,
/// max_io_size 126976, max_hdr_size 4096, flags 2 = NEW_RKEY_F).
fn check_conn_rsps(session: &Session, expected: usize) {
    assert_eq!(session.conn_rsps.len(), expected);
    for (frame, _, rsp) in &session.conn_rsps {
        assert_eq!(
            *rsp,
            ConnRsp::accept(512, 126_976, 4096, ConnRspFlags::NEW_RKEY),
            "frame {frame}"
        );
        assert_eq!(rsp.chunk_size(), Some(131_072));
        assert_eq!(rsp.flags.0, 2);
    }
}

/// One INFO_REQ "s1" and one INFO_RSP of 512 chunk descriptors per path.
fn check_info(session: &Session, paths: usize) {
    assert_eq!(session.info_reqs.len(), paths);
    for (_, _, name) in &session.info_reqs {
        assert_eq!(name, "s1");
    }
    assert_eq!(session.info_rsps.len(), paths);
    for (frame, _, descs) in &session.info_rsps {
        assert_eq!(
            descs.len(),
            512,
            "frame {frame}: always_invalidate: one MR per chunk"
        );
        assert!(descs.iter().all(|d| d.len == 131_072), "frame {frame}");
    }
}

/// Every request: the header sits right after the data (write) or the data
/// area is left for the server (read); every answered one has errno 0.
fn check_requests(session: &Session) {
    for request in &session.requests {
        let frame = request.frame;
        assert_eq!(
            request.offset as usize,
            request.data_len + request.user_header.len()
        );
        match request.msg {
            IoMsg::Write(write) => {
                assert_eq!(
                    request.write_start, 0,
                    "frame {frame}: writes start at the chunk base"
                );
                assert_eq!(
                    request.write_len as usize,
                    request.offset as usize + 4,
                    "frame {frame}"
                );
                assert_eq!(usize::from(write.usr_len), request.user_header.len());
            }
            IoMsg::Read(read) => {
                assert_eq!(
                    request.write_start as usize, request.data_len,
                    "frame {frame}"
                );
                let desc_len = if read.desc.is_some() { 24 } else { 8 };
                assert_eq!(
                    request.write_len as usize,
                    request.user_header.len() + desc_len,
                    "frame {frame}"
                );
                if let Some(desc) = read.desc {
                    assert!(read.flags.contains(ReadFlags::NEED_INVAL), "frame {frame}");
                    assert_eq!(desc.len as usize, request.data_len, "frame {frame}");
                }
            }
        }
    }
    for response in &session.responses {
        assert!(matches!(
            response.imm,
            Imm::IoRsp { errno: 0, .. } | Imm::IoRspWithInvalidate { errno: 0, .. }
        ));
    }
}

fn heartbeats(session: &Session, dir: Dir, imm: Imm) -> usize {
    session
        .heartbeats
        .iter()
        .filter(|(_, d, i)| *d == dir && *i == imm)
        .count()
}

#[test]
fn linux_srv_linux_clt() {
    let session = decode("rnbd-linux-srv-linux-clt");
    // Frames 5-10: two connections of one path.
    assert_eq!(session.conn_reqs.len(), 2);
    for (i, (frame, _, req)) in session.conn_reqs.iter().enumerate() {
        assert_eq!(req.cid, i as u16, "frame {frame}");
        assert_eq!(req.cid_num, 2);
        assert_eq!(req.recon_cnt, 1);
        assert_eq!(req.version, VERSION);
        assert!(req.first_conn);
        assert_eq!(req.path_uuid, session.conn_reqs[0].2.path_uuid);
        assert_eq!(req.session_uuid, session.conn_reqs[0].2.session_uuid);
    }
    assert_eq!(session.conn_reqs[0].0, 5);
    assert_eq!(session.conn_reqs[1].0, 8);
    check_conn_rsps(&session, 2);
    check_info(&session, 1);
    assert_eq!(session.info_reqs[0].0, 11);
    assert_eq!(session.info_rsps[0].0, 21, "SEND_FIRST 13 .. SEND_LAST 21");
    check_requests(&session);

    // Frame 23: SESS_INFO, imm 0x48 = IO_REQ chunk 0 offset 72 (36 + 36).
    let sess_info = &session.requests[0];
    assert_eq!(sess_info.frame, 23);
    assert_eq!(sess_info.imm, 0x48);
    assert_eq!(
        (sess_info.buf_id, sess_info.offset, sess_info.cid),
        (0, 72, 0)
    );
    assert_eq!(sess_info.write_len, 60);
    let IoMsg::Read(read) = sess_info.msg else {
        panic!("SESS_INFO is an RTRS READ")
    };
    assert_eq!(read.usr_len, 36);
    assert_eq!(read.flags, ReadFlags::NEED_INVAL);
    assert_eq!(read.desc.unwrap().len, 36);
    assert_eq!(
        read.desc.unwrap().rkey.0,
        0x314,
        "frame 26 invalidates this rkey"
    );
    // Frames 25-27: 36 bytes of data, SEND_WITH_INV, SEND_WITH_IMM 0x20000000.
    assert_eq!(session.read_data[0].0, 25);
    assert_eq!(session.read_data[0].2.len(), 36);
    assert_eq!(session.invalidates[0], (26, 0));
    let response = &session.responses[0];
    assert_eq!(response.frame, 27);
    assert_eq!(
        response.imm,
        Imm::IoRspWithInvalidate {
            msg_id: 0,
            errno: 0
        }
    );
    assert_eq!(response.rkey_rsp.buf_id, 0);

    // Frame 31: OPEN, 288 bytes, imm 0x140 (264 + 56 = 320).
    let open = &session.requests[1];
    assert_eq!((open.frame, open.imm, open.write_len), (31, 0x140, 288));
    assert_eq!(open.user_header.len(), 264);
    assert_eq!(session.read_data[1].0, 33);
    assert_eq!(session.read_data[1].2.len(), 56);
    assert_eq!(session.responses[1].frame, 35);
    // Chunk 0 was re-keyed by the RKEY_RSP of frame 27: the OPEN used the new rkey
    // (the walker asserts it); it is chunk 0 again.
    assert_eq!(open.buf_id, 0);

    // Frame 39: first partition-scan read on cid 1, imm 0x00081020 = chunk 1,
    // offset 4128 (4096 + 32).
    let scan = &session.requests[2];
    assert_eq!((scan.frame, scan.imm, scan.cid), (39, 0x0008_1020, 1));
    assert_eq!((scan.buf_id, scan.offset, scan.data_len), (1, 4128, 4096));

    // The 4 KiB write (frames 72-79), 128 KiB write split 127012 + 4132 bytes
    // (80-213), 4 KiB read, 128 KiB read split 126976 + 4096 (228-370).
    let writes: Vec<_> = session
        .requests
        .iter()
        .filter(|r| matches!(r.msg, IoMsg::Write(_)) && r.data_len > 0)
        .map(|r| (r.data_len, r.write_len, r.cid))
        .collect();
    assert_eq!(
        writes,
        [(4096, 4132, 1), (126_976, 127_012, 1), (4096, 4132, 1)]
    );
    let reads: Vec<_> = session
        .requests
        .iter()
        .filter(|r| matches!(r.msg, IoMsg::Read(_)) && r.cid == 1)
        .map(|r| r.data_len)
        .collect();
    assert_eq!(
        reads.len(),
        6,
        "3 partition-scan reads, 4 KiB, 124 KiB + 4 KiB"
    );
    assert_eq!(reads[3], 4096);
    let mut last_two = [reads[4], reads[5]];
    last_two.sort();
    assert_eq!(last_two, [4096, 126_976]);
    let write_4k = session
        .requests
        .iter()
        .find(|r| (72..=79).contains(&r.frame))
        .expect("frames 72-79");
    assert_eq!(write_4k.data_len, 4096);
    let response = &session.responses[write_4k.response.unwrap()];
    assert_eq!(
        response.imm,
        Imm::IoRsp {
            msg_id: write_4k.buf_id,
            errno: 0
        }
    );

    // Frames 389-392: CLOSE, 12 bytes (8 + 4), an RTRS WRITE without data.
    let close = session.requests.last().unwrap();
    assert_eq!(
        (close.frame, close.write_len, close.data_len, close.cid),
        (389, 12, 0, 0)
    );
    assert_eq!(
        session.requests.len(),
        12,
        "SESS_INFO, OPEN, 3 scans, 1 + 2 writes, 1 + 2 reads, CLOSE"
    );
    assert!(session.requests.iter().all(|r| r.response.is_some()));

    // Frames 373-388: heartbeats from both sides, each acked.
    assert!(heartbeats(&session, Dir::ToServer, Imm::HbMsg) >= 1);
    assert!(heartbeats(&session, Dir::ToClient, Imm::HbAck) >= 1);
    assert!(heartbeats(&session, Dir::ToClient, Imm::HbMsg) >= 1);
    assert!(heartbeats(&session, Dir::ToServer, Imm::HbAck) >= 1);
    assert_eq!(
        heartbeats(&session, Dir::ToServer, Imm::HbMsg),
        heartbeats(&session, Dir::ToClient, Imm::HbAck)
    );
}

#[test]
fn two_cpus() {
    let session = decode("rnbd-2cpu");
    let path = uuid("f07445c4-9e76-45d9-81b2-96531af96849");
    let sess = uuid("dd85dac6-e15c-4790-8701-73914d604d86");
    assert_eq!(session.conn_reqs.len(), 3);
    for (i, (_, _, req)) in session.conn_reqs.iter().enumerate() {
        assert_eq!((req.cid, req.cid_num, req.recon_cnt), (i as u16, 3, 1));
        assert_eq!((req.path_uuid, req.session_uuid), (path, sess));
        assert!(req.first_conn);
    }
    check_conn_rsps(&session, 3);
    check_info(&session, 1);
    check_requests(&session);
    // Frames 75-82: 4 KiB write from CPU 0 on cid 1; 83-93: 4 KiB read from
    // CPU 1 on cid 2.
    let write = session
        .requests
        .iter()
        .find(|r| (75..=82).contains(&r.frame))
        .unwrap();
    assert!(matches!(write.msg, IoMsg::Write(_)));
    assert_eq!((write.cid, write.data_len), (1, 4096));
    let read = session
        .requests
        .iter()
        .find(|r| (83..=93).contains(&r.frame))
        .unwrap();
    assert!(matches!(read.msg, IoMsg::Read(_)));
    assert_eq!((read.cid, read.data_len), (2, 4096));
    assert!(session.requests.iter().all(|r| r.response.is_some()));
}

#[test]
fn multipath() {
    let session = decode("rnbd-multipath");
    let path1 = uuid("57907b03-89c8-41d3-a8f5-2125909fc762");
    let path2 = uuid("e5915a8f-338f-4e50-b5f8-9d375f711462");
    let sess = uuid("c16c2053-6554-4bef-a55a-472e48067165");
    let summary: Vec<_> = session
        .conn_reqs
        .iter()
        .map(|(frame, server, req)| {
            (
                *frame,
                server.octets()[1],
                req.cid,
                req.cid_num,
                req.path_uuid,
                req.first_conn,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (5, 77, 0, 2, path1, true),
            (8, 77, 1, 2, path1, true),
            (25, 78, 0, 2, path2, false), // joins the existing session
            (28, 78, 1, 2, path2, true),
        ]
    );
    assert!(session
        .conn_reqs
        .iter()
        .all(|(_, _, req)| req.session_uuid == sess));
    check_conn_rsps(&session, 4);
    check_info(&session, 2);
    // Each path registers its own MRs: different rkeys.
    assert_ne!(
        session.info_rsps[0].2[0].rkey,
        session.info_rsps[1].2[0].rkey
    );
    check_requests(&session);
    // All IO on path 1 (10.77).
    assert!(session.requests.iter().all(|r| r.server.octets()[1] == 77));
    assert!(session.requests.iter().all(|r| r.response.is_some()));
}

#[test]
fn lossy() {
    let session = decode("rnbd-lossy");
    check_conn_rsps(&session, session.conn_reqs.len());
    check_info(&session, 1);
    check_requests(&session);
    // Retransmissions are delivered once: SESS_INFO, OPEN, 3 scans, 4 KiB
    // write, 124 KiB + 4 KiB write, 4 KiB read, 124 KiB + 4 KiB read, CLOSE.
    assert_eq!(session.requests.len(), 12);
    let writes: Vec<_> = session
        .requests
        .iter()
        .filter(|r| matches!(r.msg, IoMsg::Write(_)) && r.data_len > 0)
        .map(|r| r.data_len)
        .collect();
    assert_eq!(writes, [4096, 126_976, 4096]);
    // The CLOSE's ACK was dropped and the client disconnected; its response
    // (if any) is the last frame; every other request was answered.
    assert!(session.requests[..11].iter().all(|r| r.response.is_some()));
}

#[test]
fn lossy_stall() {
    let session = decode("rnbd-lossy-stall");
    check_conn_rsps(&session, session.conn_reqs.len());
    check_info(&session, 1);
    check_requests(&session);
    // The negative vector: the server sent everything (s2c frames the relay
    // dropped are in the capture), but the client stalls after the
    // partition-scan read of frames 66-71, so no further request follows.
    assert_eq!(
        session.requests.len(),
        5,
        "SESS_INFO, OPEN, 3 partition-scan reads, then nothing"
    );
    assert!(session.requests.iter().all(|r| r.frame <= 71));
}

#[test]
fn rping_has_no_rtrs() {
    for name in ["rping-linux", "rping-linux-S3000"] {
        let session = decode(name);
        assert!(session.conn_reqs.is_empty(), "{name}");
        assert_eq!(
            session.foreign_reqs, 1,
            "{name}: the REQ's private data is only the CMA header"
        );
        assert!(session.requests.is_empty());
    }
}

#[test]
fn every_capture_decodes() {
    for name in common::capture_names() {
        let session = decode(&name);
        if name.starts_with("rnbd") {
            assert!(!session.conn_reqs.is_empty(), "{name}");
            for (_, _, req) in &session.conn_reqs {
                let mut buf = [0u8; 56];
                req.emit(&mut buf).unwrap();
                assert_eq!(u16::from_le_bytes([buf[2], buf[3]]), MAGIC);
            }
        }
    }
}
