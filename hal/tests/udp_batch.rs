//! UDP NIC batching: queued datagrams leave in one sendmmsg (equal-sized
//! runs as one GSO send) and arrive through one recvmmsg (a GSO run as one
//! coalesced GRO receive), in order and intact; what does not fit is
//! dropped and counted.

use std::net::SocketAddr;

use hal::hosted::udp::BATCH;
use hal::hosted::{wait_readable, Link, MonotonicClock, UdpNic};
use hal::{Clock, DatagramNic};

/// Binds `count` NICs on 127.0.0.1, 127.0.0.2, … and one common port.
fn nics(count: u8) -> Vec<UdpNic> {
    'port: for _ in 0..20 {
        let first = UdpNic::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = first.local_addr().port();
        let mut all = vec![first];
        for host in 2..=count {
            match UdpNic::bind(SocketAddr::from(([127, 0, 0, host], port))) {
                Ok(nic) => all.push(nic),
                Err(_) => continue 'port,
            }
        }
        return all;
    }
    panic!("no port free on every address");
}

/// Datagram `index` of `len` bytes: its index, then a pattern.
fn datagram(index: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|at| {
            if at == 0 {
                index as u8
            } else {
                (at * 7 + index) as u8
            }
        })
        .collect()
}

/// Everything `nic` receives until it has `count` datagrams (or 2 s pass).
fn receive_all(nic: &mut UdpNic, count: usize) -> Vec<(Vec<u8>, SocketAddr)> {
    let clock = MonotonicClock::new();
    let deadline = clock.now() + 2_000_000_000;
    let mut got = Vec::new();
    while got.len() < count && clock.now() < deadline {
        match nic
            .receive(|payload, from| (payload.to_vec(), from))
            .unwrap()
        {
            Some(item) => got.push(item),
            None => {
                wait_readable(&[nic.raw_fd()], Some(deadline)).unwrap();
            }
        }
    }
    got
}

#[test]
fn a_queue_leaves_in_one_call_and_arrives_in_one_batch() {
    let mut nics = nics(2);
    let (mut b, mut a) = (nics.pop().unwrap(), nics.pop().unwrap());
    // The sizes of a 4 KiB RDMA WRITE at path MTU 1024 (first with RETH,
    // middle, last), a SEND, then a run broken by a longer packet.
    let sizes = [1056, 1040, 1040, 1040, 48, 1040, 1040, 1100, 200, 200];
    let sent: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(index, &len)| datagram(index, len))
        .collect();
    for packet in &sent {
        a.queue(b.local_addr(), &packet[..10], &[&packet[10..]])
            .unwrap();
    }
    assert!(a.has_queued());
    assert_eq!(a.stats().send_calls, 0, "queueing sends nothing");
    a.flush().unwrap();
    assert!(!a.has_queued());
    let stats = a.stats();
    assert_eq!(stats.send_calls, 1, "{stats:?}");
    assert_eq!(stats.datagrams_out, sizes.len() as u64);
    // [1056 1040] [1040 1040 48] [1040 1040] [1100] [200 200]
    assert_eq!(stats.gso_runs, 4, "{stats:?}");
    let got = receive_all(&mut b, sizes.len());
    let payloads: Vec<Vec<u8>> = got.iter().map(|(payload, _)| payload.clone()).collect();
    assert_eq!(payloads, sent, "datagram boundaries and order kept");
    assert!(got.iter().all(|(_, from)| *from == a.local_addr()));
    assert_eq!(b.stats().receive_batches, 1, "{:?}", b.stats());
    assert_eq!(b.stats().datagrams_in, sizes.len() as u64);
    // The batch was short, so the socket was empty: the end of the burst
    // is answered without reading it again…
    assert_eq!(b.receive(|_, _| ()), Ok(None));
    assert_eq!(b.stats().receive_batches, 1);
    // …and the next call reads what came since.
    a.transmit(b.local_addr(), b"late", &[]).unwrap();
    assert_eq!(receive_all(&mut b, 1)[0].0, b"late");
    assert_eq!(b.stats().receive_batches, 2);
}

#[test]
fn runs_do_not_cross_peers_and_gso_can_be_off() {
    let mut nics = nics(3);
    let mut c = nics.pop().unwrap();
    let mut b = nics.pop().unwrap();
    for gso in [true, false] {
        let mut a = if gso {
            UdpNic::bind(SocketAddr::from(([127, 0, 0, 4], 0))).unwrap()
        } else {
            UdpNic::bind(SocketAddr::from(([127, 0, 0, 4], 0)))
                .unwrap()
                .without_gso()
        };
        let order = [&b, &c, &b, &b, &c, &c];
        let targets: Vec<SocketAddr> = order.iter().map(|nic| nic.local_addr()).collect();
        for (index, to) in targets.iter().enumerate() {
            a.queue(*to, &datagram(index, 1040), &[]).unwrap();
        }
        a.flush().unwrap();
        let stats = a.stats();
        assert_eq!(stats.send_calls, 1);
        // b, c, [b b], [c c] with GSO.
        assert_eq!(stats.gso_runs, if gso { 2 } else { 0 }, "{stats:?}");
        let at_b: Vec<u8> = receive_all(&mut b, 3).iter().map(|(p, _)| p[0]).collect();
        let at_c: Vec<u8> = receive_all(&mut c, 3).iter().map(|(p, _)| p[0]).collect();
        assert_eq!(at_b, [0, 2, 3]);
        assert_eq!(at_c, [1, 4, 5]);
    }
}

#[test]
fn each_datagram_names_its_own_sender_across_batches() {
    // The receive keeps its address buffers from one batch to the next:
    // every datagram must still be reported from the peer that sent it.
    let mut nics = nics(3);
    let mut c = nics.pop().unwrap();
    let mut b = nics.pop().unwrap();
    let mut a = nics.pop().unwrap();
    let to = c.local_addr();
    for (round, order) in [vec![0usize, 1, 0, 1, 1], vec![1], vec![0, 0], vec![1, 0]]
        .into_iter()
        .enumerate()
    {
        for (index, &sender) in order.iter().enumerate() {
            let nic = if sender == 0 { &mut a } else { &mut b };
            nic.transmit(to, &datagram(round * 8 + index, 40), &[])
                .unwrap();
        }
        let got = receive_all(&mut c, order.len());
        let expected: Vec<(u8, SocketAddr)> = order
            .iter()
            .enumerate()
            .map(|(index, &sender)| {
                let from = if sender == 0 {
                    a.local_addr()
                } else {
                    b.local_addr()
                };
                ((round * 8 + index) as u8, from)
            })
            .collect();
        let seen: Vec<(u8, SocketAddr)> = got.iter().map(|(p, from)| (p[0], *from)).collect();
        assert_eq!(seen, expected, "round {round}");
    }
}

#[test]
fn a_full_queue_flushes_itself_and_transmit_keeps_the_order() {
    let mut nics = nics(2);
    let (mut b, mut a) = (nics.pop().unwrap(), nics.pop().unwrap());
    let count = BATCH + 5;
    for index in 0..count {
        a.queue(b.local_addr(), &datagram(index, 300 + index), &[])
            .unwrap();
    }
    assert_eq!(a.stats().send_calls, 1, "the full queue went out once");
    // A datagram sent at once goes after the queued ones.
    a.transmit(b.local_addr(), &datagram(count, 64), &[])
        .unwrap();
    assert!(!a.has_queued());
    let got = receive_all(&mut b, count + 1);
    let firsts: Vec<usize> = got.iter().map(|(p, _)| usize::from(p[0])).collect();
    let lens: Vec<usize> = got.iter().map(|(p, _)| p.len()).collect();
    assert_eq!(firsts, (0..=count).collect::<Vec<_>>());
    assert_eq!(lens[count], 64);
    assert_eq!(lens[count - 1], 300 + count - 1);
    assert!(
        b.stats().receive_batches >= 2,
        "more than one batch of {BATCH}"
    );
}

#[test]
fn datagrams_over_the_mtu_are_dropped_on_receive_and_sent_at_once() {
    let mut nics = nics(2);
    let b = nics.pop().unwrap();
    let a = nics.pop().unwrap().with_mtu(9000);
    let mut b = b.with_mtu(1500);
    let mut a = a;
    // Over a's slot too (9000): sent at once, after the queue.
    a.queue(b.local_addr(), &datagram(0, 100), &[]).unwrap();
    a.queue(b.local_addr(), &datagram(1, 9500), &[]).unwrap();
    assert!(!a.has_queued(), "the queue went first");
    // Over b's MTU: dropped there; the next one arrives.
    a.queue(b.local_addr(), &datagram(2, 4000), &[]).unwrap();
    a.queue(b.local_addr(), &datagram(3, 1400), &[]).unwrap();
    a.flush().unwrap();
    let got = receive_all(&mut b, 2);
    let firsts: Vec<u8> = got.iter().map(|(p, _)| p[0]).collect();
    assert_eq!(firsts, [0, 3]);
    assert_eq!(got[1].0, datagram(3, 1400));
    assert_eq!(b.stats().oversized_in, 2, "{:?}", b.stats());
}

#[test]
fn a_udp_link_queues_until_flushed() {
    let mut nics = nics(2);
    let (mut b, a) = (nics.pop().unwrap(), nics.pop().unwrap());
    let SocketAddr::V4(to) = b.local_addr() else {
        unreachable!("bound to IPv4");
    };
    let mut link = Link::Udp(a);
    link.transmit_datagram(to, b"head", &[b"pay", b"", b"load"], b"icrc");
    link.transmit_datagram(to, b"second", &[], b"");
    assert!(link.has_pending_output());
    assert_eq!(
        b.receive(|_, _| ()),
        Ok(None),
        "nothing sent before the flush"
    );
    link.flush();
    assert!(!link.has_pending_output());
    let got = receive_all(&mut b, 2);
    assert_eq!(got[0].0, b"headpayloadicrc");
    assert_eq!(got[1].0, b"second");
}

/// Whether this kernel has UDP GRO (`UDP_GRO`, Linux 5.0).
fn kernel_has_udp_gro() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse::<u32>().unwrap_or(0));
    numbers.next().unwrap_or(0) >= 5
}

#[test]
fn a_gso_run_arrives_coalesced_and_leaves_datagram_by_datagram() {
    for gro in [true, false] {
        let mut nics = nics(2);
        let (b, mut a) = (nics.pop().unwrap(), nics.pop().unwrap());
        let mut b = if gro { b } else { b.without_gro() };
        if gro && kernel_has_udp_gro() {
            assert!(b.coalesces(), "Linux 5.0 and later take UDP_GRO");
        }
        assert!(gro || !b.coalesces());
        // A 32 KiB RDMA WRITE at path MTU 1024: equal middle packets and a
        // shorter last one, one GSO run; then a lone SEND.
        let mut sizes = vec![1040; 31];
        sizes.push(300);
        sizes.push(48);
        let sent: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(index, &len)| datagram(index, len))
            .collect();
        for packet in &sent {
            a.queue(b.local_addr(), packet, &[]).unwrap();
        }
        a.flush().unwrap();
        assert_eq!(a.stats().gso_runs, 1, "{:?}", a.stats());
        let got = receive_all(&mut b, sent.len());
        let payloads: Vec<Vec<u8>> = got.iter().map(|(payload, _)| payload.clone()).collect();
        assert_eq!(payloads, sent, "every datagram intact, in order");
        assert!(got.iter().all(|(_, from)| *from == a.local_addr()));
        let stats = b.stats();
        assert_eq!(stats.datagrams_in, sent.len() as u64, "{stats:?}");
        assert_eq!(stats.oversized_in, 0, "{stats:?}");
        if b.coalesces() {
            assert!(stats.coalesced_in > 0, "{stats:?}");
            assert_eq!(stats.receive_batches, 1, "{stats:?}");
        } else {
            assert_eq!(stats.coalesced_in, 0, "{stats:?}");
        }
        // The datagrams were handed out before the socket was read again.
        assert_eq!(b.receive(|_, _| ()), Ok(None));
    }
}
