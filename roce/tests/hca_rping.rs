//! The rping example's client against its server, host-only: two HCAs on two
//! threads joined by a pair of `hal` frame links over a Unix socket (the
//! framing QEMU's stream netdev speaks), doing ARP, the CM exchange, the rping
//! protocol (RDMA READ, RDMA WRITE, SENDs) and the DREQ/DREP.

mod common;

#[path = "../examples/rping/hosted.rs"]
mod hosted;
#[path = "../examples/rping/session.rs"]
mod session;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use hal::hosted::{FrameEndpoint, FrameLink, MonotonicClock, OsRng};
use hal::Clock;

use common::Capture;
use hosted::{new_hca, run, RngKeys};
use session::{ping_payload, Client, Server, Status};

const SERVER_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x01];
const CLIENT_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x02];
const SERVER_IP: [u8; 4] = [10, 77, 0, 1];
const CLIENT_IP: [u8; 4] = [10, 77, 0, 2];

fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("brick-rping-{}-{name}.sock", std::process::id()))
}

fn deadline() -> u64 {
    MonotonicClock::new().now() + 30_000_000_000
}

/// Runs one server and one client; returns (server status, client status,
/// client log).
fn rping(name: &str, size: u32, count: u32) -> (Status, Status, Vec<String>) {
    let path = socket_path(name);
    let mut server_link = FrameLink::open(&FrameEndpoint::UnixListen(path.clone()))
        .expect("listen")
        .with_mac(SERVER_MAC);
    let server = std::thread::spawn(move || {
        let mut hca = new_hca(RngKeys(OsRng), SERVER_MAC, SERVER_IP);
        let mut server = Server::new(&mut *hca, 7174, true).expect("server");
        let mut log = |line: &str| eprintln!("server: {line}");
        run(&mut hca, &mut server_link, deadline(), |hca| {
            match server.step(hca, &mut log) {
                Status::Running => None,
                other => Some(other),
            }
        })
        .expect("server loop")
    });
    let mut client_link = FrameLink::open(&FrameEndpoint::UnixConnect(path.clone()))
        .expect("connect")
        .with_mac(CLIENT_MAC);
    let mut hca = new_hca(RngKeys(OsRng), CLIENT_MAC, CLIENT_IP);
    let remote = SocketAddr::new(IpAddr::V4(Ipv4Addr::from(SERVER_IP)), 7174);
    let mut client = Client::new(&mut *hca, remote, size, count, true).expect("client");
    let mut lines = Vec::new();
    let client_status = run(&mut hca, &mut client_link, deadline(), |hca| {
        let mut log = |line: &str| lines.push(line.to_owned());
        match client.step(hca, &mut log) {
            Status::Running => None,
            other => Some(other),
        }
    })
    .expect("client loop");
    let server_status = server.join().expect("server thread");
    let _ = std::fs::remove_file(&path);
    (server_status, client_status, lines)
}

#[test]
fn rping_client_against_server() {
    let (server, client, lines) = rping("small", 64, 3);
    assert_eq!(client, Status::Done(3), "{lines:?}");
    assert_eq!(server, Status::Done(3));
    let pings: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("ping data: "))
        .collect();
    assert_eq!(pings.len(), 3);
    assert_eq!(
        pings[1].as_str(),
        format!("ping data: {}", session::printable(&ping_payload(1, 64)))
    );
    assert!(pings[0].starts_with("ping data: rdma-ping-0: ABCDEFG"));
}

#[test]
fn rping_multi_packet() {
    // 3000 bytes: multi-packet READ responses and WRITEs at MTU 1024.
    let (server, client, lines) = rping("large", 3000, 2);
    assert_eq!(client, Status::Done(2), "{lines:?}");
    assert_eq!(server, Status::Done(2));
}

#[test]
fn payload_matches_rping() {
    let data = ping_payload(0, 64);
    assert_eq!(&data[..16], b"rdma-ping-0: ABC");
    assert_eq!(data[63], 0);
    assert_eq!(&data[60..63], b"pqr");
    let data = ping_payload(1, 64);
    assert_eq!(&data[..16], b"rdma-ping-1: BCD");
}

#[test]
fn answers_icmp_echo_like_linux() {
    // Frames 3 and 4 of rping-linux.pcap: the client's echo request and the
    // Linux server's reply (the IP identification is the only free field).
    let capture = Capture::load("rping-linux");
    let frames = capture.frames();
    let reply = hosted::icmp_echo_reply(frames[2], SERVER_IP).expect("an echo request");
    let mut expected = frames[3].to_vec();
    let mut ours = reply.clone();
    for frame in [&mut expected, &mut ours] {
        frame[18..20].fill(0); // identification
        frame[24..26].fill(0); // header checksum (follows)
    }
    assert_eq!(ours, expected);
    assert_eq!(hosted::icmp_echo_reply(frames[2], CLIENT_IP), None);
    assert_eq!(hosted::icmp_echo_reply(frames[4], SERVER_IP), None);
    for len in 0..frames[2].len() {
        let _ = hosted::icmp_echo_reply(&frames[2][..len], SERVER_IP);
    }
}
