//! The engine end to end against Brick's own RTRS + RNBD client over two
//! software HCAs in one process: the engine's interface 0 and a client HCA,
//! joined by an in-memory Ethernet link under a fake clock. Covers
//! session setup, SESS_INFO, OPEN, byte-exact 4 KiB and 128 KiB writes and
//! reads, a read-only open refusing writes, an unknown volume, and a
//! session name the access list refuses.

use std::collections::VecDeque;
use std::net::SocketAddr;

use manifest::binary::Manifest;
use rnbd::client::{self as rnbd_client, Device};
use rnbd::wire::{AccessMode, RtrsDirection};
use roce::hca::{Hca, HcaConfig};
use rtrs::client::{Client, ClientConfig, ClientIo, Direction, Event, ReadBuffer};
use target_image::Engine;
use verbs::{AccessFlags, KeySource, Memory, MemoryRegion, Sge, Sgl, Verbs};

const MANIFEST: &str = r#"
[target]
name = "brick-test"

[limits]
queue_depth = 16

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "4MiB"

[[volumes]]
name = "vol1"
kind = "ram"
size = "4MiB"

[[access]]
sessions = "s*"
volumes = ["vol0"]
mode = "rw"

[[access]]
sessions = "s*"
volumes = ["vol1"]
mode = "ro"
"#;

struct Keys(u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
}

type ClientHca = Hca<Vec<u8>, Keys, 4096, 16, 4096>;

struct World<'m> {
    engine: Engine<'m, Keys>,
    client: Client<ClientHca>,
    to_client: VecDeque<Vec<u8>>,
    to_engine: VecDeque<Vec<u8>>,
    now: u64,
    events: Vec<Event>,
}

fn frame(headers: &[u8], payload: &[&[u8]], trailer: &[u8]) -> Vec<u8> {
    let mut out = headers.to_vec();
    for piece in payload {
        out.extend_from_slice(piece);
    }
    out.extend_from_slice(trailer);
    if std::env::var_os("TRACE_FRAMES").is_some() && out.len() > 54 && out[12..14] == [8, 0] {
        eprintln!(
            "frame {}->{} len {} opcode {:#x} dqpn {:02x}{:02x}{:02x} psn {:02x}{:02x}{:02x}",
            out[33],
            out[37],
            out.len(),
            out[42],
            out[47],
            out[48],
            out[49],
            out[51],
            out[52],
            out[53]
        );
        if out[42] == 0x64 {
            eprintln!(
                "  mad attr {:02x}{:02x} req.local_qpn {:02x?}",
                out[54 + 16],
                out[54 + 17],
                &out[110..113]
            );
        }
    }
    out
}

impl World<'_> {
    fn step(&mut self) {
        self.now += 10_000;
        let now = self.now;
        while let Some(f) = self.to_engine.pop_front() {
            self.engine.receive(0, now, &f);
        }
        let to_client = &mut self.to_client;
        self.engine
            .poll(now, &mut |_: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
                to_client.push_back(frame(h, p, t))
            });
        while let Some(f) = self.to_client.pop_front() {
            self.client.verbs_mut().receive(now, &f);
        }
        self.client.poll(now);
        let to_engine = &mut self.to_engine;
        self.client
            .verbs_mut()
            .poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                to_engine.push_back(frame(h, p, t))
            });
        while let Some(event) = self.client.next_event() {
            self.events.push(event);
        }
    }

    fn run_until(&mut self, mut done: impl FnMut(&[Event]) -> bool) {
        for _ in 0..200_000 {
            self.step();
            if done(&self.events) {
                return;
            }
        }
        panic!(
            "timed out; events {:?}\n{}\nclient hca {:?}\n{:?}\nengine hca {:?}\n{:?}",
            self.events,
            self.engine.stats(),
            self.client.verbs().control_counters(),
            self.client.verbs().counters(),
            self.engine.rtrs(0).unwrap().verbs().control_counters(),
            self.engine.rtrs(0).unwrap().verbs().counters()
        );
    }

    fn completion(&mut self, tag: u64) -> (u16, Option<ReadBuffer>) {
        self.run_until(|events| {
            events
                .iter()
                .any(|e| matches!(e, Event::IoCompleted { tag: t, .. } if *t == tag))
        });
        let at = self
            .events
            .iter()
            .position(|e| matches!(e, Event::IoCompleted { tag: t, .. } if *t == tag))
            .unwrap();
        match self.events.remove(at) {
            Event::IoCompleted { errno, read, .. } => (errno, read),
            _ => unreachable!(),
        }
    }

    /// Sends an RTRS READ carrying `header` with a reply buffer; returns
    /// (errno, reply bytes).
    fn admin_read(
        &mut self,
        tag: u64,
        header: &[u8],
        len: u32,
        buffer: MemoryRegion,
    ) -> (u16, Vec<u8>) {
        self.client
            .submit(ClientIo {
                tag,
                header,
                direction: Direction::Read {
                    dest: ReadBuffer {
                        region: buffer,
                        offset: 0,
                        len,
                    },
                },
                admin: true,
                hint: None,
            })
            .expect("submit");
        let (errno, read) = self.completion(tag);
        let mut out = vec![0; len as usize];
        if let Some(read) = read {
            self.client.read_response(&read, &mut out).unwrap();
        }
        (errno, out)
    }

    fn open(
        &mut self,
        tag: u64,
        path: &str,
        mode: AccessMode,
        buffer: MemoryRegion,
    ) -> Result<Device, u16> {
        let mut header = [0u8; 1024];
        let out = rnbd_client::open(path, mode, &mut header).unwrap();
        let (errno, reply) =
            self.admin_read(tag, &header[..out.user_header_len], out.data_len, buffer);
        if errno != 0 {
            return Err(errno);
        }
        Ok(Device::from_open_rsp(errno, &reply, mode).unwrap())
    }

    fn write(
        &mut self,
        tag: u64,
        device: &Device,
        offset: u64,
        data: &[u8],
        buffer: MemoryRegion,
    ) -> u16 {
        let mut header = [0u8; 64];
        let out = device
            .write(offset, data.len() as u32, false, &mut header)
            .unwrap();
        assert_eq!(out.direction, RtrsDirection::Write);
        self.client
            .verbs_mut()
            .write(buffer.handle, 0, data)
            .unwrap();
        self.client
            .submit(ClientIo {
                tag,
                header: &header[..out.user_header_len],
                direction: Direction::Write {
                    data: Sgl::single(Sge::new(buffer.lkey, 0, data.len() as u32)),
                },
                admin: false,
                hint: None,
            })
            .expect("submit write");
        self.completion(tag).0
    }

    fn read(
        &mut self,
        tag: u64,
        device: &Device,
        offset: u64,
        len: u32,
        buffer: MemoryRegion,
    ) -> (u16, Vec<u8>) {
        let mut header = [0u8; 64];
        let out = device.read(offset, len, &mut header).unwrap();
        self.client
            .submit(ClientIo {
                tag,
                header: &header[..out.user_header_len],
                direction: Direction::Read {
                    dest: ReadBuffer {
                        region: buffer,
                        offset: 0,
                        len,
                    },
                },
                admin: false,
                hint: None,
            })
            .expect("submit read");
        let (errno, read) = self.completion(tag);
        let mut out = vec![0; len as usize];
        if let Some(read) = read {
            self.client.read_response(&read, &mut out).unwrap();
        }
        (errno, out)
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// The RTRS server posts `SERVICE_CON_QUEUE_DEPTH` (512) receives on cid 0
/// and `queue_depth` on every IO connection; a software HCA whose receive
/// queues are shallower closes every path at INFO_REQ (PostFailed).
fn assert_hca_can_serve_rtrs() {
    let needed = usize::from(rtrs::wire::SERVICE_CON_QUEUE_DEPTH);
    assert!(
        roce::qp::config::RQ_DEPTH > needed,
        "roce RQ_DEPTH {} cannot hold the {needed} receives the RTRS server posts on cid 0",
        roce::qp::config::RQ_DEPTH
    );
}

fn with_world(session: &str, test: impl FnOnce(&mut World<'_>, MemoryRegion) + Send + 'static) {
    assert_hca_can_serve_rtrs();
    let session = session.to_owned();
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let blob = manifest::build(MANIFEST, "test.toml").expect("manifest");
            let manifest = Manifest::parse(&blob).unwrap();
            let mut engine = Engine::new(manifest, |i| Keys(1000 + i as u64)).expect("engine");
            engine.set_logger(|line| eprintln!("engine: {line}"));
            let hca: ClientHca = Hca::new(
                vec![0u8; 64 << 20],
                Keys(7),
                HcaConfig {
                    mac: [0x52, 0x54, 0x00, 0x77, 0x00, 0x02],
                    ip: [10, 77, 0, 2],
                },
            );
            let mut config = ClientConfig::default_with_seed([3; 16]);
            config.max_queue_depth = 16;
            let client = Client::new(hca, config).expect("client");
            let mut world = World {
                engine,
                client,
                to_client: VecDeque::new(),
                to_engine: VecDeque::new(),
                now: 1_000_000,
                events: Vec::new(),
            };
            let server: SocketAddr = "10.77.0.1:1234".parse().unwrap();
            let now = world.now;
            world
                .client
                .connect_session(&session, &[server], 1, now)
                .expect("connect");
            world.run_until(|events| events.iter().any(|e| matches!(e, Event::SessionUp { .. })));
            let verbs = world.client.verbs_mut();
            let handle = verbs.alloc(256 * 1024, 4096).unwrap();
            let buffer = verbs
                .reg_mr(
                    handle,
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
                )
                .unwrap();
            test(&mut world, buffer);
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn sess_info_open_write_read_byte_exact() {
    with_world("s1", |world, buffer| {
        let mut header = [0u8; 64];
        let out = rnbd_client::sess_info(&mut header).unwrap();
        let (errno, reply) =
            world.admin_read(1, &header[..out.user_header_len], out.data_len, buffer);
        assert_eq!(rnbd_client::sess_info_rsp(errno, &reply).unwrap(), 2);

        let device = world
            .open(2, "vol0", AccessMode::ReadWrite, buffer)
            .unwrap();
        assert_eq!(device.nsectors, 4 * 1024 * 1024 / 512);

        for (tag, (offset, len)) in [(0u64, 4096usize), (64 * 1024, 128 * 1024)]
            .into_iter()
            .enumerate()
        {
            let data = pattern(tag as u8 + 5, len);
            let tag = 10 + 2 * tag as u64;
            assert_eq!(world.write(tag, &device, offset, &data, buffer), 0);
            // Scrub the buffer so the read proves the data came back.
            world
                .client
                .verbs_mut()
                .write(buffer.handle, 0, &vec![0; len])
                .unwrap();
            let (errno, back) = world.read(tag + 1, &device, offset, len as u32, buffer);
            assert_eq!(errno, 0);
            assert!(back == data, "{len}-byte read differs");
        }
        let stats = world.engine.stats().to_string();
        assert!(stats.contains("session \"s1\""), "{stats}");
        assert!(stats.contains("volume vol0"), "{stats}");
    });
}

#[test]
fn read_only_open_refuses_writes_and_unknown_volume() {
    with_world("s2", |world, buffer| {
        // vol1 is read-only for s*: an RW open is refused (EACCES) ...
        assert_eq!(
            world
                .open(1, "vol1", AccessMode::ReadWrite, buffer)
                .unwrap_err(),
            rnbd::errno::EACCES
        );
        // ... an RO open works, and a write through it is refused (EPERM).
        let device = world.open(2, "vol1", AccessMode::ReadOnly, buffer).unwrap();
        let mut writable = device;
        writable.mode = AccessMode::ReadWrite; // a hostile client ignores its mode
        assert_eq!(
            world.write(3, &writable, 0, &[7; 4096], buffer),
            rnbd::errno::EPERM
        );
        // Unknown volume: ENOENT.
        assert_eq!(
            world
                .open(4, "nope", AccessMode::ReadOnly, buffer)
                .unwrap_err(),
            rnbd::errno::ENOENT
        );
    });
}

#[test]
fn session_name_refused_by_access_list() {
    with_world("other", |world, buffer| {
        assert_eq!(
            world
                .open(1, "vol0", AccessMode::ReadWrite, buffer)
                .unwrap_err(),
            rnbd::errno::EACCES
        );
    });
}
