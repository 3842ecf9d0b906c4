//! Replays the RNBD requests of the Linux captures through Brick's server and
//! compares Brick's answers with Linux's.
//!
//! The capture walker of `brick-rtrs` (shared source) locates every request
//! in its chunk; the write data comes from the RDMA WRITE that carried the
//! request. Brick serves a 64 MiB RAM volume described like Linux's brd
//! `ram0` (512-byte logical, 4096-byte physical blocks, no volatile cache, no
//! discard) and must give: the same SESS_INFO_RSP and OPEN_RSP bytes, the
//! same errno for every request Linux answered, and the same read data.

#[path = "../../rtrs/tests/common/mod.rs"]
mod common;
mod support;

use std::collections::HashMap;

use common::{decode, deliver, Delivered, Dir};
use rnbd::server::{Grant, VolumeInfo};
use rnbd::wire::{Message, OpenRsp, RtrsDirection, SessInfoRsp};
use rtrs::wire::{Imm, IoMsg};
use support::{volume_id, Disks, Harness, TestExports};

const RAM0_SECTORS: u64 = 131_072;

fn brd_ram0() -> Harness {
    let mut exports = TestExports::default();
    exports.add(
        "ram0",
        VolumeInfo::new(volume_id(0), RAM0_SECTORS),
        Some(Grant::ReadWrite),
    );
    Harness::new(exports, Disks::with_sizes(&[RAM0_SECTORS * 512]))
}

/// Replays capture `name`; returns (requests replayed, responses compared,
/// reads compared that returned non-zero data).
fn replay(name: &str) -> (usize, usize, usize) {
    let session = decode(name);
    // The RDMA WRITE WITH IMM that completed each request, by frame.
    let writes: HashMap<usize, Vec<u8>> = deliver(name)
        .into_iter()
        .filter(|event| event.dir == Dir::ToServer)
        .filter_map(|event| match event.what {
            Delivered::Write {
                data, imm: Some(_), ..
            } => Some((event.frame, data)),
            _ => None,
        })
        .collect();
    let mut h = brd_ram0();
    let mut compared = 0;
    let mut nonzero_reads = 0;
    for (index, request) in session.requests.iter().enumerate() {
        let ctx = format!("{name} frame {}", request.frame);
        let direction = match request.msg {
            IoMsg::Read(_) => RtrsDirection::Read,
            IoMsg::Write(_) => RtrsDirection::Write,
        };
        let data = match direction {
            RtrsDirection::Write if request.data_len > 0 => {
                assert_eq!(request.write_start, 0, "{ctx}: data at the chunk start");
                writes.get(&request.frame).expect("write data")[..request.data_len].to_vec()
            }
            _ => Vec::new(),
        };
        let reply = h.request(&request.user_header, direction, request.data_len, &data);
        let status = reply.status.expect("answered at once");
        assert_eq!(reply.refused, None, "{ctx}: {reply:?}");
        // Linux's errno, where the capture holds the response.
        if let Some(response) = request.response {
            let linux_errno = match session.responses[response].imm {
                Imm::IoRsp { errno, .. } | Imm::IoRspWithInvalidate { errno, .. } => errno,
                other => panic!("{ctx}: {other:?}"),
            };
            assert_eq!(status, linux_errno, "{ctx}");
            compared += 1;
        }
        let linux_data = session
            .read_data
            .iter()
            .find(|(_, request, _)| *request == index)
            .map(|(_, _, data)| data.as_slice());
        match Message::parse(&request.user_header).unwrap() {
            Message::SessInfo(_) => {
                let linux = linux_data.expect("SESS_INFO_RSP");
                assert_eq!(SessInfoRsp::parse(linux), SessInfoRsp::parse(&reply.data));
                assert_eq!(reply.data, linux, "{ctx}: SESS_INFO_RSP byte-exact");
            }
            Message::Open(_) => {
                let linux = linux_data.expect("OPEN_RSP");
                let brick_rsp = OpenRsp::parse(&reply.data).unwrap();
                let linux_rsp = OpenRsp::parse(linux).unwrap();
                assert_eq!(brick_rsp, linux_rsp, "{ctx}: OPEN_RSP geometry");
                assert_eq!(reply.data, linux, "{ctx}: OPEN_RSP byte-exact");
            }
            Message::Io(_) if direction == RtrsDirection::Read => {
                if let Some(linux) = linux_data {
                    assert_eq!(reply.data.len(), linux.len(), "{ctx}");
                    assert!(reply.data == linux, "{ctx}: read data differs");
                    if linux.iter().any(|&b| b != 0) {
                        nonzero_reads += 1;
                    }
                }
            }
            _ => assert!(reply.data.is_empty(), "{ctx}"),
        }
    }
    (session.requests.len(), compared, nonzero_reads)
}

#[test]
fn linux_srv_linux_clt() {
    let (requests, compared, nonzero_reads) = replay("rnbd-linux-srv-linux-clt");
    // SESS_INFO, OPEN, 9 IOs, CLOSE; every one answered by Linux.
    assert_eq!(requests, 12);
    assert_eq!(compared, 12);
    // The read-backs of the 4 KiB and 128 KiB (124 + 4 KiB) writes.
    assert_eq!(nonzero_reads, 3);
}

#[test]
fn every_rnbd_capture() {
    for name in common::capture_names() {
        if name.starts_with("rnbd-") {
            let (requests, _, _) = replay(&name);
            assert!(requests >= 2, "{name}");
        }
    }
}
