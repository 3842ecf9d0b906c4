//! Model test: random sequences of OPEN / CLOSE / IO against the server and
//! RAM volumes, checked against a model of the device table and a
//! `Vec<Option<u8>>` per volume (`None`: discarded, contents unspecified).
//! Also: arbitrary requests never panic the server and, when refused, never
//! reach a volume.

mod support;

use std::collections::BTreeMap;

use proptest::prelude::*;
use rnbd::errno::*;
use rnbd::server::{DiscardLimits, Grant, VolumeInfo};
use rnbd::wire::{OpenRsp, RtrsDirection};
use support::{volume_id, Disks, Harness, TestExports};

const PATHS: [&str; 4] = ["a", "b", "c", "missing"];
const SECTORS: [u64; 3] = [128, 96, 64];

#[derive(Debug, Clone)]
enum Op {
    Open {
        volume: usize,
        mode: u8,
    },
    Close {
        id: u32,
    },
    Read {
        id: u32,
        sector: u64,
        count: u32,
        defer: bool,
    },
    Write {
        id: u32,
        sector: u64,
        count: u32,
        seed: u8,
        fua: bool,
        defer: bool,
    },
    Discard {
        id: u32,
        sector: u64,
        count: u32,
        defer: bool,
    },
    Flush {
        id: u32,
        defer: bool,
    },
    /// Complete the oldest deferred IO.
    Complete,
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0u32..4;
    let sector = 0u64..140;
    let count = 1u32..9;
    prop_oneof![
        (0usize..4, 0u8..3).prop_map(|(volume, mode)| Op::Open { volume, mode }),
        id.clone().prop_map(|id| Op::Close { id }),
        (id.clone(), sector.clone(), count.clone(), any::<bool>()).prop_map(
            |(id, sector, count, defer)| Op::Read {
                id,
                sector,
                count,
                defer
            }
        ),
        (
            id.clone(),
            sector.clone(),
            count.clone(),
            any::<u8>(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(id, sector, count, seed, fua, defer)| Op::Write {
                id,
                sector,
                count,
                seed,
                fua,
                defer
            }),
        (id.clone(), sector, count, any::<bool>()).prop_map(|(id, sector, count, defer)| {
            Op::Discard {
                id,
                sector,
                count,
                defer,
            }
        }),
        (id, any::<bool>()).prop_map(|(id, defer)| Op::Flush { id, defer }),
        Just(Op::Complete),
        Just(Op::Complete),
    ]
}

/// a: RW, discard with 4 KiB granules; b: RW, write-back cache; c: RO.
fn harness() -> Harness {
    let mut exports = TestExports::default();
    let mut a = VolumeInfo::new(volume_id(0), SECTORS[0]);
    a.discard = Some(DiscardLimits {
        max_sectors: 64,
        granularity: 4096,
        alignment: 0,
    });
    let mut b = VolumeInfo::new(volume_id(1), SECTORS[1]);
    b.write_cache = true;
    b.fua = true;
    let c = VolumeInfo::new(volume_id(2), SECTORS[2]);
    exports.add("a", a, Some(Grant::ReadWrite));
    exports.add("b", b, Some(Grant::ReadWrite));
    exports.add("c", c, Some(Grant::ReadOnly));
    let sizes: Vec<u64> = SECTORS.iter().map(|s| s * 512).collect();
    Harness::new(exports, Disks::with_sizes(&sizes))
}

fn io_msg(device_id: u32, sector: u64, rw: u32, bi_size: u32) -> Vec<u8> {
    let mut b = vec![0u8; 32];
    b[0] = 4;
    b[4..8].copy_from_slice(&device_id.to_le_bytes());
    b[8..16].copy_from_slice(&sector.to_le_bytes());
    b[16..20].copy_from_slice(&rw.to_le_bytes());
    b[20..24].copy_from_slice(&bi_size.to_le_bytes());
    b
}

/// A device as the model sees it.
#[derive(Debug, Clone, Copy)]
struct Dev {
    volume: usize,
    writable: bool,
    /// CLOSE received with IO in flight.
    draining: bool,
    in_flight: usize,
}

/// A deferred IO: what it does to (or must read from) the model.
#[derive(Debug)]
enum Pending {
    Read {
        id: u32,
        volume: usize,
        at: usize,
        len: usize,
    },
    Write {
        id: u32,
        volume: usize,
        at: usize,
        data: Vec<u8>,
    },
    Discard {
        id: u32,
        at: usize,
        len: usize,
    },
    Flush {
        id: u32,
    },
}

struct Model {
    devices: BTreeMap<u32, Dev>,
    contents: Vec<Vec<Option<u8>>>,
    pending: std::collections::VecDeque<Pending>,
}

impl Model {
    fn new() -> Model {
        Model {
            devices: BTreeMap::new(),
            contents: SECTORS
                .iter()
                .map(|s| vec![Some(0); (s * 512) as usize])
                .collect(),
            pending: Default::default(),
        }
    }

    /// The open (not draining) device `id`.
    fn open_device(&self, id: u32) -> Option<Dev> {
        self.devices.get(&id).copied().filter(|dev| !dev.draining)
    }

    /// The expected errno of an IO on `id` over `[sector, sector + count)`
    /// (ops the volume supports); also the volume.
    fn io_status(&self, id: u32, sector: u64, count: u32, write: bool) -> (u16, Option<usize>) {
        let Some(dev) = self.open_device(id) else {
            return (ENOTCONN, None);
        };
        if write && !dev.writable {
            return (EPERM, Some(dev.volume));
        }
        if sector + u64::from(count) > SECTORS[dev.volume] {
            return (EINVAL, Some(dev.volume));
        }
        (OK, Some(dev.volume))
    }

    /// Applies an IO (at execution time); returns the expected read data.
    fn execute(&mut self, io: &Pending) -> Option<Vec<Option<u8>>> {
        match io {
            Pending::Read {
                volume, at, len, ..
            } => Some(self.contents[*volume][*at..at + len].to_vec()),
            Pending::Write {
                volume, at, data, ..
            } => {
                for (slot, byte) in self.contents[*volume][*at..].iter_mut().zip(data) {
                    *slot = Some(*byte);
                }
                None
            }
            Pending::Discard { at, len, .. } => {
                self.contents[0][*at..at + len].fill(None);
                None
            }
            Pending::Flush { .. } => None,
        }
    }
}

fn pending_id(io: &Pending) -> u32 {
    match io {
        Pending::Read { id, .. }
        | Pending::Write { id, .. }
        | Pending::Discard { id, .. }
        | Pending::Flush { id } => *id,
    }
}

/// Checks read data against the model (`None` bytes are unspecified).
fn check_read(got: &[u8], want: &[Option<u8>]) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (got, want) in got.iter().zip(want) {
        if let Some(want) = want {
            prop_assert_eq!(got, want);
        }
    }
    Ok(())
}

/// Sends an IO the model expects to succeed with `expected` (or refuse):
/// executes at once, or defers it.
fn submit(
    h: &mut Harness,
    model: &mut Model,
    reply: support::Reply,
    expected: u16,
    io: Pending,
    defer: bool,
) -> Result<(), TestCaseError> {
    if expected != OK {
        prop_assert_eq!(reply.status, Some(expected));
        prop_assert!(reply.submitted.is_none());
        return Ok(());
    }
    if defer {
        prop_assert_eq!(reply.status, None);
        prop_assert_eq!(h.pending.len(), model.pending.len() + 1);
        model.devices.get_mut(&pending_id(&io)).unwrap().in_flight += 1;
        model.pending.push_back(io);
    } else {
        prop_assert_eq!(reply.status, Some(OK));
        if let Some(want) = model.execute(&io) {
            check_read(&reply.data, &want)?;
        }
    }
    Ok(())
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = harness();
    let mut model = Model::new();
    for op in ops {
        match *op {
            Op::Open { volume, mode } => {
                let mut header = vec![0u8; 264];
                header[0] = 2;
                header[4] = mode;
                header[6..6 + PATHS[volume].len()].copy_from_slice(PATHS[volume].as_bytes());
                let reply = h.request(&header, RtrsDirection::Read, 56, &[]);
                let writable = mode != 0;
                let existing = model
                    .devices
                    .iter()
                    .find(|(_, dev)| dev.volume == volume && !dev.draining)
                    .map(|(&id, dev)| (id, dev.writable));
                let held = model.devices.values().any(|dev| dev.volume == volume);
                let expected = if volume == 3 {
                    Err(ENOENT)
                } else if let Some((id, existing_writable)) = existing {
                    if writable && !existing_writable {
                        Err(EPERM)
                    } else {
                        Ok(id)
                    }
                } else if writable && volume == 2 {
                    Err(EACCES)
                } else if held {
                    Err(EEXIST)
                } else {
                    let id = (0u32..).find(|id| !model.devices.contains_key(id)).unwrap();
                    model.devices.insert(
                        id,
                        Dev {
                            volume,
                            writable,
                            draining: false,
                            in_flight: 0,
                        },
                    );
                    Ok(id)
                };
                match expected {
                    Ok(id) => {
                        prop_assert_eq!(reply.status, Some(OK));
                        let rsp = OpenRsp::parse(&reply.data).unwrap();
                        prop_assert_eq!(rsp.device_id, id);
                        prop_assert_eq!(rsp.nsectors, SECTORS[volume]);
                    }
                    Err(errno) => prop_assert_eq!(reply.status, Some(errno)),
                }
            }
            Op::Close { id } => {
                let mut header = vec![5u8, 0, 0, 0];
                header.extend_from_slice(&id.to_le_bytes());
                let reply = h.request(&header, RtrsDirection::Write, 0, &[]);
                match model.open_device(id) {
                    Some(dev) if dev.in_flight > 0 => {
                        prop_assert_eq!(reply.status, None, "deferred");
                        model.devices.get_mut(&id).unwrap().draining = true;
                    }
                    Some(_) => {
                        prop_assert_eq!(reply.status, Some(OK));
                        model.devices.remove(&id);
                    }
                    None => prop_assert_eq!(reply.status, Some(OK)),
                }
            }
            Op::Read {
                id,
                sector,
                count,
                defer,
            } => {
                let len = count * 512;
                h.defer = defer;
                let reply = h.request(
                    &io_msg(id, sector, 0x100, len),
                    RtrsDirection::Read,
                    len as usize,
                    &[],
                );
                let (status, volume) = model.io_status(id, sector, count, false);
                let io = Pending::Read {
                    id,
                    volume: volume.unwrap_or(0),
                    at: (sector * 512) as usize,
                    len: len as usize,
                };
                submit(&mut h, &mut model, reply, status, io, defer)?;
            }
            Op::Write {
                id,
                sector,
                count,
                seed,
                fua,
                defer,
            } => {
                let len = count * 512;
                let data: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
                let rw = if fua { 0x301 } else { 0x001 };
                h.defer = defer;
                let reply = h.request(
                    &io_msg(id, sector, rw, len),
                    RtrsDirection::Write,
                    len as usize,
                    &data,
                );
                let (status, volume) = model.io_status(id, sector, count, true);
                let io = Pending::Write {
                    id,
                    volume: volume.unwrap_or(0),
                    at: (sector * 512) as usize,
                    data,
                };
                submit(&mut h, &mut model, reply, status, io, defer)?;
            }
            Op::Discard {
                id,
                sector,
                count,
                defer,
            } => {
                h.defer = defer;
                let reply = h.request(
                    &io_msg(id, sector, 0x003, count * 512),
                    RtrsDirection::Write,
                    0,
                    &[],
                );
                let expected = match model.open_device(id) {
                    None => ENOTCONN,
                    Some(dev) if dev.volume != 0 => EOPNOTSUPP,
                    Some(_) => model.io_status(id, sector, count, true).0,
                };
                // Discards shorter than a whole 4 KiB granule are answered
                // at once, without reaching the volume.
                let at = (sector * 512) as usize;
                let len = (count * 512) as usize;
                let whole_granule = (at.div_ceil(4096) * 4096) + 4096 <= at + len;
                if expected == OK && !whole_granule {
                    prop_assert_eq!(reply.status, Some(OK));
                    prop_assert!(reply.submitted.is_none());
                } else {
                    let io = Pending::Discard { id, at, len };
                    submit(&mut h, &mut model, reply, expected, io, defer)?;
                }
            }
            Op::Flush { id, defer } => {
                h.defer = defer;
                let reply = h.request(&io_msg(id, u64::MAX, 0x302, 0), RtrsDirection::Read, 0, &[]);
                let expected = match model.open_device(id) {
                    None => ENOTCONN,
                    Some(dev) if dev.volume == 1 => OK,
                    Some(_) => EOPNOTSUPP,
                };
                submit(
                    &mut h,
                    &mut model,
                    reply,
                    expected,
                    Pending::Flush { id },
                    defer,
                )?;
            }
            Op::Complete => {
                let Some(io) = model.pending.pop_front() else {
                    prop_assert!(h.complete_one().is_none());
                    continue;
                };
                let (completion, data) = h.complete_one().unwrap();
                prop_assert_eq!(completion.status, OK);
                if let Some(want) = model.execute(&io) {
                    check_read(&data, &want)?;
                }
                let id = pending_id(&io);
                let dev = model.devices.get_mut(&id).unwrap();
                dev.in_flight -= 1;
                if dev.draining && dev.in_flight == 0 {
                    model.devices.remove(&id);
                    prop_assert_eq!(completion.close_done, Some(7));
                } else {
                    prop_assert_eq!(completion.close_done, None);
                }
            }
        }
        prop_assert_eq!(h.session.devices_in_use(), model.devices.len());
        for volume in 0..3 {
            let writers = model
                .devices
                .values()
                .filter(|dev| dev.volume == volume && dev.writable)
                .count() as u32;
            prop_assert_eq!(h.server.writers(volume_id(volume)), writers);
        }
    }
    // Session end with IO in flight: devices drain, then all is released.
    let busy = model
        .devices
        .values()
        .filter(|dev| dev.in_flight > 0)
        .count();
    prop_assert_eq!(h.server.end_session(&mut h.session), busy);
    while let Some((completion, _)) = h.complete_one() {
        prop_assert_eq!(completion.close_done, None);
    }
    prop_assert!(h.session.is_idle());
    for volume in 0..3 {
        prop_assert_eq!(h.server.writers(volume_id(volume)), 0);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn server_agrees_with_model(ops in prop::collection::vec(op(), 1..80)) {
        run(&ops)?;
    }

    /// Any bytes in any direction with any data length: no panic; a refusal
    /// or an answer, and a refused request reaches no volume.
    #[test]
    fn arbitrary_requests_never_panic(
        requests in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 0..300), any::<bool>(), 0usize..9000, 0u8..6),
            1..40,
        )
    ) {
        let mut h = harness();
        h.defer = false;
        for (mut header, read, data_len, msg_type) in requests {
            // Steer half of them to real message types.
            if header.len() >= 2 && msg_type < 6 {
                header[0] = msg_type;
                header[1] = 0;
            }
            let direction = if read { RtrsDirection::Read } else { RtrsDirection::Write };
            let executed = h.disks.executed.len();
            let reply = h.request(&header, direction, data_len, &[]);
            prop_assert!(reply.status.is_some());
            if reply.refused.is_some() {
                prop_assert_eq!(h.disks.executed.len(), executed);
                prop_assert_ne!(reply.status, Some(OK));
            }
        }
        h.server.end_session(&mut h.session);
        prop_assert!(h.session.is_idle());
    }
}
