//! CM-level cases (rtrs.md §2.4, §10): malformed CON_REQs, storms from one
//! and many addresses, the half-open limits and deadline, takeovers.

use rtrs::server::errno as rtrs_errno;
use verbs::ConnId;

use super::{case, con_req_with, is_down, newcomer, raw_session, still_serves, storm, uuids, Case};
use crate::clients::{con_req, Fabric};
use crate::healthy::HEALTHY;
use crate::outcome::{errno_name, refusal, tally};
use crate::wire::Wire;
use crate::Args;

/// CON_REQs of the one-address storm (a client HCA holds 16 connections).
const STORM: usize = 16;

/// A consumer-defined REJ with `errno`, in [`refusal`]'s words.
fn rej(errno: u16) -> String {
    format!("REJ consumer-defined -{}", errno_name(errno))
}

pub fn cases(args: &Args) -> Vec<Case> {
    let per = args.max_half_open_per_source;
    vec![
        case(
            "con_req_bad_magic",
            rej(rtrs_errno::ECONNRESET),
            |wire, _| malformed(wire, |b| b[2..4].copy_from_slice(&0xdeadu16.to_le_bytes())),
        ),
        case(
            "con_req_bad_version",
            rej(rtrs_errno::ECONNRESET),
            |wire, _| malformed(wire, |b| b[4..6].copy_from_slice(&0x0300u16.to_le_bytes())),
        ),
        case(
            "con_req_cid_beyond_cid_num",
            rej(rtrs_errno::ECONNRESET),
            |wire, _| malformed(wire, |b| b[6..8].copy_from_slice(&2u16.to_le_bytes())),
        ),
        case(
            "con_req_unknown_session_not_first",
            rej(rtrs_errno::ENXIO),
            // `first_conn` clear names a session that must exist.
            |wire, _| malformed(wire, |b| b[44] = 0),
        ),
        case(
            "too_many_connections",
            rej(rtrs_errno::ECONNRESET),
            // Refused at cid 0, on `cid_num` alone.
            |wire, args| {
                let r = wire.add_raw();
                let (path, session) = uuids(wire);
                let bytes = con_req(0, args.max_connections.saturating_add(1), path, session);
                refusal(&wire.raw_connect_held(r, &bytes))
            },
        ),
        case(
            "con_req_storm_one_address",
            format!(
                "{per} accepted, {} {}; a new session serves",
                STORM - usize::from(per),
                rej(rtrs_errno::ENOMEM)
            ),
            // New paths at once from one address: `max_half_open_per_source`
            // of them are half-open, the rest refused; others still get in.
            |wire, args| {
                let r = wire.add_raw();
                let requests: Vec<(usize, Vec<u8>)> = (0..STORM)
                    .map(|_| {
                        let (path, session) = uuids(wire);
                        (r, con_req(0, 2, path, session).to_vec())
                    })
                    .collect();
                let (_, words) = storm(wire, &requests);
                tally(&words) + "; " + &newcomer(wire, args, "after-storm")
            },
        ),
        case(
            "con_req_storm_many_addresses",
            format!(
                "max_half_open accepted, the rest {} (none evicted while young); a new session serves",
                rej(rtrs_errno::ENOMEM)
            ),
            // `max_half_open_per_source` new paths from each of twice as many
            // addresses as `max_half_open` allows in all, at once: the table
            // fills, the rest are refused (the client retries), and no young
            // half-open path is evicted: a rack connecting at once must not
            // evict itself.
            |wire, args| {
                let per = usize::from(args.max_half_open_per_source);
                let total = usize::from(args.max_half_open);
                let sources = 2 * total.div_ceil(per);
                let nodes: Vec<usize> = (0..sources).map(|_| wire.add_raw()).collect();
                let mut requests = Vec::new();
                for _ in 0..per {
                    for &r in &nodes {
                        let (path, session) = uuids(wire);
                        requests.push((r, con_req(0, 2, path, session).to_vec()));
                    }
                }
                let (accepted, words) = storm(wire, &requests);
                wire.run_for(300_000_000);
                let down = accepted.iter().filter(|&&(r, c)| is_down(wire, r, c)).count();
                let refused = words.iter().filter(|w| **w == rej(rtrs_errno::ENOMEM)).count();
                let outcome = if accepted.len() == total.min(requests.len())
                    && refused == requests.len() - accepted.len()
                    && down == 0
                {
                    format!(
                        "max_half_open accepted, the rest {} (none evicted while young)",
                        rej(rtrs_errno::ENOMEM)
                    )
                } else {
                    format!(
                        "{}; {} accepted, {down} of them closed (expected {total}, 0)",
                        tally(&words),
                        accepted.len()
                    )
                };
                // A client refused meanwhile retries; by the time the
                // oldest storm path has stalled for a quarter of the setup
                // deadline, it makes room.
                let start = wire.now();
                let stalled = args.setup_timeout_ms * 1_000_000 / 4;
                wire.run_until("the storm's half-open paths stalled", |w| {
                    w.now() >= start + stalled + 100_000_000
                });
                outcome + "; " + &newcomer(wire, args, "after-storms")
            },
        ),
        case(
            "half_open_per_source",
            format!("{per} half-open held, the next {}", rej(rtrs_errno::ENOMEM)),
            |wire, args| {
                let r = wire.add_raw();
                let per = args.max_half_open_per_source;
                let mut held = 0;
                for _ in 0..per {
                    let (path, session) = uuids(wire);
                    if wire
                        .raw_connect_held(r, &con_req(0, 2, path, session))
                        .is_ok()
                    {
                        held += 1;
                    }
                }
                let (path, session) = uuids(wire);
                let next = refusal(&wire.raw_connect_held(r, &con_req(0, 2, path, session)));
                format!("{held} half-open held, the next {next}")
            },
        ),
        case(
            "half_open_eviction",
            format!(
                "max_half_open held, the next {} while all are young; accepted once the oldest stalled, only it evicted",
                rej(rtrs_errno::ENOMEM)
            ),
            |wire, args| {
                let per = usize::from(args.max_half_open_per_source);
                let total = usize::from(args.max_half_open);
                let mut held: Vec<(usize, ConnId)> = Vec::new();
                let mut r = wire.add_raw();
                for n in 0..total {
                    if n > 0 && n % per == 0 {
                        r = wire.add_raw();
                    }
                    let (path, session) = uuids(wire);
                    match wire.raw_connect_held(r, &con_req(0, 2, path, session)) {
                        Ok((conn, _)) => held.push((r, conn)),
                        Err(e) => return format!("half-open path {n} refused: {e:?}"),
                    }
                }
                let late = wire.add_raw();
                let (path, session) = uuids(wire);
                let young = refusal(&wire.raw_connect_held(late, &con_req(0, 2, path, session)));
                // A quarter of the setup deadline after the oldest: stalled.
                let first_at = wire.now();
                let stalled = args.setup_timeout_ms * 1_000_000 / 4;
                wire.run_until("the oldest half-open path stalled", |w| {
                    w.now() >= first_at + stalled + 100_000_000
                });
                let (path, session) = uuids(wire);
                let next = refusal(&wire.raw_connect_held(late, &con_req(0, 2, path, session)));
                let (first_r, first) = held[0];
                wire.run_until("the oldest half-open path evicted", |w| {
                    is_down(w, first_r, first)
                });
                wire.run_for(300_000_000);
                let closed = held.iter().filter(|&&(r, c)| is_down(wire, r, c)).count();
                if young == rej(rtrs_errno::ENOMEM) && next == "accepted" && closed == 1 {
                    format!(
                        "max_half_open held, the next {} while all are young; accepted once the oldest stalled, only it evicted",
                        rej(rtrs_errno::ENOMEM)
                    )
                } else {
                    format!(
                        "{} held, the next {young} while young, then {next}, {closed} closed",
                        held.len()
                    )
                }
            },
        ),
        case(
            "half_open_setup_deadline",
            "closed at the setup deadline",
            // cid 0 of 2, never cid 1 nor INFO_REQ: the path holds its
            // connection until `setup_timeout` and not much longer.
            |wire, args| {
                let r = wire.add_raw();
                let (path, session) = uuids(wire);
                let start = wire.now();
                let (conn, _) = match wire.raw_connect_held(r, &con_req(0, 2, path, session)) {
                    Ok(accepted) => accepted,
                    Err(e) => return format!("cid 0 refused: {e:?}"),
                };
                let deadline = args.setup_timeout_ms * 1_000_000;
                let saved = wire.wait_ns;
                wire.wait_ns = saved.max(deadline + 10_000_000_000);
                wire.run_until("the half-open path closed", |w| is_down(w, r, conn));
                wire.wait_ns = saved;
                let took = wire.now() - start;
                eprintln!(
                    "hostile_probe: half-open path closed after {} ms",
                    took / 1_000_000
                );
                if took + 100_000_000 >= deadline && took <= deadline + 3_000_000_000 {
                    "closed at the setup deadline".into()
                } else {
                    format!(
                        "closed after {} ms (deadline {} ms)",
                        took / 1_000_000,
                        args.setup_timeout_ms
                    )
                }
            },
        ),
        case(
            "half_open_replaced_by_its_source",
            "accepted, the old half-open path closed",
            // A reconnect (`recon_cnt` + 1) of a half-open path from its own
            // address replaces it.
            |wire, _| {
                let r = wire.add_raw();
                let (path, session) = uuids(wire);
                let (old, _) =
                    match wire.raw_connect_held(r, &con_req_with(0, 2, 1, path, session, true)) {
                        Ok(accepted) => accepted,
                        Err(e) => return format!("cid 0 refused: {e:?}"),
                    };
                let next =
                    refusal(&wire.raw_connect_held(r, &con_req_with(0, 2, 2, path, session, true)));
                wire.run_until("the old half-open path closed", |w| is_down(w, r, old));
                format!("{next}, the old half-open path closed")
            },
        ),
        case(
            "takeover_from_another_address",
            format!("{}; serves (protocol 2)", rej(rtrs_errno::ECONNRESET)),
            // A live path's uuids with `recon_cnt` + 1 from another address.
            |wire, args| {
                let victim = raw_session(wire, args, "victim");
                let (path, session) = raw_uuids(wire, victim);
                let thief = wire.add_raw();
                let outcome = refusal(
                    &wire.raw_connect_held(thief, &con_req_with(0, 2, 2, path, session, true)),
                );
                format!("{outcome}; {}", still_serves(wire, victim, 0))
            },
        ),
        case(
            "takeover_from_same_address_alive",
            format!("{}; serves (protocol 2)", rej(rtrs_errno::ECONNRESET)),
            // The path's own address, but the path is alive (it just
            // answered): no reconnect can replace it.
            |wire, args| {
                let r = raw_session(wire, args, "alive");
                let (path, session) = raw_uuids(wire, r);
                let first = still_serves(wire, r, 1);
                let outcome =
                    refusal(&wire.raw_connect_held(r, &con_req_with(0, 2, 2, path, session, true)));
                let after = still_serves(wire, r, 2);
                if first == after {
                    format!("{outcome}; {after}")
                } else {
                    format!("{outcome}; before {first}, after {after}")
                }
            },
        ),
        case(
            "takeover_of_the_healthy_path",
            format!(
                "{}, {}",
                rej(rtrs_errno::ECONNRESET),
                rej(rtrs_errno::ECONNRESET)
            ),
            // The healthy client's uuids (they travel in clear) with a far
            // newer `recon_cnt`, and with the same one.
            |wire, _| {
                let client = &wire.clients[HEALTHY].client;
                let session = client.session_uuid().expect("healthy session uuid");
                let path = client.path_uuid(0).expect("healthy path uuid");
                let thief = wire.add_raw();
                let newer = refusal(
                    &wire.raw_connect_held(thief, &con_req_with(0, 2, 1000, path, session, true)),
                );
                let same = refusal(
                    &wire.raw_connect_held(thief, &con_req_with(0, 2, 1, path, session, true)),
                );
                format!("{newer}, {same}")
            },
        ),
    ]
}

/// A CON_REQ (cid 0 of 2, fresh uuids) patched by `patch`, from a new raw
/// node.
fn malformed(wire: &mut Wire, patch: impl FnOnce(&mut [u8])) -> String {
    let r = wire.add_raw();
    let (path, session) = uuids(wire);
    let mut bytes = con_req(0, 2, path, session);
    patch(&mut bytes);
    refusal(&wire.raw_connect_held(r, &bytes))
}

/// The uuids raw node `r`'s established session used (path, session).
fn raw_uuids(wire: &Wire, r: usize) -> (rtrs::wire::Uuid, rtrs::wire::Uuid) {
    crate::clients::raw_uuids(&wire.raws[r])
}
