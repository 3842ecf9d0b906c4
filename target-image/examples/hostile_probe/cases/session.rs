//! Session-level cases (rtrs.md §3, rnbd.md §8.1): the session limit,
//! refused and squatted names, access rules on a second path, sessions
//! dropped without a close.

use rnbd::wire::AccessMode;
use rtrs::client::PathError;

use super::{case, client_session, newcomer, still_serves, uuids, Case};
use crate::clients::{info_req, pattern, raw_uuids, Fabric};
use crate::healthy::HEALTHY;
use crate::outcome::{connect_outcome, errno_name};
use crate::wire::Wire;
use crate::Args;

/// Sessions opened and dropped one after the other.
const DROPPED: usize = 6;
/// How long a vanished client's session may hold on (heartbeats: 5 × 5 s,
/// plus the close).
const VANISHED_NS: u64 = 60_000_000_000;

pub fn cases(_args: &Args) -> Vec<Case> {
    vec![
        case(
            "too_many_sessions",
            "sessions admitted, then rejected -ENOMEM; the admitted ones serve",
            too_many_sessions,
        ),
        case(
            "session_name_refused",
            "path closed at INFO_REQ",
            // No access rule admits the name: the target closes the path
            // before it registers a chunk for it (no INFO_RSP).
            |wire, args| {
                let c = wire.add_client();
                let outcome = match wire.connect(c, &args.refused_session, 2) {
                    Err(PathError::Disconnected) => "path closed at INFO_REQ".to_owned(),
                    Err(error) => format!("session {}: {error:?}", args.refused_session),
                    Ok(()) => format!("session {} admitted", args.refused_session),
                };
                wire.close_session(c);
                outcome
            },
        ),
        case(
            "refused_name_squatting",
            "4 paths closed at INFO_REQ; a new session serves",
            // Paths from four addresses insist on the refused name: none
            // holds anything, a legitimate session connects right after.
            |wire, args| {
                let info = info_req(args.refused_session.as_bytes());
                let closed = (0..4)
                    .filter(|_| {
                        let r = wire.add_raw();
                        wire.raw_try_establish(r, &info, 2, 2).is_err()
                    })
                    .count();
                format!("{closed} paths closed at INFO_REQ; {}", newcomer(wire, args, "after-squat"))
            },
        ),
        case(
            "live_name_squatting",
            "path closed at INFO_REQ; the healthy session keeps its name",
            // A new session naming the healthy client's session.
            |wire, args| {
                let r = wire.add_raw();
                let name = format!("{}-healthy", args.session_prefix);
                let outcome = match wire.raw_try_establish(r, &info_req(name.as_bytes()), 2, 2) {
                    Err(()) => "path closed at INFO_REQ".to_string(),
                    Ok(()) => "admitted".to_string(),
                };
                let healthy = if wire.clients[HEALTHY].client.is_up() {
                    "the healthy session keeps its name"
                } else {
                    "the healthy session is down"
                };
                format!("{outcome}; {healthy}")
            },
        ),
        case(
            "bad_info_req_names",
            "5 paths closed at INFO_REQ",
            // A '/', a '.', an empty name, 255 bytes without a NUL, and an
            // INFO_REQ before the path's second connection is up.
            |wire, args| {
                let prefix = &args.session_prefix;
                let infos = [
                    (info_req(format!("{prefix}/evil").as_bytes()), 2),
                    (info_req(format!("{prefix}.evil").as_bytes()), 2),
                    (info_req(b""), 2),
                    (info_req(&[b'p'; 255]), 2),
                    (info_req(format!("{prefix}-early").as_bytes()), 1),
                ];
                let closed = infos
                    .iter()
                    .filter(|(info, connect)| {
                        let r = wire.add_raw();
                        wire.raw_try_establish(r, info, 2, *connect).is_err()
                    })
                    .count();
                format!("{closed} paths closed at INFO_REQ")
            },
        ),
        case(
            "second_path_refused_by_source",
            "second path closed at INFO_REQ; serves (protocol 2)",
            // A session whose rule admits `--local`'s /25 only; a second
            // path of it from `--outsider` is asked about on its own.
            |wire, args| {
                let first = wire.add_raw();
                let name = format!("{}-second", args.pinned_prefix);
                let info = info_req(name.as_bytes());
                if wire.raw_try_establish(first, &info, 2, 2).is_err() {
                    return format!("the first path of {name} closed at INFO_REQ");
                }
                let (_, session) = raw_uuids(&wire.raws[first]);
                let offset = wire.offset_of(args.outsider.octets());
                let second = wire.add_raw_at(offset);
                let (path, _) = uuids(wire);
                let outcome = match wire.raw_try_establish_as(second, &info, 2, 2, path, session) {
                    Err(()) => "second path closed at INFO_REQ",
                    Ok(()) => "second path admitted",
                };
                format!("{outcome}; {}", still_serves(wire, first, 0))
            },
        ),
        case(
            "join_healthy_session_wrong_name",
            "path closed at INFO_REQ; the healthy session keeps its paths",
            // The healthy session's uuid (it travels in clear), a path uuid
            // of its own, and another name.
            |wire, args| {
                let session = wire.clients[HEALTHY]
                    .client
                    .session_uuid()
                    .expect("healthy session uuid");
                let r = wire.add_raw();
                let (path, _) = uuids(wire);
                let name = format!("{}-intruder", args.session_prefix);
                let outcome = match wire.raw_try_establish_as(r, &info_req(name.as_bytes()), 2, 2, path, session) {
                    Err(()) => "path closed at INFO_REQ",
                    Ok(()) => "path admitted",
                };
                let healthy = if wire.clients[HEALTHY].client.is_up() {
                    "the healthy session keeps its paths"
                } else {
                    "the healthy session is down"
                };
                format!("{outcome}; {healthy}")
            },
        ),
        case(
            "sessions_dropped_without_close",
            format!("{DROPPED} sessions dropped with the volume open; a new session opens it read-write and reads the last data"),
            // Each session opens the read-write volume, writes, and goes
            // (its connections disconnected) without an RNBD CLOSE: each
            // must release its writer slot.
            |wire, args| {
                let data = pattern(77, 8192);
                for n in 0..DROPPED {
                    let c = client_session(wire, args, &format!("dropped{n}"));
                    let device = match wire.open(c, 1, &args.rw_volume, AccessMode::ReadWrite) {
                        Ok(device) => device,
                        Err(errno) => return format!("session {n}: OPEN {}", errno_name(errno)),
                    };
                    let errno = wire.write(c, 2, &device, 8192, &data);
                    if errno != 0 {
                        return format!("session {n}: WRITE {}", errno_name(errno));
                    }
                    wire.close_session(c);
                }
                let c = client_session(wire, args, "after-drops");
                let device = match wire.open(c, 1, &args.rw_volume, AccessMode::ReadWrite) {
                    Ok(device) => device,
                    Err(errno) => return format!("the new session: OPEN {}", errno_name(errno)),
                };
                match wire.read(c, 2, &device, 8192, 8192) {
                    (0, back) if back == data => format!("{DROPPED} sessions dropped with the volume open; a new session opens it read-write and reads the last data"),
                    (0, _) => "the new session read other data".into(),
                    (errno, _) => format!("the new session: READ {}", errno_name(errno)),
                }
            },
        ),
    ]
}

/// Cases that leave the target holding something for long: last.
pub fn late_cases(_args: &Args) -> Vec<Case> {
    vec![case(
        "session_vanished",
        "the vanished session's writer slot freed; a new session opens the volume read-write",
        // A client opens the read-write volume and vanishes (no DREQ, no
        // heartbeats): the target must notice and release it.
        |wire, args| {
            let c = client_session(wire, args, "vanishing");
            if let Err(errno) = wire.open(c, 1, &args.rw_volume, AccessMode::ReadWrite) {
                return format!("OPEN {}", errno_name(errno));
            }
            wire.clients[c].alive = false;
            let start = wire.now();
            let mut attempt = 0;
            loop {
                attempt += 1;
                let n = wire.add_client();
                let name = format!("{}-after-vanish{attempt}", args.session_prefix);
                let outcome = match wire.connect(n, &name, 2) {
                    Ok(()) => wire
                        .open(n, 1, &args.rw_volume, AccessMode::ReadWrite)
                        .map(|_| ()),
                    Err(error) => {
                        eprintln!(
                            "hostile_probe: after the vanish: {}",
                            connect_outcome(Err(error))
                        );
                        Err(0)
                    }
                };
                wire.close_session(n);
                wire.clients[n].alive = false;
                if outcome.is_ok() {
                    eprintln!(
                        "hostile_probe: the vanished session was released after {} ms ({attempt} attempts)",
                        (wire.now() - start) / 1_000_000
                    );
                    return "the vanished session's writer slot freed; a new session opens the volume read-write".into();
                }
                if wire.now() - start > VANISHED_NS {
                    return format!("still held after {} s", VANISHED_NS / 1_000_000_000);
                }
                wire.run_for(2_000_000_000);
            }
        },
    )]
}

fn too_many_sessions(wire: &mut Wire, args: &Args) -> String {
    let mut admitted = Vec::new();
    let mut refused = None;
    for n in 0..=args.max_sessions {
        let c = wire.add_client();
        let name = format!("{}-session{n}", args.session_prefix);
        match wire.connect(c, &name, 2) {
            Ok(()) => admitted.push(c),
            Err(error) => {
                wire.close_session(c);
                refused = Some(error);
                break;
            }
        }
    }
    let serving = admitted
        .iter()
        .enumerate()
        .all(|(tag, &c)| wire.sess_info(c, tag as u64 + 1) == 2);
    for &c in &admitted {
        wire.close_session(c);
    }
    eprintln!(
        "hostile_probe: {} sessions admitted before the refusal",
        admitted.len()
    );
    match refused {
        Some(error) if !admitted.is_empty() && serving => format!(
            "sessions admitted, then {}; the admitted ones serve",
            connect_outcome(Err(error))
        ),
        Some(error) => format!(
            "{} admitted (serving: {serving}), then {}",
            admitted.len(),
            connect_outcome(Err(error))
        ),
        None => format!("{} sessions admitted, none refused", admitted.len()),
    }
}
