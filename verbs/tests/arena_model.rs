//! Model test: random `Arena` operations against a plain `Vec<u8>` model.
//!
//! Every operation's result (success or the exact error) and every byte read
//! must match the model; wrong keys, stale handles, out-of-bounds ranges and
//! missing access rights must be refused, and nothing may panic.

use proptest::prelude::*;
use verbs::memory::Arena;
use verbs::{
    AccessError, AccessFlags, AllocError, KeySource, Lkey, Memory, MemoryHandle, MemoryRegion,
    RegError, Rkey, Sge,
};

const SLOTS: usize = 8;
const POOL: usize = 2048;

struct Keys(u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z >> 32) as u32
    }
}

#[derive(Clone, Debug)]
enum KeyChoice {
    Current(usize),
    Old(usize),
    Raw(u32),
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { len: u32, align_log2: u32 },
    Free(usize),
    FreePartial(usize),
    Register(usize, u8),
    Deregister(usize),
    Rekey(usize),
    Invalidate(KeyChoice),
    Pin(usize),
    Unpin(usize),
    Write(usize, u32, Vec<u8>),
    Read(usize, u32, u32),
    RemoteWrite(KeyChoice, u32, Vec<u8>),
    RemoteRead(KeyChoice, u32, u32),
    Gather([(usize, u32, u32); 2], u32, u32),
    Scatter([(usize, u32, u32); 2], u32, Vec<u8>),
    StaleRead(usize),
}

fn key_choice() -> impl Strategy<Value = KeyChoice> {
    prop_oneof![
        4 => any::<usize>().prop_map(KeyChoice::Current),
        2 => any::<usize>().prop_map(KeyChoice::Old),
        1 => any::<u32>().prop_map(KeyChoice::Raw),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let sge = (any::<usize>(), 0u32..120, 0u32..120);
    let access_bits = prop_oneof![3 => Just(7u8), 2 => Just(3u8), 1 => Just(1u8), 2 => 0u8..8];
    prop_oneof![
        3 => (1u32..400, 0u32..8).prop_map(|(len, align_log2)| Op::Alloc { len, align_log2 }),
        1 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreePartial),
        4 => (any::<usize>(), access_bits).prop_map(|(i, bits)| Op::Register(i, bits)),
        1 => any::<usize>().prop_map(Op::Deregister),
        2 => any::<usize>().prop_map(Op::Rekey),
        2 => key_choice().prop_map(Op::Invalidate),
        1 => any::<usize>().prop_map(Op::Pin),
        1 => any::<usize>().prop_map(Op::Unpin),
        3 => (any::<usize>(), 0u32..200, prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(i, off, data)| Op::Write(i, off, data)),
        3 => (any::<usize>(), 0u32..200, 0u32..64).prop_map(|(i, off, len)| Op::Read(i, off, len)),
        4 => (key_choice(), 0u32..200, prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(k, off, data)| Op::RemoteWrite(k, off, data)),
        3 => (key_choice(), 0u32..200, 0u32..64).prop_map(|(k, off, len)| Op::RemoteRead(k, off, len)),
        2 => ([sge.clone(), sge.clone()], 0u32..100, 0u32..100).prop_map(|(s, off, len)| Op::Gather(s, off, len)),
        2 => ([sge.clone(), sge], 0u32..100, prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(s, off, data)| Op::Scatter(s, off, data)),
        1 => any::<usize>().prop_map(Op::StaleRead),
    ]
}

struct ModelReg {
    region: MemoryRegion,
    remote_valid: bool,
    pins: u32,
}

struct ModelBuf {
    handle: MemoryHandle,
    bytes: Vec<u8>,
    reg: Option<ModelReg>,
}

#[derive(Default)]
struct Model {
    bufs: Vec<ModelBuf>,
    old_rkeys: Vec<Rkey>,
    old_lkeys: Vec<Lkey>,
    freed: Vec<MemoryHandle>,
}

impl Model {
    fn pick(&self, i: usize) -> Option<usize> {
        (!self.bufs.is_empty()).then(|| i % self.bufs.len())
    }

    fn rkey(&self, choice: &KeyChoice) -> Rkey {
        match *choice {
            KeyChoice::Current(i) => match self.pick(i).and_then(|b| self.bufs[b].reg.as_ref()) {
                Some(reg) => reg.region.rkey,
                None => Rkey(i as u32),
            },
            KeyChoice::Old(i) if !self.old_rkeys.is_empty() => {
                self.old_rkeys[i % self.old_rkeys.len()]
            }
            KeyChoice::Old(i) => Rkey(i as u32),
            KeyChoice::Raw(raw) => Rkey(raw),
        }
    }

    /// The buffer whose current, valid rkey is `rkey`.
    fn by_rkey(&self, rkey: Rkey) -> Option<usize> {
        self.bufs.iter().position(|b| {
            b.reg
                .as_ref()
                .is_some_and(|r| r.region.rkey == rkey && r.remote_valid)
        })
    }

    fn by_lkey(&self, lkey: Lkey) -> Option<usize> {
        self.bufs
            .iter()
            .position(|b| b.reg.as_ref().is_some_and(|r| r.region.lkey == lkey))
    }

    fn lkey(&self, i: usize) -> Lkey {
        match self.pick(i).and_then(|b| self.bufs[b].reg.as_ref()) {
            Some(reg) => reg.region.lkey,
            None if !self.old_lkeys.is_empty() => self.old_lkeys[i % self.old_lkeys.len()],
            None => Lkey(i as u32),
        }
    }

    fn remote(
        &self,
        rkey: Rkey,
        offset: u32,
        len: u32,
        need: AccessFlags,
    ) -> Result<usize, AccessError> {
        let b = self.by_rkey(rkey).ok_or(AccessError::InvalidKey)?;
        let reg = self.bufs[b].reg.as_ref().unwrap();
        if !reg.region.access.contains(need) {
            return Err(AccessError::AccessDenied);
        }
        if u64::from(offset) + u64::from(len) > self.bufs[b].bytes.len() as u64 {
            return Err(AccessError::OutOfBounds);
        }
        Ok(b)
    }

    /// The model's byte stream of an SGL, or the error checking it gives.
    fn sgl_stream(
        &self,
        sgl: &[Sge],
        need: AccessFlags,
    ) -> Result<Vec<(usize, u32, u32)>, AccessError> {
        let mut parts = Vec::new();
        for sge in sgl {
            let b = self.by_lkey(sge.lkey).ok_or(AccessError::InvalidKey)?;
            if !self.bufs[b]
                .reg
                .as_ref()
                .unwrap()
                .region
                .access
                .contains(need)
            {
                return Err(AccessError::AccessDenied);
            }
            if u64::from(sge.offset) + u64::from(sge.len) > self.bufs[b].bytes.len() as u64 {
                return Err(AccessError::OutOfBounds);
            }
            parts.push((b, sge.offset, sge.len));
        }
        Ok(parts)
    }
}

fn build_sgl(model: &Model, spec: &[(usize, u32, u32); 2]) -> Vec<Sge> {
    spec.iter()
        .map(|&(i, offset, len)| Sge::new(model.lkey(i), offset, len))
        .collect()
}

fn run(ops: Vec<Op>, seed: u64) {
    let mut arena: Arena<Vec<u8>, SLOTS> = Arena::new(vec![0x5a; POOL]);
    let mut keys = Keys(seed);
    let mut model = Model::default();

    for op in ops {
        match op {
            Op::Alloc { len, align_log2 } => match arena.alloc(len, 1 << align_log2) {
                Ok(handle) => {
                    assert_eq!(handle.len(), len);
                    let mut bytes = vec![0xff; len as usize];
                    arena.read(handle, 0, &mut bytes).unwrap();
                    assert!(bytes.iter().all(|&b| b == 0), "allocation not zeroed");
                    model.bufs.push(ModelBuf {
                        handle,
                        bytes,
                        reg: None,
                    });
                }
                Err(AllocError::TableFull) => assert_eq!(model.bufs.len(), SLOTS),
                Err(AllocError::OutOfMemory) => assert!(model.bufs.len() < SLOTS),
                Err(other) => panic!("unexpected {other:?}"),
            },
            Op::Free(i) | Op::FreePartial(i) => {
                let Some(b) = model.pick(i) else { continue };
                let partial = matches!(op, Op::FreePartial(_)) && model.bufs[b].handle.len() > 1;
                let handle = model.bufs[b].handle;
                if partial {
                    let sub = handle.slice(1, handle.len() - 1).unwrap();
                    assert_eq!(arena.free(sub), Err(RegError::PartialBuffer));
                    continue;
                }
                let pinned = model.bufs[b].reg.as_ref().is_some_and(|r| r.pins > 0);
                if pinned {
                    assert_eq!(arena.free(handle), Err(RegError::Busy));
                } else {
                    arena.free(handle).unwrap();
                    let gone = model.bufs.remove(b);
                    if let Some(reg) = gone.reg {
                        model.old_rkeys.push(reg.region.rkey);
                        model.old_lkeys.push(reg.region.lkey);
                    }
                    model.freed.push(handle);
                }
            }
            Op::Register(i, bits) => {
                let Some(b) = model.pick(i) else { continue };
                let access = AccessFlags::from_bits(bits).unwrap();
                let result = arena.register(model.bufs[b].handle, access, &mut keys);
                if model.bufs[b].reg.is_some() {
                    assert_eq!(result, Err(RegError::AlreadyRegistered));
                } else if !access.is_valid() {
                    assert_eq!(result, Err(RegError::InvalidAccess));
                } else {
                    let region = result.unwrap();
                    assert_eq!(region.handle, model.bufs[b].handle);
                    assert_eq!(region.access, access);
                    assert!(
                        model.by_rkey(region.rkey).is_none()
                            && model.by_lkey(region.lkey).is_none()
                    );
                    model.bufs[b].reg = Some(ModelReg {
                        region,
                        remote_valid: true,
                        pins: 0,
                    });
                }
            }
            Op::Deregister(i) => {
                let lkey = model.lkey(i);
                let result = arena.deregister(lkey);
                match model.by_lkey(lkey) {
                    None => assert_eq!(result, Err(RegError::InvalidKey)),
                    Some(b) if model.bufs[b].reg.as_ref().unwrap().pins > 0 => {
                        assert_eq!(result, Err(RegError::Busy));
                    }
                    Some(b) => {
                        result.unwrap();
                        let reg = model.bufs[b].reg.take().unwrap();
                        model.old_rkeys.push(reg.region.rkey);
                        model.old_lkeys.push(reg.region.lkey);
                    }
                }
            }
            Op::Rekey(i) => {
                let lkey = model.lkey(i);
                let result = arena.rekey(lkey, &mut keys);
                match model.by_lkey(lkey) {
                    None => assert_eq!(result, Err(RegError::InvalidKey)),
                    Some(b) if model.bufs[b].reg.as_ref().unwrap().pins > 0 => {
                        assert_eq!(result, Err(RegError::Busy));
                    }
                    Some(b) => {
                        let fresh = result.unwrap();
                        let reg = model.bufs[b].reg.as_mut().unwrap();
                        assert_ne!(fresh.variant(), reg.region.rkey.variant());
                        model.old_rkeys.push(reg.region.rkey);
                        reg.region.rkey = fresh;
                        reg.remote_valid = true;
                        assert_eq!(arena.region(lkey).unwrap().rkey, fresh);
                    }
                }
            }
            Op::Invalidate(choice) => {
                let rkey = model.rkey(&choice);
                let result = arena.invalidate(rkey);
                match model.by_rkey(rkey) {
                    None => assert_eq!(result, Err(RegError::InvalidKey)),
                    Some(b) => {
                        result.unwrap();
                        model.bufs[b].reg.as_mut().unwrap().remote_valid = false;
                    }
                }
            }
            Op::Pin(i) | Op::Unpin(i) => {
                let lkey = model.lkey(i);
                let pin = matches!(op, Op::Pin(_));
                let result = if pin {
                    arena.pin(lkey)
                } else {
                    arena.unpin(lkey)
                };
                match model.by_lkey(lkey) {
                    None => assert_eq!(result, Err(AccessError::InvalidKey)),
                    Some(b) => {
                        result.unwrap();
                        let reg = model.bufs[b].reg.as_mut().unwrap();
                        reg.pins = if pin {
                            reg.pins + 1
                        } else {
                            reg.pins.saturating_sub(1)
                        };
                        assert_eq!(arena.pin_count(lkey), Ok(reg.pins));
                    }
                }
            }
            Op::Write(i, offset, data) => {
                let Some(b) = model.pick(i) else { continue };
                let result = arena.write(model.bufs[b].handle, offset, &data);
                let end = offset as usize + data.len();
                if end <= model.bufs[b].bytes.len() {
                    result.unwrap();
                    model.bufs[b].bytes[offset as usize..end].copy_from_slice(&data);
                } else {
                    assert_eq!(result, Err(AccessError::OutOfBounds));
                }
            }
            Op::Read(i, offset, len) => {
                let Some(b) = model.pick(i) else { continue };
                let mut out = vec![0; len as usize];
                let result = arena.read(model.bufs[b].handle, offset, &mut out);
                let end = (offset + len) as usize;
                if end <= model.bufs[b].bytes.len() {
                    result.unwrap();
                    assert_eq!(out, model.bufs[b].bytes[offset as usize..end]);
                } else {
                    assert_eq!(result, Err(AccessError::OutOfBounds));
                }
            }
            Op::RemoteWrite(choice, offset, data) => {
                let rkey = model.rkey(&choice);
                let iova_of = |b: usize| model.bufs[b].reg.as_ref().unwrap().region.iova;
                let expected =
                    model.remote(rkey, offset, data.len() as u32, AccessFlags::REMOTE_WRITE);
                // Aim at the chosen buffer's iova when the key is known, else anywhere.
                let va = model
                    .by_rkey(rkey)
                    .map_or(u64::from(offset), |b| iova_of(b) + u64::from(offset));
                let result =
                    arena.resolve_remote(rkey, va, data.len() as u32, AccessFlags::REMOTE_WRITE);
                match expected {
                    Ok(b) => {
                        let handle = result.unwrap();
                        arena.write(handle, 0, &data).unwrap();
                        let start = offset as usize;
                        model.bufs[b].bytes[start..start + data.len()].copy_from_slice(&data);
                    }
                    Err(error) => assert_eq!(result, Err(error)),
                }
            }
            Op::RemoteRead(choice, offset, len) => {
                let rkey = model.rkey(&choice);
                let expected = model.remote(rkey, offset, len, AccessFlags::REMOTE_READ);
                let va = model.by_rkey(rkey).map_or(u64::from(offset), |b| {
                    model.bufs[b].reg.as_ref().unwrap().region.iova + u64::from(offset)
                });
                let result = arena.resolve_remote(rkey, va, len, AccessFlags::REMOTE_READ);
                match expected {
                    Ok(b) => {
                        let mut out = vec![0; len as usize];
                        arena.read(result.unwrap(), 0, &mut out).unwrap();
                        assert_eq!(
                            out,
                            model.bufs[b].bytes[offset as usize..(offset + len) as usize]
                        );
                    }
                    Err(error) => assert_eq!(result, Err(error)),
                }
            }
            Op::Gather(spec, offset, len) => {
                let sgl = build_sgl(&model, &spec);
                let mut out = vec![0; len as usize];
                let result = arena.gather_into(&sgl, offset, &mut out);
                match model.sgl_stream(&sgl, AccessFlags::EMPTY) {
                    Err(error) => assert_eq!(result, Err(error)),
                    Ok(parts) => {
                        let stream: Vec<u8> = parts
                            .iter()
                            .flat_map(|&(b, o, l)| {
                                model.bufs[b].bytes[o as usize..(o + l) as usize].to_vec()
                            })
                            .collect();
                        let end = (offset + len) as usize;
                        if end <= stream.len() {
                            result.unwrap();
                            assert_eq!(out, stream[offset as usize..end]);
                            let one_pass: Vec<u8> =
                                arena.sgl_pieces(&sgl, offset, len).unwrap().concat();
                            assert_eq!(one_pass, out);
                        } else {
                            assert_eq!(result, Err(AccessError::OutOfBounds));
                            assert_eq!(
                                arena.sgl_pieces(&sgl, offset, len).map(|p| p.len()),
                                Err(AccessError::OutOfBounds)
                            );
                        }
                    }
                }
            }
            Op::Scatter(spec, offset, data) => {
                let sgl = build_sgl(&model, &spec);
                let result = arena.scatter_from(&sgl, offset, &data);
                match model.sgl_stream(&sgl, AccessFlags::LOCAL_WRITE) {
                    Err(error) => assert_eq!(result, Err(error)),
                    Ok(parts) => {
                        let total: u32 = parts.iter().map(|p| p.2).sum();
                        if offset as usize + data.len() > total as usize {
                            assert_eq!(result, Err(AccessError::OutOfBounds));
                            continue;
                        }
                        result.unwrap();
                        let mut position = 0u32;
                        for (b, o, l) in parts {
                            for k in 0..l {
                                let stream_at = position + k;
                                if stream_at >= offset
                                    && ((stream_at - offset) as usize) < data.len()
                                {
                                    model.bufs[b].bytes[(o + k) as usize] =
                                        data[(stream_at - offset) as usize];
                                }
                            }
                            position += l;
                        }
                    }
                }
            }
            Op::StaleRead(i) => {
                if model.freed.is_empty() {
                    continue;
                }
                let handle = model.freed[i % model.freed.len()];
                assert_eq!(
                    arena.read(handle, 0, &mut [0; 1]),
                    Err(AccessError::StaleHandle)
                );
                assert_eq!(
                    arena.register(handle, AccessFlags::EMPTY, &mut keys),
                    Err(RegError::StaleHandle)
                );
            }
        }

        // Invariants after every step: contents agree, buffers are disjoint.
        for buf in &model.bufs {
            let mut bytes = vec![0; buf.bytes.len()];
            arena.read(buf.handle, 0, &mut bytes).unwrap();
            assert_eq!(bytes, buf.bytes);
        }
        let mut spans: Vec<(u64, u64)> = model
            .bufs
            .iter()
            .filter_map(|b| {
                b.reg
                    .as_ref()
                    .map(|r| (r.region.iova, r.region.iova + u64::from(r.region.len())))
            })
            .collect();
        spans.sort_unstable();
        assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "regions overlap: {spans:?}"
        );
        assert!(spans.last().is_none_or(|s| s.1 <= POOL as u64));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arena_matches_model(ops in prop::collection::vec(op(), 1..120), seed in any::<u64>()) {
        run(ops, seed);
    }
}
