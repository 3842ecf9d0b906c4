//! The client's CON_REQs against the REQ private data a Linux 6.1 client
//! sent in a real capture (`tests/vectors/rnbd-linux-srv-linux-clt.pcap`):
//! byte for byte, uuids aside (rtrs.md §2.3).

mod client_support;
mod common;

use client_support::*;
use common::{deliver, Delivered, Dir};
use rtrs::wire::ConnReq;

/// Byte range of the two uuids in the 56-byte CON_REQ.
const UUIDS: std::ops::Range<usize> = 12..44;

#[test]
fn con_req_matches_linux_client_apart_from_uuids() {
    let linux: Vec<Vec<u8>> = deliver("rnbd-linux-srv-linux-clt")
        .into_iter()
        .filter_map(|e| match (e.dir, e.what) {
            (Dir::ToServer, Delivered::CmReq { private_data, .. }) => {
                Some(private_data[36..36 + ConnReq::LEN].to_vec())
            }
            _ => None,
        })
        .collect();
    assert!(!linux.is_empty());
    let cid_num = ConnReq::parse(&linux[0]).unwrap().cid_num;
    assert_eq!(usize::from(cid_num), linux.len(), "one path in the capture");
    let mut pair = Pair::new(server_config(true), client_config());
    pair.connect(1, cid_num);
    let ours = pair.fabric.con_reqs();
    assert_eq!(ours.len(), linux.len());
    for (cid, (ours, theirs)) in ours.iter().zip(&linux).enumerate() {
        assert_eq!(ours.len(), ConnReq::LEN);
        let mask = |bytes: &[u8]| {
            let mut b = bytes.to_vec();
            b[UUIDS].fill(0);
            b
        };
        assert_eq!(mask(ours), mask(theirs), "cid {cid} byte for byte");
        // The uuids follow Linux's rules: the path uuid and the session
        // uuid are the same on every connection of the path.
        assert_eq!(ours[UUIDS], pair.fabric.con_reqs()[0][UUIDS]);
        assert_eq!(theirs[UUIDS], linux[0][UUIDS]);
    }
}
