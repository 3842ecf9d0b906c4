//! The cases: each a name, the answer it expects, and a run that reports
//! what it got in the same words.

mod connect;
mod io;
mod rnbd;
mod session;

use rtrs::wire::{ConnReq, Uuid};
use verbs::{CmEvent, ConnId, ConnParams, Verbs};

use crate::clients::{Fabric, RawOutcome, RawRefusal};
use crate::outcome::{raw_outcome, refusal};
use crate::wire::Wire;
use crate::Args;

/// A case's run: what it got, in the words of its expectation.
pub type Run = fn(&mut Wire, &Args) -> String;

/// A case: its name, what it expects, and the run that reports what it got.
pub struct Case {
    pub name: &'static str,
    pub expected: String,
    pub run: Run,
}

pub fn case(name: &'static str, expected: impl Into<String>, run: Run) -> Case {
    Case {
        name,
        expected: expected.into(),
        run,
    }
}

/// Every case, in the order they run (the ones that leave the target
/// busiest for longest last).
pub fn all(args: &Args) -> Vec<Case> {
    let mut cases = connect::cases(args);
    cases.extend(session::cases(args));
    cases.extend(io::cases(args));
    cases.extend(rnbd::cases(args));
    cases.extend(session::late_cases(args));
    cases
}

/// Fresh path and session uuids for a raw CON_REQ.
pub fn uuids(wire: &mut Wire) -> (Uuid, Uuid) {
    let mut path = [0u8; 16];
    let mut session = [0u8; 16];
    for byte in path.iter_mut().chain(session.iter_mut()) {
        wire.seed = wire
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        *byte = (wire.seed >> 56) as u8;
    }
    (Uuid(path), Uuid(session))
}

/// A CON_REQ with every field chosen.
pub fn con_req_with(
    cid: u16,
    cid_num: u16,
    recon_cnt: u16,
    path: Uuid,
    session: Uuid,
    first_conn: bool,
) -> [u8; ConnReq::LEN] {
    let mut buf = [0u8; ConnReq::LEN];
    ConnReq {
        version: rtrs::wire::VERSION,
        cid,
        cid_num,
        recon_cnt,
        path_uuid: path,
        session_uuid: session,
        first_conn,
    }
    .emit(&mut buf)
    .expect("a CON_REQ fits its buffer");
    buf
}

/// Sends every `(raw node, CON_REQ)` at once (no wait between them), then
/// waits for each outcome: the connections accepted and each outcome in
/// words ([`refusal`]).
pub fn storm(
    wire: &mut Wire,
    requests: &[(usize, Vec<u8>)],
) -> (Vec<(usize, ConnId)>, Vec<String>) {
    let server = wire.server;
    let conns: Vec<(usize, ConnId)> = requests
        .iter()
        .map(|(r, bytes)| {
            let conn = wire.raws[*r]
                .hca
                .connect(server, &ConnParams::new(bytes, 128, 1024))
                .expect("connect");
            (*r, conn)
        })
        .collect();
    let outcome_of = |wire: &Wire, (r, conn): (usize, ConnId)| {
        wire.raws[r].cm_events.iter().find_map(|e| match e {
            CmEvent::Established { conn: c, .. } if *c == conn => Some(Ok(())),
            CmEvent::Rejected {
                conn: c,
                reason,
                private_data,
            } if *c == conn => Some(Err(RawRefusal::Rejected(
                *reason,
                rtrs::wire::ConnRsp::parse(private_data.as_slice()).ok(),
            ))),
            CmEvent::Unreachable { conn: c } if *c == conn => Some(Err(RawRefusal::Unreachable)),
            _ => None,
        })
    };
    wire.run_until("the storm's CON_REQs answered", |w| {
        conns.iter().all(|&c| outcome_of(w, c).is_some())
    });
    let mut accepted = Vec::new();
    let mut words = Vec::new();
    for &(r, conn) in &conns {
        let outcome = outcome_of(wire, (r, conn)).expect("answered");
        words.push(match outcome {
            Ok(()) => {
                accepted.push((r, conn));
                wire.held.push((r, conn));
                "accepted".to_string()
            }
            Err(refused) => {
                let _ = wire.raws[r].hca.destroy(conn);
                refusal(&Err(refused))
            }
        });
    }
    (accepted, words)
}

/// Send completions raw node `r` has (they free its send queue).
pub fn sends_done(wire: &Wire, r: usize) -> usize {
    wire.raws[r]
        .completions
        .iter()
        .filter(|wc| wc.wr_id.0 >> 56 == 3 && !wc.opcode.is_receive())
        .count()
}

/// Waits until raw node `r` has `count` send completions.
pub fn await_sends(wire: &mut Wire, r: usize, count: usize) {
    wire.run_until("sends acknowledged", |w| sends_done(w, r) >= count);
}

/// Whether raw node `r`'s connection `conn` is disconnected.
pub fn is_down(wire: &Wire, r: usize, conn: ConnId) -> bool {
    wire.raws[r]
        .cm_events
        .iter()
        .any(|e| matches!(e, CmEvent::Disconnected { conn: c } if *c == conn))
}

/// A raw node with an established session `PREFIX-NAME` of two connections.
pub fn raw_session(wire: &mut Wire, args: &Args, name: &str) -> usize {
    let r = wire.add_raw();
    wire.raw_establish(r, &format!("{}-{name}", args.session_prefix), 2);
    r
}

/// The raw session's queue depth and chunk size.
pub fn geometry(wire: &Wire, r: usize) -> (u16, u32) {
    let session = wire.raw_session(r);
    (session.queue_depth, session.chunk_size)
}

/// After a request the path must survive: a valid SESS_INFO on `chunk`.
pub fn still_serves(wire: &mut Wire, r: usize, chunk: u16) -> String {
    match wire.raw_sess_info(r, chunk) {
        (RawOutcome::Answered(0), Some(version)) => format!("serves (protocol {version})"),
        (outcome, _) => format!("SESS_INFO {}", raw_outcome(outcome)),
    }
}

/// A Brick-client node with session `PREFIX-NAME` up.
pub fn client_session(wire: &mut Wire, args: &Args, name: &str) -> usize {
    let c = wire.add_client();
    let name = format!("{}-{name}", args.session_prefix);
    if let Err(error) = wire.connect(c, &name, 2) {
        panic!("session {name}: {error:?}");
    }
    c
}

/// A fresh legitimate session right after an attack: `"a new session
/// serves"` if it connects and answers SESS_INFO, else what happened.
pub fn newcomer(wire: &mut Wire, args: &Args, name: &str) -> String {
    let c = wire.add_client();
    let name = format!("{}-{name}", args.session_prefix);
    let outcome = match wire.connect(c, &name, 2) {
        Ok(()) => match wire.sess_info(c, 1) {
            2 => "a new session serves".to_string(),
            version => format!("a new session answers protocol {version}"),
        },
        Err(error) => format!("a new session: {error:?}"),
    };
    wire.close_session(c);
    outcome
}
