//! Frame link tests: two ends in one process, and a raw socket posing as QEMU.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use hal::hosted::{wait_ready, FrameEndpoint, FrameLink, MonotonicClock};
use hal::{Clock, Nic, NicError};

fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("brick-hal-{}-{name}.sock", std::process::id()))
}

/// Receives one frame, waiting up to two seconds.
fn receive(link: &mut FrameLink) -> Option<Vec<u8>> {
    receive_within(link, 2_000_000_000)
}

/// Receives one frame, waiting up to `nanos`.
fn receive_within(link: &mut FrameLink, nanos: u64) -> Option<Vec<u8>> {
    let deadline = MonotonicClock::new().now() + nanos;
    loop {
        if let Some(frame) = link.receive(<[u8]>::to_vec).unwrap() {
            return Some(frame);
        }
        if MonotonicClock::new().now() >= deadline {
            return None;
        }
        let fds: Vec<_> = link.raw_fd().into_iter().collect();
        wait_ready(
            &fds,
            &[],
            Some((MonotonicClock::new().now() + 10_000_000).min(deadline)),
        )
        .unwrap();
    }
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn pair(name: &str) -> (FrameLink, FrameLink) {
    let path = socket_path(name);
    let listener = FrameLink::open(&FrameEndpoint::UnixListen(path.clone()))
        .unwrap()
        .with_mtu(9000);
    let connector = FrameLink::open(&FrameEndpoint::UnixConnect(path))
        .unwrap()
        .with_mtu(9000);
    (listener, connector)
}

#[test]
fn round_trip_both_ways_with_scatter_gather() {
    let (mut server, mut client) = pair("round-trip");
    assert!(client.is_connected());
    for (i, len) in [60usize, 1514, 9014, 14].into_iter().enumerate() {
        let data = frame(len, i as u8);
        let (header, payload) = data.split_at(14.min(len));
        let (a, b) = payload.split_at(payload.len() / 3);
        client.transmit(header, &[a, &[], b]).unwrap();
        assert_eq!(
            receive(&mut server).as_deref(),
            Some(&data[..]),
            "client -> server, {len} bytes"
        );
        server.transmit(&data, &[]).unwrap();
        assert_eq!(
            receive(&mut client).as_deref(),
            Some(&data[..]),
            "server -> client, {len} bytes"
        );
    }
    assert!(server.is_connected());
    assert_eq!(
        client.transmit(&[0; 9015], &[]),
        Err(NicError::FrameTooLong)
    );
    let mut buffer = [0u8; 100];
    client.transmit(&[7; 200], &[]).unwrap();
    let mut small = [0u8; 10];
    let deadline = MonotonicClock::new().now() + 2_000_000_000;
    let result = loop {
        match server.receive_into(&mut small) {
            Ok(None) if MonotonicClock::new().now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            other => break other,
        }
    };
    assert_eq!(result, Err(NicError::FrameTooLong));
    client.transmit(&[8; 100], &[]).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(server.receive_into(&mut buffer), Ok(Some(100)));
    assert_eq!(buffer, [8; 100]);
}

#[test]
fn partial_reads_and_coalesced_frames() {
    let path = socket_path("partial");
    let mut link = FrameLink::open(&FrameEndpoint::UnixListen(path.clone())).unwrap();
    let mut qemu = UnixStream::connect(&path).unwrap();
    assert_eq!(link.receive(<[u8]>::to_vec), Ok(None));
    assert!(link.is_connected());

    // One frame dribbled in byte by byte: nothing until it is complete.
    let data = frame(1000, 3);
    let mut wire = (data.len() as u32).to_be_bytes().to_vec();
    wire.extend_from_slice(&data);
    for (i, byte) in wire.iter().enumerate() {
        qemu.write_all(&[*byte]).unwrap();
        if i + 1 < wire.len() {
            std::thread::sleep(Duration::from_micros(50));
            assert_eq!(link.receive(<[u8]>::to_vec), Ok(None), "byte {i}");
        }
    }
    assert_eq!(receive(&mut link), Some(data));

    // Three frames in one write, the last split across two writes.
    let frames = [frame(60, 1), frame(1514, 2), frame(9014, 3)];
    let mut wire = Vec::new();
    for data in &frames {
        wire.extend_from_slice(&(data.len() as u32).to_be_bytes());
        wire.extend_from_slice(data);
    }
    let (first, second) = wire.split_at(wire.len() - 4000);
    qemu.write_all(first).unwrap();
    assert_eq!(receive(&mut link).as_ref(), Some(&frames[0]));
    assert_eq!(receive(&mut link).as_ref(), Some(&frames[1]));
    assert_eq!(link.receive(<[u8]>::to_vec), Ok(None));
    qemu.write_all(second).unwrap();
    assert_eq!(receive(&mut link).as_ref(), Some(&frames[2]));

    // What the link sends is framed as QEMU expects.
    link.transmit(b"header", &[b"pay", b"load"]).unwrap();
    let mut got = [0u8; 17];
    qemu.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"\0\0\0\x0dheaderpayload");
}

#[test]
fn big_frames_with_backpressure_arrive_in_order() {
    let (mut server, mut client) = pair("backpressure");
    let count = 400; // ~3.6 MB: far beyond the socket buffer.
    let mut sent = 0;
    let mut received = 0;
    let mut busy = 0;
    while received < count {
        while sent < count {
            let data = frame(9014, sent as u8);
            match client.transmit(&data[..14], &[&data[14..5000], &data[5000..]]) {
                Ok(()) => sent += 1,
                Err(NicError::Busy) => {
                    busy += 1;
                    break;
                }
                Err(other) => panic!("transmit: {other}"),
            }
        }
        client.flush().unwrap();
        // Drain what is there, then let the sender continue.
        while let Some(got) = server.receive(<[u8]>::to_vec).unwrap() {
            assert_eq!(got, frame(9014, received as u8), "frame {received}");
            received += 1;
        }
        if received < sent {
            // Wake for input, or for room to flush the sender's queue.
            let readable: Vec<_> = server.raw_fd().into_iter().collect();
            let writable: Vec<_> = client
                .raw_fd()
                .filter(|_| client.has_pending_output())
                .into_iter()
                .collect();
            wait_ready(
                &readable,
                &writable,
                Some(MonotonicClock::new().now() + 100_000_000),
            )
            .unwrap();
        }
    }
    assert!(busy > 0, "the socket buffer never filled");
    assert!(!client.has_pending_output());
}

#[test]
fn peer_disconnect_then_new_peer() {
    let path = socket_path("reconnect");
    let mut server = FrameLink::open(&FrameEndpoint::UnixListen(path.clone())).unwrap();
    for round in 0..3u8 {
        let mut client = FrameLink::open(&FrameEndpoint::UnixConnect(path.clone())).unwrap();
        client.transmit(&[round; 64], &[]).unwrap();
        assert_eq!(receive(&mut server), Some(vec![round; 64]));
        server.transmit(&[round + 10; 64], &[]).unwrap();
        assert_eq!(receive(&mut client), Some(vec![round + 10; 64]));
        drop(client);
        assert_eq!(receive_within(&mut server, 100_000_000), None);
        assert!(!server.is_connected());
    }
    // A peer leaving mid-frame takes the partial frame with it.
    let mut raw = UnixStream::connect(&path).unwrap();
    raw.write_all(&[0, 0, 0, 100, 1, 2, 3]).unwrap();
    assert_eq!(receive_within(&mut server, 50_000_000), None);
    assert!(server.is_connected());
    drop(raw);
    assert_eq!(receive_within(&mut server, 100_000_000), None);
    assert!(!server.is_connected());
    let mut raw = UnixStream::connect(&path).unwrap();
    raw.write_all(&[0, 0, 0, 3, 7, 8, 9]).unwrap();
    assert_eq!(receive(&mut server), Some(vec![7, 8, 9]));
    drop(raw);
    // A connector whose listener restarts reconnects by itself.
    let mut client = FrameLink::open(&FrameEndpoint::UnixConnect(path.clone())).unwrap();
    assert_eq!(server.receive(<[u8]>::to_vec), Ok(None));
    drop(server);
    assert_eq!(receive_within(&mut client, 100_000_000), None);
    assert_eq!(client.transmit(&[1; 64], &[]), Err(NicError::LinkDown));
    let mut server = FrameLink::open(&FrameEndpoint::UnixListen(path)).unwrap();
    client.transmit(&[2; 64], &[]).unwrap();
    assert_eq!(receive(&mut server), Some(vec![2; 64]));
}

#[test]
fn framing_error_resets_the_link() {
    let path = socket_path("framing");
    let mut link = FrameLink::open(&FrameEndpoint::UnixListen(path.clone())).unwrap();
    let mut bad = UnixStream::connect(&path).unwrap();
    bad.write_all(&u32::MAX.to_be_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let mut result = Ok(None);
    for _ in 0..3 {
        result = link.receive(<[u8]>::to_vec);
        if result.is_err() {
            break;
        }
    }
    assert_eq!(result, Err(NicError::Framing));
    assert!(!link.is_connected());
    let mut good = UnixStream::connect(&path).unwrap();
    good.write_all(&[0, 0, 0, 2, 0xab, 0xcd]).unwrap();
    assert_eq!(receive(&mut link), Some(vec![0xab, 0xcd]));
}

#[test]
fn tcp_loopback() {
    let mut server =
        FrameLink::open(&FrameEndpoint::TcpListen("127.0.0.1:0".parse().unwrap())).unwrap();
    let addr = server.tcp_listen_addr().unwrap();
    let mut client = FrameLink::open(&FrameEndpoint::TcpConnect(addr))
        .unwrap()
        .with_mtu(9000);
    let data = frame(9014, 9);
    client.transmit(&data[..14], &[&data[14..]]).unwrap();
    assert_eq!(receive(&mut server), Some(data));
    server.transmit(b"pong", &[]).unwrap();
    assert_eq!(receive(&mut client), Some(b"pong".to_vec()));
}
