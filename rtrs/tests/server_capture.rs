//! Replays the CM REQs of a real Linux session into the server and compares
//! its CONN_RSPs with the REPs the Linux server sent (rtrs.md §2.4-2.5).

mod common;
mod server_support;

use common::{deliver, Delivered, Dir};
use rtrs::server::ServerConfig;
use rtrs::wire::ConnRsp;
use server_support::*;

#[test]
fn conn_rsp_matches_linux_for_the_same_configuration() {
    assert_eq!(replay("rnbd-linux-srv-linux-clt"), 2);
    assert_eq!(replay("rnbd-2cpu"), 3);
}

/// Replays every CON_REQ of capture `name`; returns how many.
fn replay(name: &str) -> usize {
    let mut config = ServerConfig::linux_default();
    config.max_sessions = 1;
    config.max_paths_per_session = 1;
    // 512 chunks of 128 KiB, plus room for the control buffers.
    let mut h = Harness::with_pool(config, (64 << 20) + (1 << 20));
    let events = deliver(name);
    let reqs: Vec<Vec<u8>> = events
        .iter()
        .filter_map(|e| match (&e.dir, &e.what) {
            (Dir::ToServer, Delivered::CmReq { private_data, .. }) => {
                Some(private_data[36..].to_vec())
            }
            _ => None,
        })
        .collect();
    let reps: Vec<Vec<u8>> = events
        .iter()
        .filter_map(|e| match (&e.dir, &e.what) {
            (Dir::ToClient, Delivered::CmRep { private_data, .. }) => Some(private_data.clone()),
            _ => None,
        })
        .collect();
    assert!(!reqs.is_empty());
    assert_eq!(reqs.len(), reps.len());
    for (req, rep) in reqs.iter().zip(&reps) {
        let conn = h.request(req);
        assert!(h.was_accepted(conn), "accepted");
        let ours = h.ports[0]
            .accepted
            .iter()
            .find(|a| a.conn == conn)
            .unwrap()
            .private_data
            .clone();
        assert_eq!(ours[..], rep[..ConnRsp::LEN], "CONN_RSP byte for byte");
        assert!(rep[ConnRsp::LEN..].iter().all(|&b| b == 0));
        let rsp = ConnRsp::parse(&ours).unwrap();
        assert_eq!(rsp.queue_depth, 512);
        assert_eq!(rsp.max_io_size, 126_976);
        assert_eq!(rsp.max_hdr_size, 4096);
    }
    // One half-open path with every connection of it, and no session yet:
    // the INFO_REQ (not replayed) is what gets it admitted. The path holds
    // its INFO_REQ receive buffer, not a chunk pool.
    let usage = h.server.usage();
    assert_eq!((usage.sessions, usage.paths), (0, 1));
    assert_eq!(usage.buffers, 1, "only the INFO_REQ buffer before INFO_REQ");
    assert_eq!(usage.connections, reqs.len());
    reqs.len()
}
