//! CM messages copied from one host and sent from another: the copy must
//! not touch the first host's connections (`docs/protocol/ib-cm.md` §4.8,
//! "Brick adds the sender's address to every match").
//!
//! A client's REQ carries its CA GUID (from its MAC, so known on the LAN)
//! and its QPN in the clear. Linux's CM takes a REQ with a live
//! connection's (CA GUID, QPN) for proof that the client restarted: it
//! rejects the REQ and tears the live connection down. A host that saw one
//! REQ (or guessed a QPN) could so cut any client off at will.

mod common;

use common::{with_world, Fabric, World, SECOND};
use rnbd::wire::AccessMode;
use rtrs::client::Event;
use std::cell::RefCell;
use std::rc::Rc;

const MANIFEST: &str = r#"
[target]
name = "brick-cm-forgery"

[limits]
queue_depth = 8
chunk_size = "36KiB"
max_sessions = 2
max_paths_per_session = 1
max_connections_per_path = 2

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "*"
volumes = ["vol0"]
mode = "rw"
"#;

/// Offsets in a RoCEv2 UD frame: Ethernet 14, IPv4 20, UDP 8, BTH 12, DETH 8,
/// then the MAD (its attribute ID at 16, the CM message at 24).
const IPV4: usize = 14;
const UDP_DST_PORT: usize = 36;
const BTH_DEST_QP: usize = 47;
const MAD: usize = 62;
const REQ_ATTRIBUTE: [u8; 2] = [0x00, 0x10];

/// The forger, on the same LAN.
const FORGER_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x09];
const FORGER_IP: [u8; 4] = [10, 77, 0, 9];

fn is_cm_req(frame: &[u8]) -> bool {
    frame.len() > MAD + 28
        && frame[UDP_DST_PORT..UDP_DST_PORT + 2] == 4791u16.to_be_bytes()
        && frame[BTH_DEST_QP..BTH_DEST_QP + 3] == [0, 0, 1]
        && frame[MAD + 16..MAD + 18] == REQ_ATTRIBUTE
}

/// `req` sent from the forger's address, with its Local Comm ID replaced
/// by `comm_id` (`None`: kept), checksums made right again.
fn forged(req: &[u8], comm_id: Option<u32>) -> Vec<u8> {
    let mut frame = req.to_vec();
    frame[6..12].copy_from_slice(&FORGER_MAC);
    if let Some(id) = comm_id {
        frame[MAD + 24..MAD + 28].copy_from_slice(&id.to_be_bytes());
    }
    let mut ip = roce::wire::ipv4::Packet::new_unchecked(&mut frame[IPV4..IPV4 + 20]);
    ip.set_src_addr(roce::wire::Ipv4Address::from(FORGER_IP));
    ip.fill_checksum();
    roce::wire::fill_icrc(&mut frame).expect("a RoCEv2 frame");
    frame
}

fn path_went_down(world: &World<'_>, client: usize) -> bool {
    world.clients[client].events.iter().any(|e| {
        matches!(
            e,
            Event::PathDown { .. } | Event::SessionDown | Event::PathClosed { .. }
        )
    })
}

/// REQs that copy a live client's CA GUID and QPN, from another address:
/// as a "restarted client" (a new comm ID) and as a plain copy (its comm
/// ID). The client's connections stay up and its verified IO goes on; the
/// copies are refused (their CON_REQ names the client's live path) and the
/// engine serves the client alone afterwards.
#[test]
fn a_req_copied_from_a_live_client_does_not_cut_it_off() {
    with_world(MANIFEST, |w| {
        let reqs = Rc::new(RefCell::new(Vec::<Vec<u8>>::new()));
        let seen = Rc::clone(&reqs);
        w.tap = Some(Box::new(move |frame| {
            if is_cm_req(frame) {
                seen.borrow_mut().push(frame.to_vec());
            }
            Vec::new()
        }));
        let c = w.add_client(2, 8, 1);
        w.connect(c, "s-victim", 2).expect("the client connects");
        assert_eq!(w.sess_info(c, 1), 2);
        let device = w.open(c, 2, "vol0", AccessMode::ReadWrite).unwrap();
        w.start_workload(c, device, 0, 4, &[4096, 8192]);
        w.workload_progress(c, 16);
        let reqs = reqs.borrow().clone();
        assert_eq!(reqs.len(), 2, "one REQ per connection");
        w.clients[c].events.clear();

        for (i, req) in reqs.iter().enumerate() {
            let now = w.now;
            let comm_id = 0x5eed_0000 + i as u32;
            w.engine.receive(0, now, &forged(req, Some(comm_id)));
            w.engine.receive(0, now, &forged(req, None));
            w.workload_progress(c, 8);
        }
        // Past the setup deadline of anything the copies started.
        for _ in 0..40 {
            w.advance(SECOND);
            w.workload_progress(c, 2);
        }
        assert!(
            !path_went_down(w, c),
            "a forged REQ cut the client off: {:?}",
            w.clients[c].events
        );
        w.workload_progress(c, 32);
        w.workload(c).assert_clean(80);
        assert_eq!(w.engine.session_count(), 1);
        let usage = w.engine.rtrs(0).unwrap().usage();
        assert_eq!(
            (usage.paths, usage.connections),
            (1, 2),
            "the client's path alone: {usage:?}"
        );
    });
}
