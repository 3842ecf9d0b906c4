//! Capture walker shared by the rtrs and rnbd capture tests.
//!
//! Reads `tests/vectors/*.pcap`, parses every frame with `roce::wire`, and
//! replays what an RC responder would deliver: per (src, dst, QPN) flow, only
//! the next expected PSN is taken (duplicates and packets after a loss are
//! dropped, exactly as the responder does, so the lossy captures reassemble
//! correctly); SEND First/Middle/Last and RDMA WRITE First/Middle/Last are
//! reassembled into whole messages. On top, an RTRS model follows the server's
//! chunks: CON_REQ/CONN_RSP from the CM, INFO_REQ/INFO_RSP, every request
//! written into a modelled chunk and located with `rtrs::wire::IoRequest`,
//! read data matched to its request, responses matched and rkeys updated.
//! Every message Linux sent is also re-emitted and compared byte for byte.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use roce::pcap::Reader;
use roce::wire::cm::{self, Message as CmMessage};
use roce::wire::{parse_frame, Opcode};
use rtrs::wire::{
    BufferDesc, ConnReq, ConnRsp, Imm, ImmLayout, InfoReq, InfoRsp, IoMsg, IoRequest, RkeyRsp,
};

/// The RoCE path MTU of every capture (README: path MTU 1024).
const PMTU: u32 = 1024;

/// `tests/vectors/` at the workspace root.
pub fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors")
}

/// Every capture name (file stem), sorted.
pub fn capture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(vectors_dir())
        .expect("tests/vectors exists")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".pcap").map(str::to_owned)
        })
        .collect();
    names.sort();
    assert!(!names.is_empty());
    names
}

/// Which way a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    /// Client to server.
    ToServer,
    /// Server to client.
    ToClient,
}

/// One delivered message (after PSN filtering and reassembly).
#[derive(Debug, Clone)]
pub enum Delivered {
    /// A CM REQ (its private data).
    CmReq {
        local_qpn: u32,
        private_data: Vec<u8>,
    },
    /// A CM REP.
    CmRep {
        local_qpn: u32,
        private_data: Vec<u8>,
    },
    /// A SEND (any flavour).
    Send {
        payload: Vec<u8>,
        imm: Option<u32>,
        invalidate: Option<u32>,
    },
    /// An RDMA WRITE (with RETH of the first packet).
    Write {
        va: u64,
        rkey: u32,
        len: u32,
        data: Vec<u8>,
        imm: Option<u32>,
    },
}

/// A delivered message with its context.
#[derive(Debug, Clone)]
pub struct Event {
    /// 1-based frame number of the packet that completed the message.
    pub frame: usize,
    /// Direction.
    pub dir: Dir,
    /// The server address (the path).
    pub server: Ipv4Addr,
    /// Destination QPN.
    pub dest_qpn: u32,
    /// What was delivered.
    pub what: Delivered,
}

#[derive(Default)]
struct Flow {
    next_psn: Option<u32>,
    partial: Option<Delivered>,
}

/// Walks one capture and returns every delivered message.
pub fn deliver(name: &str) -> Vec<Event> {
    let path = vectors_dir().join(format!("{name}.pcap"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = Reader::new(&bytes).expect("a pcap file");
    let mut flows: HashMap<(Ipv4Addr, Ipv4Addr, u32), Flow> = HashMap::new();
    let mut events = Vec::new();
    for (index, record) in reader.enumerate() {
        let frame_no = index + 1;
        let record = record.expect("well-formed pcap record");
        let Ok(frame) = parse_frame(record.data) else {
            continue; // ARP, ICMP
        };
        let src: Ipv4Addr = frame.ip.src_addr;
        let dst: Ipv4Addr = frame.ip.dst_addr;
        // The servers are x.x.x.1, the clients x.x.x.2.
        let (dir, server) = if dst.octets()[3] == 1 {
            (Dir::ToServer, dst)
        } else {
            (Dir::ToClient, src)
        };
        let opcode = frame.bth.opcode;
        let qpn = frame.bth.dest_qp.value();
        let event = |what| Event {
            frame: frame_no,
            dir,
            server,
            dest_qpn: qpn,
            what,
        };
        if opcode == Opcode::UdSendOnly {
            let mad = cm::Repr::parse(frame.payload).expect("a CM MAD");
            match mad.message {
                CmMessage::Req(req) => events.push(event(Delivered::CmReq {
                    local_qpn: req.local_qpn.value(),
                    private_data: req.private_data.to_vec(),
                })),
                CmMessage::Rep(rep) => events.push(event(Delivered::CmRep {
                    local_qpn: rep.local_qpn.value(),
                    private_data: rep.private_data.to_vec(),
                })),
                _ => {}
            }
            continue;
        }
        if matches!(
            opcode,
            Opcode::RcAcknowledge
                | Opcode::RcRdmaReadResponseFirst
                | Opcode::RcRdmaReadResponseMiddle
                | Opcode::RcRdmaReadResponseLast
                | Opcode::RcRdmaReadResponseOnly
        ) {
            continue; // not in the sender's request PSN space
        }
        let flow = flows.entry((src, dst, qpn)).or_default();
        let psn = frame.bth.psn.value();
        if flow.next_psn.is_some_and(|next| next != psn) {
            continue; // duplicate, or after a loss: the responder drops it
        }
        let consumed = match (opcode, frame.ext.reth) {
            (Opcode::RcRdmaReadRequest, Some(reth)) => reth.dma_length.div_ceil(PMTU).max(1),
            _ => 1,
        };
        flow.next_psn = Some((psn + consumed) & 0x00ff_ffff);
        let imm = frame.ext.immdt.map(|immdt| immdt.immediate);
        let invalidate = frame.ext.ieth.map(|ieth| ieth.rkey.0);
        let payload = frame.payload;
        match opcode {
            Opcode::RcSendFirst => {
                flow.partial = Some(Delivered::Send {
                    payload: payload.to_vec(),
                    imm: None,
                    invalidate: None,
                })
            }
            Opcode::RcRdmaWriteFirst => {
                let reth = frame.ext.reth.expect("RETH");
                flow.partial = Some(Delivered::Write {
                    va: reth.virtual_address,
                    rkey: reth.rkey.0,
                    len: reth.dma_length,
                    data: payload.to_vec(),
                    imm: None,
                })
            }
            Opcode::RcSendMiddle | Opcode::RcRdmaWriteMiddle => match flow.partial.as_mut() {
                Some(Delivered::Send { payload: data, .. } | Delivered::Write { data, .. }) => {
                    data.extend_from_slice(payload)
                }
                _ => panic!("{name} frame {frame_no}: MIDDLE without FIRST"),
            },
            Opcode::RcSendLast
            | Opcode::RcSendLastWithImmediate
            | Opcode::RcSendLastWithInvalidate
            | Opcode::RcRdmaWriteLast
            | Opcode::RcRdmaWriteLastWithImmediate => {
                let mut done = flow
                    .partial
                    .take()
                    .unwrap_or_else(|| panic!("{name} frame {frame_no}: LAST without FIRST"));
                match &mut done {
                    Delivered::Send {
                        payload: data,
                        imm: i,
                        invalidate: inv,
                    } => {
                        data.extend_from_slice(payload);
                        *i = imm;
                        *inv = invalidate;
                    }
                    Delivered::Write { data, imm: i, .. } => {
                        data.extend_from_slice(payload);
                        *i = imm;
                    }
                    _ => unreachable!(),
                }
                events.push(event(done));
            }
            Opcode::RcSendOnly
            | Opcode::RcSendOnlyWithImmediate
            | Opcode::RcSendOnlyWithInvalidate => events.push(event(Delivered::Send {
                payload: payload.to_vec(),
                imm,
                invalidate,
            })),
            Opcode::RcRdmaWriteOnly | Opcode::RcRdmaWriteOnlyWithImmediate => {
                let reth = frame.ext.reth.expect("RETH");
                events.push(event(Delivered::Write {
                    va: reth.virtual_address,
                    rkey: reth.rkey.0,
                    len: reth.dma_length,
                    data: payload.to_vec(),
                    imm,
                }))
            }
            _ => {}
        }
    }
    events
}

/// What `emit` writes, as a vector.
fn emitted(emit: impl FnOnce(&mut [u8]) -> Result<usize, rtrs::wire::EmitError>) -> Vec<u8> {
    let mut buf = vec![0u8; 16_384];
    let len = emit(&mut buf).expect("emit");
    buf.truncate(len);
    buf
}

/// The RTRS view of one capture.
#[derive(Debug, Default)]
pub struct Session {
    /// Every CON_REQ, with its frame and server.
    pub conn_reqs: Vec<(usize, Ipv4Addr, ConnReq)>,
    /// Every CONN_RSP.
    pub conn_rsps: Vec<(usize, Ipv4Addr, ConnRsp)>,
    /// Session names of the INFO_REQs.
    pub info_reqs: Vec<(usize, Ipv4Addr, String)>,
    /// Descriptor lists of the INFO_RSPs.
    pub info_rsps: Vec<(usize, Ipv4Addr, Vec<BufferDesc>)>,
    /// Every IO request.
    pub requests: Vec<Request>,
    /// Every response (SEND WITH IMM carrying an RKEY_RSP).
    pub responses: Vec<Response>,
    /// Read data RDMA-written to the client: (frame, request index, data).
    pub read_data: Vec<(usize, usize, Vec<u8>)>,
    /// SEND_WITH_INV rkeys: (frame, request index).
    pub invalidates: Vec<(usize, usize)>,
    /// Heartbeats: (frame, direction, imm).
    pub heartbeats: Vec<(usize, Dir, Imm)>,
    /// CM REQs that do not carry RTRS (rping).
    pub foreign_reqs: usize,
}

/// One IO request, located in its chunk.
#[derive(Debug, Clone)]
pub struct Request {
    /// Frame of the last packet.
    pub frame: usize,
    /// Path.
    pub server: Ipv4Addr,
    /// Connection id (from the CM exchange).
    pub cid: u16,
    /// The immediate.
    pub imm: u32,
    /// Chunk id.
    pub buf_id: u32,
    /// Offset of the RTRS message in the chunk.
    pub offset: u32,
    /// The RTRS trailer.
    pub msg: IoMsg,
    /// The user (RNBD) header.
    pub user_header: Vec<u8>,
    /// `offset - usr_len`.
    pub data_len: usize,
    /// Length of the RDMA WRITE.
    pub write_len: u32,
    /// Chunk offset the RDMA WRITE started at.
    pub write_start: u64,
    /// Index of the response, once seen.
    pub response: Option<usize>,
}

/// One response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Frame.
    pub frame: usize,
    /// The immediate.
    pub imm: Imm,
    /// The RKEY_RSP payload.
    pub rkey_rsp: RkeyRsp,
    /// Index of the request it answers.
    pub request: usize,
}

struct PathState {
    cids: HashMap<u32, u16>,        // server QPN -> cid
    client_cids: HashMap<u32, u16>, // client QPN -> cid
    pending_cid: Option<(u16, u32)>,
    qd: u16,
    chunk_size: u32,
    chunks: Vec<BufferDesc>,
    memory: HashMap<u32, Vec<u8>>,
    outstanding: HashMap<u32, usize>,
}

/// Runs the RTRS model over the delivered messages of `name`; asserts every
/// invariant on the way (see the module docs).
pub fn decode(name: &str) -> Session {
    let mut session = Session::default();
    let mut paths: HashMap<Ipv4Addr, PathState> = HashMap::new();
    for event in deliver(name) {
        let frame = event.frame;
        let ctx = format!("{name} frame {frame}");
        let is_cm = matches!(
            event.what,
            Delivered::CmReq { .. } | Delivered::CmRep { .. }
        );
        if !is_cm && !paths.contains_key(&event.server) {
            continue; // rping traffic: no RTRS session on that address
        }
        match (event.dir, event.what) {
            (
                Dir::ToServer,
                Delivered::CmReq {
                    local_qpn,
                    private_data,
                },
            ) => {
                assert_eq!(private_data.len(), 92, "{ctx}");
                match ConnReq::parse(&private_data[36..]) {
                    Ok(req) => {
                        assert_eq!(
                            emitted(|b| req.emit(b)),
                            private_data[36..],
                            "{ctx}: byte-exact"
                        );
                        let path = paths.entry(event.server).or_insert_with(|| PathState {
                            cids: HashMap::new(),
                            client_cids: HashMap::new(),
                            pending_cid: None,
                            qd: 0,
                            chunk_size: 0,
                            chunks: Vec::new(),
                            memory: HashMap::new(),
                            outstanding: HashMap::new(),
                        });
                        path.pending_cid = Some((req.cid, local_qpn));
                        session.conn_reqs.push((frame, event.server, req));
                    }
                    Err(error) => {
                        assert_eq!(error, rtrs::wire::ParseError::BadMagic, "{ctx}");
                        session.foreign_reqs += 1;
                    }
                }
            }
            (
                Dir::ToClient,
                Delivered::CmRep {
                    local_qpn,
                    private_data,
                },
            ) => {
                let Some(path) = paths.get_mut(&event.server) else {
                    assert!(ConnRsp::parse(&private_data).is_err(), "{ctx}");
                    continue;
                };
                let rsp = ConnRsp::parse(&private_data).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(
                    emitted(|b| rsp.emit(b)),
                    private_data[..56],
                    "{ctx}: byte-exact"
                );
                assert!(private_data[56..].iter().all(|&b| b == 0), "{ctx}");
                let (cid, client_qpn) = path.pending_cid.take().expect("REP after REQ");
                path.cids.insert(local_qpn, cid);
                path.client_cids.insert(client_qpn, cid);
                path.qd = rsp.queue_depth;
                path.chunk_size = rsp.chunk_size().expect("chunk size");
                session.conn_rsps.push((frame, event.server, rsp));
            }
            (
                Dir::ToServer,
                Delivered::Send {
                    payload,
                    imm: None,
                    invalidate: None,
                },
            ) => {
                let Some(path) = paths.get(&event.server) else {
                    continue;
                };
                assert_eq!(
                    path.cids.get(&event.dest_qpn),
                    Some(&0),
                    "{ctx}: INFO_REQ on cid 0"
                );
                let req = InfoReq::parse(&payload).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(emitted(|b| req.emit(b)), payload, "{ctx}: byte-exact");
                session
                    .info_reqs
                    .push((frame, event.server, req.session_name.to_owned()));
            }
            (
                Dir::ToClient,
                Delivered::Send {
                    payload,
                    imm: None,
                    invalidate: None,
                },
            ) => {
                let Some(path) = paths.get_mut(&event.server) else {
                    continue;
                };
                let rsp = InfoRsp::parse(&payload).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(emitted(|b| rsp.emit(b)), payload, "{ctx}: byte-exact");
                rsp.check_layout(path.qd, path.chunk_size)
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                path.chunks = (0..u32::from(path.qd))
                    .map(|id| rsp.chunk(path.chunk_size, id).expect("chunk"))
                    .collect();
                session.info_rsps.push((
                    frame,
                    event.server,
                    rsp.descriptors.iter().map(|d| d.to_repr()).collect(),
                ));
            }
            (
                Dir::ToServer,
                Delivered::Write {
                    va,
                    rkey,
                    len,
                    data,
                    imm: Some(imm),
                },
            ) if len > 0 => {
                let path = paths.get_mut(&event.server).expect("a path");
                let cid = *path.cids.get(&event.dest_qpn).expect("a known QP");
                let Imm::IoReq { payload } = Imm::decode(imm) else {
                    panic!("{ctx}: not IO_REQ: {imm:#x}")
                };
                let layout = ImmLayout::for_queue_depth(path.qd).unwrap();
                let (buf_id, offset) = layout.split(payload);
                let chunk = path.chunks[buf_id as usize];
                assert_eq!(
                    rkey, chunk.rkey.0,
                    "{ctx}: the client uses the chunk's newest rkey"
                );
                assert_eq!(len as usize, data.len(), "{ctx}");
                let start = va.checked_sub(chunk.addr).expect("write inside the chunk");
                let memory = path
                    .memory
                    .entry(buf_id)
                    .or_insert_with(|| vec![0; path.chunk_size as usize]);
                memory[start as usize..start as usize + data.len()].copy_from_slice(&data);
                let request = IoRequest::parse(memory, offset as usize)
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                let trailer = match request.msg {
                    IoMsg::Write(write) => emitted(|b| write.emit(b)),
                    IoMsg::Read(read) => emitted(|b| read.emit(b)),
                };
                let at = offset as usize;
                assert_eq!(
                    trailer,
                    memory[at..at + trailer.len()],
                    "{ctx}: byte-exact trailer"
                );
                let index = session.requests.len();
                assert!(
                    path.outstanding.insert(buf_id, index).is_none(),
                    "{ctx}: chunk {buf_id} reused before its response"
                );
                session.requests.push(Request {
                    frame,
                    server: event.server,
                    cid,
                    imm,
                    buf_id,
                    offset,
                    msg: request.msg,
                    user_header: request.user_header.to_vec(),
                    data_len: request.data_len,
                    write_len: len,
                    write_start: start,
                    response: None,
                });
            }
            (
                dir,
                Delivered::Write {
                    len: 0,
                    data,
                    imm: Some(imm),
                    rkey,
                    va,
                },
            ) => {
                assert!(data.is_empty(), "{ctx}");
                let decoded = Imm::decode(imm);
                assert!(
                    matches!(decoded, Imm::HbMsg | Imm::HbAck),
                    "{ctx}: {decoded}"
                );
                assert_eq!((va, rkey), (0, 0), "{ctx}: heartbeats carry VA 0, rkey 0");
                let path = paths.get(&event.server).expect("a path");
                let cid = match dir {
                    Dir::ToServer => path.cids.get(&event.dest_qpn),
                    Dir::ToClient => path.client_cids.get(&event.dest_qpn),
                };
                assert_eq!(cid, Some(&0), "{ctx}: heartbeats go on cid 0");
                session.heartbeats.push((frame, dir, decoded));
            }
            (
                Dir::ToClient,
                Delivered::Write {
                    va,
                    rkey,
                    len,
                    data,
                    imm: None,
                },
            ) => {
                let path = paths.get(&event.server).expect("a path");
                let index = path
                    .outstanding
                    .values()
                    .copied()
                    .find(|&i| match session.requests[i].msg {
                        IoMsg::Read(read) => {
                            read.desc.is_some_and(|d| d.addr == va && d.rkey.0 == rkey)
                        }
                        IoMsg::Write(_) => false,
                    })
                    .unwrap_or_else(|| panic!("{ctx}: read data for no outstanding read"));
                let IoMsg::Read(read) = session.requests[index].msg else {
                    unreachable!()
                };
                assert_eq!(
                    len,
                    read.desc.unwrap().len,
                    "{ctx}: desc.len bytes come back"
                );
                assert_eq!(data.len(), len as usize, "{ctx}");
                session.read_data.push((frame, index, data));
            }
            (
                Dir::ToClient,
                Delivered::Send {
                    payload,
                    imm: None,
                    invalidate: Some(inv),
                },
            ) => {
                assert!(payload.is_empty(), "{ctx}");
                let path = paths.get(&event.server).expect("a path");
                let index = path
                    .outstanding
                    .values()
                    .copied()
                    .find(|&i| match session.requests[i].msg {
                        IoMsg::Read(read) => read.desc.is_some_and(|d| d.rkey.0 == inv),
                        IoMsg::Write(_) => false,
                    })
                    .unwrap_or_else(|| panic!("{ctx}: invalidate of no outstanding read"));
                session.invalidates.push((frame, index));
            }
            (
                Dir::ToClient,
                Delivered::Send {
                    payload,
                    imm: Some(imm),
                    invalidate: None,
                },
            ) => {
                let path = paths.get_mut(&event.server).expect("a path");
                let decoded = Imm::decode(imm);
                let rkey_rsp = RkeyRsp::parse(&payload).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(emitted(|b| rkey_rsp.emit(b)), payload, "{ctx}: byte-exact");
                let msg_id = match decoded {
                    Imm::IoRsp { msg_id, errno } | Imm::IoRspWithInvalidate { msg_id, errno } => {
                        assert_eq!(errno, 0, "{ctx}");
                        msg_id
                    }
                    other => panic!("{ctx}: {other}"),
                };
                assert_eq!(
                    u32::from(rkey_rsp.buf_id),
                    msg_id,
                    "{ctx}: buf_id == msg_id"
                );
                let request = path
                    .outstanding
                    .remove(&msg_id)
                    .unwrap_or_else(|| panic!("{ctx}: response to chunk {msg_id} without request"));
                let invalidated = session.invalidates.iter().any(|&(_, i)| i == request);
                assert_eq!(
                    matches!(decoded, Imm::IoRspWithInvalidate { .. }),
                    invalidated,
                    "{ctx}: type 2 iff a SEND_WITH_INV preceded"
                );
                path.chunks[msg_id as usize].rkey = rkey_rsp.rkey;
                session.requests[request].response = Some(session.responses.len());
                session.responses.push(Response {
                    frame,
                    imm: decoded,
                    rkey_rsp,
                    request,
                });
            }
            (dir, what) => {
                // rping traffic (no RTRS session on that address).
                assert!(
                    !paths.contains_key(&event.server),
                    "{ctx}: unexpected {dir:?} {what:?}"
                );
            }
        }
    }
    session
}
