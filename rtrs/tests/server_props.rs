//! Property test: arbitrary immediates, chunk contents, answers and
//! disconnects never panic the server, and teardown always returns every
//! table entry and buffer (rnbd.md §8.2, ARCHITECTURE.md §8).

mod server_support;

use proptest::prelude::*;
use rtrs::server::{Event, IoToken, ReadData, Usage};
use rtrs::wire::{BufferDesc, Imm, ReadFlags, ReadMsg, RkeyRsp, WriteMsg};
use server_support::*;
use verbs::{CmEvent, Rkey, SendOp};

#[derive(Debug, Clone)]
enum Op {
    /// An RDMA WRITE WITH IMM carrying `imm` on connection `cid`.
    Imm { cid: usize, imm: u32 },
    /// A plausible IO_REQ: chunk id and offset below the chunk size.
    IoReq { cid: usize, chunk: u32, offset: u32 },
    /// A well-formed request (write or read trailer + immediate); sizes may
    /// still be hostile.
    Request {
        cid: usize,
        chunk: u32,
        read: bool,
        data_len: u32,
        usr_len: u16,
        need_inval: bool,
    },
    /// Client bytes written into a chunk (with the current rkey).
    Write {
        chunk: usize,
        offset: u32,
        bytes: Vec<u8>,
    },
    /// Answer every outstanding request with `errno`.
    Answer { errno: u16 },
    /// The provider completes every outstanding send.
    CompleteSends,
    /// Time passes.
    Advance { seconds: u64 },
    /// A connection drops.
    Disconnect { cid: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..2usize, any::<u32>()).prop_map(|(cid, imm)| Op::Imm { cid, imm }),
        (0..2usize, 0..10u32, 0..16_384u32).prop_map(|(cid, chunk, offset)| Op::IoReq {
            cid,
            chunk,
            offset
        }),
        (
            0..2usize,
            0..8u32,
            any::<bool>(),
            0..13_000u32,
            0..64u16,
            any::<bool>()
        )
            .prop_map(
                |(cid, chunk, read, data_len, usr_len, need_inval)| Op::Request {
                    cid,
                    chunk,
                    read,
                    data_len,
                    usr_len,
                    need_inval
                }
            ),
        (
            0..8usize,
            0..16_400u32,
            proptest::collection::vec(any::<u8>(), 0..48)
        )
            .prop_map(|(chunk, offset, bytes)| Op::Write {
                chunk,
                offset,
                bytes
            }),
        (0..600u16).prop_map(|errno| Op::Answer { errno }),
        Just(Op::CompleteSends),
        (0..12u64).prop_map(|seconds| Op::Advance { seconds }),
        (0..2usize).prop_map(|cid| Op::Disconnect { cid }),
    ]
}

fn run(ops: Vec<Op>, invalidate: bool) {
    let mut config = small_config();
    config.always_invalidate = invalidate;
    let mut h = Harness::new(config);
    let mut path = ClientPath::open(&mut h, 2, 1, 1, "prop");
    let mut tokens: Vec<IoToken> = Vec::new();
    let mut seen_sends = h.mock().sends.len();
    let mut ios = 0;
    for op in ops {
        match op {
            Op::Imm { cid, imm } => {
                let conn = path.conns[cid];
                if h.mock().posted_receives(conn) > 0 {
                    h.mock().deliver_imm(conn, imm);
                }
            }
            Op::IoReq { cid, chunk, offset } => {
                let conn = path.conns[cid];
                let payload = (chunk << path.layout.mem_bits()) | offset;
                if let Ok(imm) = (Imm::IoReq { payload }).encode() {
                    if h.mock().posted_receives(conn) > 0 {
                        h.mock().deliver_imm(conn, imm);
                    }
                }
            }
            Op::Request {
                cid,
                chunk,
                read,
                data_len,
                usr_len,
                need_inval,
            } => {
                let desc = path.chunks[chunk as usize];
                let offset = data_len + u32::from(usr_len);
                let mut msg = [0u8; 24];
                let len = if read {
                    ReadMsg {
                        usr_len,
                        flags: ReadFlags(u16::from(need_inval)),
                        desc: Some(BufferDesc {
                            addr: 0x1000,
                            rkey: Rkey(0x55),
                            len: data_len,
                        }),
                    }
                    .emit(&mut msg)
                    .unwrap()
                } else {
                    WriteMsg { usr_len }.emit(&mut msg).unwrap()
                };
                let _ =
                    h.mock()
                        .remote_write(desc.rkey, desc.addr + u64::from(offset), &msg[..len]);
                let conn = path.conns[cid];
                if let Some(payload) = path.layout.join(chunk, offset) {
                    let imm = Imm::IoReq { payload }.encode().unwrap();
                    if h.mock().posted_receives(conn) > 0 {
                        h.mock().deliver_imm(conn, imm);
                    }
                }
            }
            Op::Write {
                chunk,
                offset,
                bytes,
            } => {
                let desc = path.chunks[chunk];
                let _ = h
                    .mock()
                    .remote_write(desc.rkey, desc.addr + u64::from(offset), &bytes);
            }
            Op::Answer { errno } => {
                let now = h.now;
                for token in tokens.drain(..) {
                    let _ = h
                        .server
                        .complete_io(token, errno, ReadData::Chunk, now, &mut h.ports);
                }
            }
            Op::CompleteSends => h.mock().complete_sends(),
            Op::Advance { seconds } => h.now += seconds * SECOND,
            Op::Disconnect { cid } => {
                let conn = path.conns[cid];
                h.mock().cm_events.push_back(CmEvent::Disconnected { conn });
            }
        }
        h.settle();
        for event in h.drain_events() {
            if let Event::Io { token, .. } = event {
                ios += 1;
                tokens.push(token);
            }
        }
        // Track new rkeys like the client does.
        let sends = h.mock().sends_since(seen_sends);
        seen_sends += sends.len();
        for (_, wr) in sends {
            if let SendOp::SendInline { imm: Some(_), .. } = wr.op {
                if let Ok(rsp) = RkeyRsp::parse(&h.mock().gather(&wr)) {
                    path.chunks[usize::from(rsp.buf_id)].rkey = rsp.rkey;
                }
            }
        }
    }
    IOS_SEEN.fetch_add(ios, std::sync::atomic::Ordering::Relaxed);
    // Teardown: everything goes back.
    for conn in path.conns.clone() {
        h.mock().cm_events.push_back(CmEvent::Disconnected { conn });
    }
    h.settle();
    let now = h.now;
    for token in tokens.drain(..) {
        let _ = h
            .server
            .complete_io(token, 0, ReadData::Chunk, now, &mut h.ports);
    }
    h.mock().complete_sends();
    h.settle();
    h.drain_events();
    assert_eq!(h.server.usage(), Usage::default());
    assert_eq!(h.mock().arena.buffers(), 0);
}

/// Requests handed to the consumer over all cases (the property is only
/// meaningful if the generator reaches the IO path).
static IOS_SEEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn generator_reaches_the_io_path() {
    let ops = vec![
        Op::Request {
            cid: 1,
            chunk: 2,
            read: false,
            data_len: 512,
            usr_len: 32,
            need_inval: false,
        },
        Op::CompleteSends,
        Op::Answer { errno: 0 },
        Op::Request {
            cid: 0,
            chunk: 3,
            read: true,
            data_len: 512,
            usr_len: 32,
            need_inval: true,
        },
        Op::CompleteSends,
    ];
    let before = IOS_SEEN.load(std::sync::atomic::Ordering::Relaxed);
    run(ops, true);
    assert!(IOS_SEEN.load(std::sync::atomic::Ordering::Relaxed) >= before + 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn arbitrary_input_never_panics_and_never_leaks(
        ops in proptest::collection::vec(op(), 0..40),
        invalidate in any::<bool>(),
    ) {
        run(ops, invalidate);
    }
}
