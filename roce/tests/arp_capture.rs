//! `roce::arp` against the ARP frames of the Linux captures: our requests, replies
//! and re-confirmation probes equal the Linux ones byte for byte. The one
//! deliberate difference: a broadcast who-has is answered first by a broadcast
//! reply (otherwise Linux's bytes), then by Linux's unicast reply exactly
//! (`roce::arp`, "Answering a first resolution twice").

mod common;

use common::Capture;
use roce::arp::{Arp, Config, NeighborState};
use roce::wire::{EthernetAddress, Ipv4Address};

const SERVER_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0x00, 0x77, 0x00, 0x01]);
const CLIENT_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0x00, 0x77, 0x00, 0x02]);
const SERVER_IP: Ipv4Address = Ipv4Address::new(10, 77, 0, 1);
const CLIENT_IP: Ipv4Address = Ipv4Address::new(10, 77, 0, 2);
const SECOND: u64 = 1_000_000_000;

fn host(mac: EthernetAddress, ip: Ipv4Address) -> Arp<8> {
    let mut arp = Arp::new(mac, Config::default());
    arp.add_address(ip).unwrap();
    arp
}

/// Frames 1-2: the client's who-has and the server's reply.
#[test]
fn who_has_and_reply_equal_linux() {
    for name in ["rnbd-linux-srv-linux-clt", "rping-linux", "rnbd-multipath"] {
        let capture = Capture::load(name);
        let frames = capture.frames();
        let mut client = host(CLIENT_MAC, CLIENT_IP);
        let request = client.request(0, CLIENT_IP, SERVER_IP).unwrap();
        assert_eq!(&request[..], frames[0], "{name} frame 1");

        let mut server = host(SERVER_MAC, SERVER_IP);
        let first = server.process(0, frames[0]).unwrap();
        assert_eq!(
            &first[..6],
            &EthernetAddress::BROADCAST.0,
            "{name}: broadcast first"
        );
        assert_eq!(
            &first[6..],
            &frames[1][6..],
            "{name} frame 2 but for the destination"
        );
        let delay = Config::default().confirm_delay;
        assert_eq!(server.poll_at(), Some(delay));
        let reply = server.poll(delay).unwrap();
        assert_eq!(&reply[..], frames[1], "{name} frame 2");
        assert_eq!(server.lookup(0, CLIENT_IP), Some(CLIENT_MAC));

        assert_eq!(client.process(0, frames[1]), None);
        assert_eq!(client.lookup(0, SERVER_IP), Some(SERVER_MAC));
    }
}

/// Frames 371-372: the server re-confirms the client it uses with a unicast probe;
/// the client answers it.
#[test]
fn reconfirmation_probe_equals_linux() {
    let capture = Capture::load("rnbd-linux-srv-linux-clt");
    let frames = capture.frames();
    let mut server = host(SERVER_MAC, SERVER_IP);
    server.process(0, frames[0]).unwrap();
    let delay = Config::default().confirm_delay;
    assert_eq!(
        server.poll(delay).map(|reply| reply.to_vec()),
        Some(frames[1].to_vec())
    );
    assert_eq!(server.lookup(SECOND, CLIENT_IP), Some(CLIENT_MAC));
    let at = server.poll_at().unwrap();
    let probe = server.poll(at).unwrap();
    assert_eq!(&probe[..], frames[370], "frame 371");
    assert_eq!(
        server.state(at, CLIENT_IP),
        NeighborState::Stale(CLIENT_MAC)
    );

    let mut client = host(CLIENT_MAC, CLIENT_IP);
    let answer = client.process(at, frames[370]).unwrap();
    assert_eq!(&answer[..], frames[371], "frame 372");

    assert_eq!(server.process(at, frames[371]), None);
    assert_eq!(
        server.state(at, CLIENT_IP),
        NeighborState::Reachable(CLIENT_MAC)
    );
}

/// rnbd-multipath frames 23-24: the second path's interface (10.78.0.x).
#[test]
fn second_path_interface() {
    let capture = Capture::load("rnbd-multipath");
    let frames = capture.frames();
    let server_mac = EthernetAddress([0x52, 0x54, 0x00, 0x78, 0x00, 0x01]);
    let mut server = host(server_mac, Ipv4Address::new(10, 78, 0, 1));
    let first = server.process(0, frames[22]).unwrap();
    assert_eq!(&first[6..], &frames[23][6..]);
    let reply = server.poll(Config::default().confirm_delay).unwrap();
    assert_eq!(&reply[..], frames[23]);
    // The first path's who-has is not for this interface's MAC/IP: no reply.
    assert_eq!(server.process(0, frames[0]), None);
}
