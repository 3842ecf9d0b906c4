//! The image's admin endpoint over smoltcp TCP (`target_image::admin_tcp`):
//! a second smoltcp interface on the same in-memory Ethernet segment is an
//! HTTP client; its ARP requests are answered by the engine (smoltcp's
//! own replies are dropped), its TCP segments go to the endpoint alone.
//! A client writes to a thin volume through the engine first, so the
//! answers carry real counters and extents: `/metrics` (200, the IO
//! counted), `/volumes/thin0/extents` (200, the JSON ranges), a RAM
//! volume (422), an unknown one (404), another method (405), and a
//! connection from outside the admin sources (reset, logged, counted).
//! The endpoint allocates nothing after it is built: a counting allocator
//! watches every call into it (the harness's own callbacks excepted).

mod common;

use std::cell::Cell;
use std::collections::VecDeque;
use std::path::PathBuf;

use common::{pattern, Fabric, Keys, World};
use hal::block::Either;
use manifest::binary::Manifest;
use rnbd::wire::AccessMode;
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};
use target_image::admin_tcp::AdminTcp;
use target_image::hosted::{self, HostedVolume};
use target_image::hosted_thin::HostedThin;
use target_image::{Engine, RamOr};

const ENGINE_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x01];

thread_local! {
    /// Set while the endpoint runs (not the harness's callbacks).
    static ARMED: Cell<bool> = const { Cell::new(false) };
    /// Allocations made while armed.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

#[global_allocator]
static ALLOCATOR: alloc_counter::Counting = alloc_counter::Counting::new(note);

/// The endpoint's section of the test manifest.
const ADMIN: &str = "[admin]\naddress = \"10.77.0.1:9100\"\nsources = [\"10.77.0.2\"]\n";

fn note() {
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

/// Runs `f` with allocations counted (`on`) or not.
fn armed<R>(on: bool, f: impl FnOnce() -> R) -> R {
    let before = ARMED.with(|a| a.replace(on));
    let result = f();
    ARMED.with(|a| a.set(before));
    result
}

/// The client's device: frames in from the segment, frames out to it.
#[derive(Default)]
struct Wire {
    inbox: VecDeque<Vec<u8>>,
    outbox: VecDeque<Vec<u8>>,
}

struct In(Vec<u8>);
struct Out<'a>(&'a mut VecDeque<Vec<u8>>);

impl RxToken for In {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl TxToken for Out<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0; len];
        let result = f(&mut frame);
        self.0.push_back(frame);
        result
    }
}

impl Device for Wire {
    type RxToken<'a> = In;
    type TxToken<'a> = Out<'a>;

    fn receive(&mut self, _: Instant) -> Option<(In, Out<'_>)> {
        let frame = self.inbox.pop_front()?;
        Some((In(frame), Out(&mut self.outbox)))
    }

    fn transmit(&mut self, _: Instant) -> Option<Out<'_>> {
        Some(Out(&mut self.outbox))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = 1514;
        caps
    }
}

/// A smoltcp HTTP client at 10.77.0.`host`.
struct Client {
    mac: [u8; 6],
    wire: Wire,
    iface: Interface,
    sockets: SocketSet<'static>,
    /// ARP replies it received, and from which MAC.
    arp_replies_from: Vec<[u8; 6]>,
}

impl Client {
    fn new(host: u8) -> Self {
        let mac = [0x52, 0x54, 0x00, 0x77, 0x02, host];
        let mut wire = Wire::default();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        config.random_seed = u64::from(host);
        let mut iface = Interface::new(config, &mut wire, Instant::from_millis(1));
        iface.update_ip_addrs(|a| {
            a.push(IpCidr::new(IpAddress::v4(10, 77, 0, host), 24))
                .unwrap();
        });
        Self {
            mac,
            wire,
            iface,
            sockets: SocketSet::new(Vec::new()),
            arp_replies_from: Vec::new(),
        }
    }
}

/// The engine, its admin endpoint and a client on one segment.
struct Segment<'w, 'm> {
    world: &'w mut World<'m, HostedVolume>,
    admin: AdminTcp,
    log: Vec<String>,
}

fn as_thin(volume: &HostedVolume) -> Option<&HostedThin> {
    match volume {
        RamOr::Device(Either::Right(thin)) => Some(thin),
        _ => None,
    }
}

impl Segment<'_, '_> {
    /// One step: the client's frames to the endpoint or the engine, both
    /// polled, their frames to the client, the client polled.
    fn step(&mut self, client: &mut Client) {
        let now = self.world.now;
        let ts = Instant::from_micros((now / 1000) as i64);
        client.iface.poll(ts, &mut client.wire, &mut client.sockets);
        while let Some(frame) = client.wire.outbox.pop_front() {
            if std::env::var_os("ADMIN_TCP_TRACE").is_some() {
                eprintln!("client> {:02x?}", &frame[..frame.len().min(60)]);
            }
            if !armed(true, || self.admin.receive(0, &frame)) {
                self.world.engine.receive(0, now, &frame);
            }
        }
        let mut to_client: Vec<Vec<u8>> = Vec::new();
        self.world
            .engine
            .poll(now, &mut |_: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
                let mut frame = h.to_vec();
                for piece in p {
                    frame.extend_from_slice(piece);
                }
                frame.extend_from_slice(t);
                to_client.push(frame);
            });
        let log = &mut self.log;
        let (admin, engine) = (&mut self.admin, &self.world.engine);
        armed(true, || {
            admin.poll(
                now,
                engine,
                &as_thin,
                &mut |frame| armed(false, || to_client.push(frame.to_vec())),
                &mut |line| armed(false, || log.push(line.to_string())),
            )
        });
        for frame in to_client {
            if std::env::var_os("ADMIN_TCP_TRACE").is_some() {
                eprintln!("<target {:02x?}", &frame[..frame.len().min(60)]);
            }
            let dest = &frame[..6];
            if dest == client.mac || dest == [0xff; 6] {
                if frame[12..14] == [0x08, 0x06] && frame[20..22] == [0, 2] {
                    client
                        .arp_replies_from
                        .push(frame[6..12].try_into().unwrap());
                }
                client.wire.inbox.push_back(frame);
            }
        }
        self.world.now += 100_000;
    }

    /// Sends `request` from `client` and reads until the endpoint closes:
    /// the bytes received and whether the connection was reset.
    fn exchange(&mut self, client: &mut Client, request: &str, port: u16) -> (Vec<u8>, bool) {
        let socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 4096]),
            tcp::SocketBuffer::new(vec![0; 64 << 10]),
        );
        let handle = client.sockets.add(socket);
        let socket = client.sockets.get_mut::<tcp::Socket>(handle);
        socket
            .connect(
                client.iface.context(),
                (IpAddress::v4(10, 77, 0, 1), 9100),
                port,
            )
            .unwrap();
        let mut sent = false;
        let mut received = Vec::new();
        let mut established = false;
        for _ in 0..50_000 {
            self.step(client);
            let socket = client.sockets.get_mut::<tcp::Socket>(handle);
            established |= socket.state() == tcp::State::Established;
            if socket.may_send() && !sent {
                socket.send_slice(request.as_bytes()).unwrap();
                sent = true;
            }
            while socket.can_recv() {
                socket
                    .recv(|data| {
                        received.extend_from_slice(data);
                        (data.len(), ())
                    })
                    .unwrap();
            }
            if sent && !socket.may_recv() {
                socket.close();
            }
            if socket.state() == tcp::State::Closed {
                let reset = !established || !sent;
                client.sockets.remove(handle);
                return (received, reset);
            }
            if socket.state() == tcp::State::TimeWait {
                client.sockets.remove(handle);
                return (received, false);
            }
        }
        panic!("no answer to {request:?} within 5 s of fake time");
    }

    /// `GET`s `path`: the status and body, checking the framing.
    fn get(&mut self, client: &mut Client, method: &str, path: &str, port: u16) -> (u16, String) {
        let request = format!("{method} {path} HTTP/1.1\r\nHost: brick\r\nAccept: */*\r\n\r\n");
        let (bytes, reset) = self.exchange(client, &request, port);
        assert!(!reset, "{method} {path}: the connection was reset");
        let text = String::from_utf8(bytes).expect("text");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        let status: u16 = head
            .strip_prefix("HTTP/1.1 ")
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("status line: {head:?}"));
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .and_then(|l| l.parse().ok())
            .expect("Content-Length");
        assert_eq!(length, body.len(), "{path}: Content-Length");
        assert!(head.contains("\r\nConnection: close"), "{head}");
        (status, body.to_owned())
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name}"))
}

#[test]
fn the_admin_endpoint_answers_http_over_smoltcp() {
    let dir = std::env::temp_dir().join(format!("brick-admin-tcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool: PathBuf = dir.join("pool0.img");
    let _ = std::fs::remove_file(&pool);
    let text = common::thin_and_ram_manifest("brick-admin-tcp", &pool, ADMIN);
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let blob = manifest::build(&text, "admin.toml").unwrap();
            let manifest = Manifest::parse(&blob).unwrap();
            let engine =
                Engine::with_volumes(manifest, |i| Keys(500 + i as u64), hosted::open_volume)
                    .unwrap();
            let mut world = World::with_engine(engine);
            let c = world.add_client(5, 16, 7);
            world.connect(c, "s1", 1).expect("session up");
            let thin = world.open(c, 1, "thin0", AccessMode::ReadWrite).unwrap();
            for (tag, extent) in [(10, 0u64), (11, 1), (12, 3)] {
                let offset = extent * (2 << 20);
                assert_eq!(world.write(c, tag, &thin, offset, &pattern(tag, 4096)), 0);
            }
            let admin = AdminTcp::new(world.engine.manifest(), 42, world.now)
                .expect("the admin address is eth0's")
                .expect("an [admin] section");
            assert_eq!(admin.interface(), 0);
            let mut segment = Segment {
                world: &mut world,
                admin,
                log: Vec::new(),
            };
            let mut client = Client::new(2);

            let (status, body) = segment.get(&mut client, "GET", "/metrics", 40001);
            assert_eq!(status, 200, "{body}");
            assert_eq!(metric(&body, "brick_volume_writes_total{volume=\"thin0\"}"), 3.0);
            assert_eq!(metric(&body, "brick_volume_allocated_extents{volume=\"thin0\"}"), 3.0);
            assert_eq!(metric(&body, "brick_admin_requests_total"), 1.0);
            // The client found the endpoint through the engine's ARP reply.
            assert!(!client.arp_replies_from.is_empty());
            assert!(client.arp_replies_from.iter().all(|mac| *mac == ENGINE_MAC));
            let arp_replies = client.arp_replies_from.len();

            let (status, body) = segment.get(&mut client, "GET", "/volumes/thin0/extents", 40002);
            assert_eq!(status, 200);
            assert_eq!(
                body,
                "{\"volume\":\"thin0\",\"extent_size\":2097152,\"allocated_extents\":3,\"pool_extents\":7,\
                 \"pool_free_extents\":4,\"ranges\":[{\"first_extent\":0,\"extents\":2,\"offset\":0,\
                 \"length\":4194304},{\"first_extent\":3,\"extents\":1,\"offset\":6291456,\"length\":2097152}]}"
            );
            let (status, body) = segment.get(&mut client, "GET", "/volumes/ram0/extents", 40003);
            assert_eq!(
                (status, body.as_str()),
                (422, r#"{"error":"volume \"ram0\" is not thin: it has no extents"}"#)
            );
            let (status, body) = segment.get(&mut client, "GET", "/volumes/x/extents", 40004);
            assert_eq!(
                (status, body.as_str()),
                (404, r#"{"error":"no volume \"x\" (volumes: thin0, ram0)"}"#)
            );
            let (status, _) = segment.get(&mut client, "POST", "/metrics", 40005);
            assert_eq!(status, 405);
            // Later connections needed no new ARP: smoltcp learned the
            // client from its first request and kept it.
            assert_eq!(client.arp_replies_from.len(), arp_replies);

            // Not an admin source: reset without an answer, logged, counted.
            let mut stranger = Client::new(3);
            let (bytes, reset) =
                segment.exchange(&mut stranger, "GET /metrics HTTP/1.1\r\n\r\n", 40006);
            assert!(reset && bytes.is_empty(), "got {} bytes", bytes.len());
            assert_eq!(segment.admin.counters().refused, 1);
            assert!(
                segment.log.iter().any(|l| l.contains("refused a connection from 10.77.0.3")),
                "{:?}",
                segment.log
            );
            let (status, body) = segment.get(&mut client, "GET", "/metrics", 40007);
            assert_eq!(status, 200);
            assert_eq!(metric(&body, "brick_admin_connections_refused_total"), 1.0);
            assert_eq!(metric(&body, "brick_admin_requests_total"), 3.0);
            // Every socket went back to listening: nothing is due but
            // smoltcp's own timers.
            for _ in 0..100 {
                segment.step(&mut client);
            }
            assert!(!segment.admin.poll(
                segment.world.now,
                &segment.world.engine,
                &as_thin,
                &mut |_| panic!("nothing to send"),
                &mut |_| {},
            ));
            assert_eq!(
                ALLOCATIONS.with(Cell::get),
                0,
                "the endpoint allocated after it was built"
            );
            world.close_session(c);
        })
        .unwrap()
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    let _ = std::fs::remove_dir_all(&dir);
}
