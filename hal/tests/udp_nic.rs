//! UDP NIC tests: two sockets on 127.0.0.1 and 127.0.0.2, same port.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use hal::hosted::{wait_readable, Link, LinkSpec, MonotonicClock, UdpNic};
use hal::{Clock, DatagramNic, NicError};

/// Binds 127.0.0.1 and 127.0.0.2 on one free port (as two RoCEv2 hosts on
/// port 4791 would be); `BRICK_TEST_UDP_PORT` picks the port.
fn pair() -> (UdpNic, UdpNic) {
    if let Ok(port) = std::env::var("BRICK_TEST_UDP_PORT") {
        let port: u16 = port.parse().expect("BRICK_TEST_UDP_PORT is a port number");
        let a = UdpNic::bind(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
        let b = UdpNic::bind(SocketAddr::from(([127, 0, 0, 2], port))).unwrap();
        return (a, b);
    }
    for _ in 0..20 {
        let a = UdpNic::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = a.local_addr().port();
        if let Ok(b) = UdpNic::bind(SocketAddr::from(([127, 0, 0, 2], port))) {
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

fn receive(nic: &mut UdpNic) -> Option<(Vec<u8>, SocketAddr)> {
    let deadline = MonotonicClock::new().now() + 2_000_000_000;
    loop {
        if let Some(got) = nic
            .receive(|payload, from| (payload.to_vec(), from))
            .unwrap()
        {
            return Some(got);
        }
        if MonotonicClock::new().now() >= deadline {
            return None;
        }
        wait_readable(&[nic.raw_fd()], Some(deadline)).unwrap();
    }
}

#[test]
fn loopback_between_two_addresses() {
    let (a, b) = pair();
    assert_eq!(a.mtu(), 1500);
    // A 4 KiB payload in one datagram needs a jumbo MTU.
    let (mut a, mut b) = (a.with_mtu(9000), b.with_mtu(9000));
    assert_eq!(a.local_addr().port(), b.local_addr().port());
    assert_eq!(a.receive(|_, _| ()), Ok(None));

    let bth = [0x04u8, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0x12, 0x34, 0x56];
    let payload: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    a.transmit(
        b.local_addr(),
        &bth,
        &[&payload[..1000], &payload[1000..], b"icrc"],
    )
    .unwrap();
    let (got, from) = receive(&mut b).unwrap();
    assert_eq!(from, a.local_addr());
    assert_eq!(&got[..12], &bth);
    assert_eq!(&got[12..12 + 4096], &payload[..]);
    assert_eq!(&got[12 + 4096..], b"icrc");

    b.transmit(a.local_addr(), b"ack", &[]).unwrap();
    assert_eq!(receive(&mut a), Some((b"ack".to_vec(), b.local_addr())));
    assert_eq!(a.mtu(), 9000);
}

#[test]
fn oversized_datagrams_are_refused() {
    let (mut a, b) = pair();
    let big = vec![0u8; 70_000];
    assert_eq!(
        a.transmit(b.local_addr(), &big, &[]),
        Err(NicError::FrameTooLong)
    );
    let many = [&b"x"[..]; 17];
    assert_eq!(
        a.transmit(b.local_addr(), b"h", &many),
        Err(NicError::FrameTooLong)
    );
}

#[test]
fn link_spec_opens_a_udp_nic() {
    let Link::Udp(nic) = "udp:127.0.0.1:0"
        .parse::<LinkSpec>()
        .unwrap()
        .open()
        .unwrap()
    else {
        panic!("expected a UDP link");
    };
    assert_eq!(nic.local_addr().ip(), std::net::Ipv4Addr::LOCALHOST);
    assert_ne!(nic.local_addr().port(), 0);
}

/// The socket buffers are enlarged past Linux's 208 KiB default (to the
/// full request when running as root, which CI does), so a burst of 128 KiB
/// IOs is not dropped in the socket.
#[test]
fn socket_buffers_are_enlarged() {
    let (a, _b) = pair();
    let (receive, send) = a.buffer_sizes().unwrap();
    // SAFETY: geteuid has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: net.core.rmem_max caps the buffers ({receive}, {send}); not checked");
        return;
    }
    // The kernel reports double the request (its bookkeeping).
    assert!(
        receive >= hal::hosted::udp::SOCKET_BUFFER_BYTES,
        "receive buffer {receive}"
    );
    assert!(
        send >= hal::hosted::udp::SOCKET_BUFFER_BYTES,
        "send buffer {send}"
    );
}

/// Sets the UDP segment size of every later send of `socket` (`UDP_SEGMENT`
/// as a socket option; 0 turns it off).
fn set_udp_segment(socket: &UdpSocket, size: libc::c_int) {
    // SAFETY: the option value is one `int` read through the pointer, which
    // points to `size` with its exact length for the call; the descriptor
    // is open for as long as `socket` is borrowed.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            std::ptr::from_ref(&size).cast::<libc::c_void>(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(result, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn a_coalesced_segment_over_the_mtu_is_dropped_alone() {
    let (_a, mut b) = pair();
    assert_eq!(b.mtu(), 1500);
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Three 3000-byte datagrams in one GSO send: over b's MTU, each.
    set_udp_segment(&raw, 3000);
    let run: Vec<u8> = (0..9000u32).map(|i| i as u8).collect();
    assert_eq!(raw.send_to(&run, b.local_addr()).unwrap(), run.len());
    set_udp_segment(&raw, 0);
    let normal: Vec<u8> = (0..1000u32).map(|i| (i * 3) as u8).collect();
    raw.send_to(&normal, b.local_addr()).unwrap();
    let (got, from) = receive(&mut b).expect("the normal datagram arrives");
    assert_eq!(got, normal);
    assert_eq!(from, raw.local_addr().unwrap());
    let stats = b.stats();
    assert_eq!(stats.oversized_in, 3, "each big datagram dropped {stats:?}");
    assert_eq!(stats.datagrams_in, 1, "{stats:?}");
    if b.coalesces() {
        assert_eq!(stats.coalesced_in, 1, "the run came as one {stats:?}");
    }
    assert_eq!(b.receive(|_, _| ()), Ok(None));
}
