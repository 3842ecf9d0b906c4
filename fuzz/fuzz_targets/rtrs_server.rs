//! The RTRS server (`rtrs::server::Server`) over the crate's test verbs
//! (`rtrs/tests/server_support`: a mock provider with registered memory
//! and a model of the Linux client), driven by a script: CON_REQs (well
//! formed for up to four paths of two sessions, with any cid, cid_num and
//! reconnect count, or mutated), INFO_REQs, RDMA WRITE WITH IMM requests
//! (WRITE and READ messages into the chunks the INFO_RSP gave, or any
//! immediate), heartbeats, IO completions with any errno, connection
//! events (established, disconnected, rejected, unreachable), failed
//! receive completions, time jumps, `close_all`, admission rules (by
//! session name and client address), with a half-open table smaller than
//! the connections the script can open.
//!
//! Invariants: no panic; the server holds no more sessions than its
//! configuration allows and no connection the provider does not have.
#![no_main]

#[path = "../../rtrs/tests/server_support/mod.rs"]
#[allow(clippy::all, unused)]
mod server_support;

use brick_fuzz::script::Script;
use libfuzzer_sys::fuzz_target;
use rtrs::server::{Event, IoToken, ReadData};
use rtrs::wire::{BufferDesc, Imm, ImmLayout, InfoReq, InfoRsp, ReadFlags, ReadMsg, WriteMsg};
use server_support::{con_req, small_config, Harness, SECOND};
use std::net::{IpAddr, Ipv4Addr};
use verbs::{
    CmEvent, ConnId, PrivateData, RejectReason, Rkey, SendOp, WcOpcode, WcStatus, WorkCompletion,
};

/// Paths the script can use (two per session).
const PATHS: usize = 4;
/// Registered memory of the mock provider. The server holds at most
/// 2 × max_sessions × max_paths_per_session = 8 paths, each a pool of
/// queue_depth (8) chunks of 16 KiB at 4 KiB alignment plus three small
/// buffers: about 1.1 MiB. (`Harness::new`'s 8 MiB, zeroed for every
/// input, took a third of the time.)
const POOL: usize = 2 << 20;

#[derive(Default)]
struct ClientPath {
    /// Connections by cid.
    conns: Vec<Option<ConnId>>,
    /// The chunks, once an INFO_RSP came.
    chunks: Vec<BufferDesc>,
}

struct Fuzz {
    h: Harness,
    paths: Vec<ClientPath>,
    tokens: Vec<IoToken>,
    layout: ImmLayout,
}

impl Fuzz {
    fn conn(&self, script: &mut Script<'_>) -> Option<ConnId> {
        let path = &self.paths[usize::from(script.below(PATHS as u8))];
        let live: Vec<ConnId> = path.conns.iter().flatten().copied().collect();
        if live.is_empty() {
            None
        } else {
            Some(live[usize::from(script.u8()) % live.len()])
        }
    }

    /// Polls the server, takes its events, checks the invariants.
    fn settle(&mut self) {
        self.h.settle();
        for _ in 0..1024 {
            let Some(event) = self.h.server.next_event() else {
                break;
            };
            if let Event::Io { token, .. } = event {
                if self.tokens.len() < 256 {
                    self.tokens.push(token);
                }
            }
        }
        let usage = self.h.server.usage();
        let config = *self.h.server.config();
        // `usage.sessions` counts live slots: the open sessions (at most
        // `max_sessions`, admission's limit) and closed ones whose paths
        // still drain, which the table holds as many of again.
        assert!(
            usage.sessions <= 2 * usize::from(config.max_sessions),
            "{} live sessions, the table holds {}",
            usage.sessions,
            2 * config.max_sessions
        );
        let live = self.h.ports[0].live.len();
        assert!(
            usage.connections <= live,
            "the server holds {} connections, the provider has {live}",
            usage.connections
        );
    }

    /// Parses the INFO_RSP posted since send `from`, if any.
    fn take_info_rsp(&mut self, from: usize, path: usize) {
        let sends = self.h.mock().sends_since(from);
        let Some((_, wr)) = sends
            .iter()
            .find(|(_, wr)| matches!(wr.op, SendOp::Send { imm: None, .. }))
        else {
            return;
        };
        let bytes = self.h.mock().gather(wr);
        let config = *self.h.server.config();
        if let Ok(rsp) = InfoRsp::parse(&bytes) {
            if rsp
                .check_layout(config.queue_depth, config.chunk_size)
                .is_ok()
            {
                self.paths[path].chunks = (0..u32::from(config.queue_depth))
                    .filter_map(|id| rsp.chunk(config.chunk_size, id))
                    .collect();
            }
        }
    }

    /// Sends `imm` on `conn` if a receive is posted there.
    fn imm(&mut self, conn: ConnId, imm: u32) {
        if self.h.mock().posted_receives(conn) > 0 {
            self.h.mock().deliver_imm(conn, imm);
        }
    }

    /// Writes `bytes` at `offset` of chunk `id` of `path` with its
    /// current rkey (refused writes are dropped, as a responder would),
    /// then the IO_REQ for `end` (the message's end) on `conn`.
    fn request(&mut self, conn: ConnId, path: usize, id: u32, offset: u64, bytes: &[u8], end: u32) {
        let Some(chunk) = self.paths[path].chunks.get(id as usize).copied() else {
            return;
        };
        let _ = self
            .h
            .mock()
            .remote_write(chunk.rkey, chunk.addr + offset, bytes);
        if let Some(payload) = self.layout.join(id, end) {
            if let Ok(imm) = (Imm::IoReq { payload }).encode() {
                self.imm(conn, imm);
            }
        }
    }
}

fn op(fuzz: &mut Fuzz, script: &mut Script<'_>) {
    match script.below(13) {
        // A well-formed CON_REQ for one cid of a path.
        0 | 1 => {
            let path = usize::from(script.below(PATHS as u8));
            let cid_num = 1 + u16::from(script.below(4));
            let cid = u16::from(script.below(4)) % cid_num;
            let recon = u16::from(script.below(3));
            let session = (path / 2) as u8 + 1;
            let conn = fuzz
                .h
                .request(&con_req(cid, cid_num, path as u8 + 1, session, recon));
            if fuzz.h.was_accepted(conn) {
                let conns = &mut fuzz.paths[path].conns;
                if conns.len() <= usize::from(cid) {
                    conns.resize(usize::from(cid) + 1, None);
                }
                conns[usize::from(cid)] = Some(conn);
            }
        }
        // A mutated or raw CON_REQ.
        2 => {
            let mut data = con_req(0, 2, 1, 1, 0);
            if script.u8() & 1 == 0 {
                for _ in 0..=script.below(4) {
                    let at = usize::from(script.u8()) % data.len();
                    data[at] ^= script.u8();
                }
            } else {
                data = script.bytes(verbs::MAX_PRIVATE_DATA_LEN).to_vec();
            }
            let _ = fuzz.h.request(&data);
        }
        // INFO_REQ on a path's cid 0: a good name or raw bytes.
        3 => {
            let path = usize::from(script.below(PATHS as u8));
            let Some(Some(conn)) = fuzz.paths[path].conns.first().copied() else {
                return;
            };
            let mut info = vec![0u8; InfoReq::LEN];
            if script.u8() & 1 == 0 {
                let name = if script.u8() & 1 == 0 { "s1" } else { "s2" };
                InfoReq { session_name: name }.emit(&mut info).unwrap();
            } else {
                let raw = script.bytes(InfoReq::LEN + 8);
                info = raw.to_vec();
            }
            if fuzz.h.mock().posted_receives(conn) > 0 {
                let from = fuzz.h.mock().sends.len();
                fuzz.h.mock().deliver_send(conn, &info);
                fuzz.h.settle();
                fuzz.take_info_rsp(from, path);
            }
        }
        // An RTRS WRITE: data || user header || WRITE message.
        4 | 5 => {
            let Some(conn) = fuzz.conn(script) else {
                return;
            };
            let path = usize::from(script.below(PATHS as u8));
            let id = u32::from(script.u8()) % 10;
            let data_len = usize::from(script.u16()) % (20 << 10);
            let header = script.bytes(64).to_vec();
            let mut bytes = vec![0u8; data_len];
            bytes.extend_from_slice(&header);
            let mut msg = [0u8; 4];
            let usr_len = if script.u8() < 240 {
                header.len() as u16
            } else {
                script.u16()
            };
            WriteMsg { usr_len }.emit(&mut msg).unwrap();
            bytes.extend_from_slice(&msg);
            let end = bytes.len() as u32;
            fuzz.request(conn, path, id, 0, &bytes, end);
        }
        // An RTRS READ: user header || READ message at offset `len`.
        6 => {
            let Some(conn) = fuzz.conn(script) else {
                return;
            };
            let path = usize::from(script.below(PATHS as u8));
            let id = u32::from(script.u8()) % 10;
            let len = u32::from(script.u16()) % (20 << 10);
            let header = script.bytes(64).to_vec();
            let flags = if script.u8() & 1 == 0 {
                ReadFlags::NEED_INVAL
            } else {
                ReadFlags(0)
            };
            let mut msg = [0u8; 24];
            let n = ReadMsg {
                usr_len: header.len() as u16,
                flags,
                desc: Some(BufferDesc {
                    addr: 0x7000_0000,
                    rkey: Rkey(script.u32()),
                    len: u32::from(script.u16()),
                }),
            }
            .emit(&mut msg)
            .unwrap();
            let mut bytes = header.clone();
            bytes.extend_from_slice(&msg[..n]);
            let end = len + bytes.len() as u32;
            fuzz.request(conn, path, id, u64::from(len), &bytes, end);
        }
        // Any immediate (heartbeats, responses a server never gets, junk).
        7 => {
            let Some(conn) = fuzz.conn(script) else {
                return;
            };
            let imm = match script.below(3) {
                0 => Imm::HbMsg.encode().unwrap(),
                1 => Imm::HbAck.encode().unwrap(),
                _ => script.u32(),
            };
            fuzz.imm(conn, imm);
        }
        8 => fuzz.h.mock().complete_sends(),
        // Complete an IO with any errno.
        9 => {
            if fuzz.tokens.is_empty() {
                return;
            }
            let at = usize::from(script.u8()) % fuzz.tokens.len();
            let token = fuzz.tokens.swap_remove(at);
            let errno = if script.u8() < 200 { 0 } else { script.u16() };
            let now = fuzz.h.now;
            let h = &mut fuzz.h;
            let _ = h
                .server
                .complete_io(token, errno, ReadData::Chunk, now, &mut h.ports);
        }
        // A connection event.
        10 => {
            let Some(conn) = fuzz.conn(script) else {
                return;
            };
            let event = match script.below(4) {
                0 => CmEvent::Established {
                    conn,
                    private_data: PrivateData::default(),
                },
                1 => CmEvent::Disconnected { conn },
                2 => CmEvent::Unreachable { conn },
                _ => CmEvent::Rejected {
                    conn,
                    reason: RejectReason(u16::from(script.u8())),
                    private_data: PrivateData::default(),
                },
            };
            fuzz.h.mock().cm_events.push_back(event);
        }
        // A receive completes with an error.
        11 => {
            let Some(conn) = fuzz.conn(script) else {
                return;
            };
            let status = [
                WcStatus::WrFlushErr,
                WcStatus::LocLenErr,
                WcStatus::RemAccessErr,
                WcStatus::RetryExcErr,
            ][usize::from(script.below(4))];
            let mock = fuzz.h.mock();
            if let Some(recv) = mock.recvs.get_mut(&conn).and_then(|q| q.pop_front()) {
                mock.cq.push_back(WorkCompletion::new(
                    recv.wr_id,
                    conn,
                    WcOpcode::Recv,
                    status,
                ));
            }
        }
        _ => match script.u8() {
            0 => {
                let now = fuzz.h.now;
                let h = &mut fuzz.h;
                h.server.close_all(now, &mut h.ports);
            }
            // The admission rules: all, only session s1, or only s1 from
            // one path's client address (10.0.<path uuid byte>.2).
            1 => {
                let rules = &mut fuzz.h.policy.rules;
                rules.clear();
                match script.below(3) {
                    0 => {}
                    1 => rules.push(("s1".to_owned(), None)),
                    _ => {
                        let path = 1 + script.below(PATHS as u8);
                        let source = Ipv4Addr::new(10, 0, path, 2);
                        rules.push(("s1".to_owned(), Some(IpAddr::V4(source))));
                    }
                }
            }
            _ => {
                fuzz.h.now += u64::from(script.u8()).pow(2) * SECOND / 100;
            }
        },
    }
}

fuzz_target!(|input: &[u8]| {
    let mut script = Script::new(input);
    let mut config = small_config();
    // Below the 16 connections the script can open (two sessions, two
    // paths each, four cids), so the half-open table fills and evicts.
    config.max_half_open = 6;
    config.max_half_open_per_source = 4;
    let mut fuzz = Fuzz {
        h: Harness::with_pool(config, POOL),
        paths: (0..PATHS).map(|_| ClientPath::default()).collect(),
        tokens: Vec::new(),
        layout: ImmLayout::for_queue_depth(config.queue_depth).unwrap(),
    };
    while !script.done() {
        op(&mut fuzz, &mut script);
        fuzz.settle();
    }
});
