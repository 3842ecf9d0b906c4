//! The model test: random batches of concurrent writes, reads, discards,
//! write-zeroes and flushes across three thin volumes that overcommit one
//! pool, checked against a model of what each 4 KiB block may hold — now,
//! and after a crash. Crashes come at random points (mid-batch included):
//! the pool keeps its flushed and FUA writes and a random subset of the
//! rest, the pool is reopened, its check must reclaim nothing and find no
//! extent mapped twice, and every block must read a value the model
//! allows (so no acknowledged, flushed or FUA write is lost).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use common::{Buffers, CrashDisk, Disk};
use hal::block::{BlockDevice, IoError, Op, Request};
use proptest::prelude::*;
use thin::format::{BLOCK, DEFAULT_EXTENT};
use thin::{Pool, PoolConfig, ThinVolume};

const VOLUMES: usize = 3;
/// Each volume: 4 extents; the pool: 6 (12 promised on 6).
const VOLUME_EXTENTS: u64 = 4;
const POOL_EXTENTS: u64 = 6;
const EXTENT: u64 = DEFAULT_EXTENT as u64;
const BLOCKS_PER_EXTENT: u64 = EXTENT / BLOCK as u64;
const VOLUME_BLOCKS: u64 = VOLUME_EXTENTS * BLOCKS_PER_EXTENT;
/// Longest read or write, in blocks (the pool's max transfer).
const MAX_IO_BLOCKS: u64 = 64;

/// Totals over all cases, printed after each (`--nocapture` shows them).
static CASES: AtomicU64 = AtomicU64::new(0);
static CRASHES: AtomicU64 = AtomicU64::new(0);
static CHECKED_AFTER_CRASH: AtomicU64 = AtomicU64::new(0);
static ENOSPC: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug)]
enum Action {
    Write { fua: bool },
    Read,
    Discard,
    WriteZeroes,
}

#[derive(Clone, Debug)]
struct Step {
    volume: usize,
    action: Action,
    /// Block offset, and length in blocks (for discard/write-zeroes with
    /// `aligned`, in extents).
    block: u64,
    blocks: u64,
    aligned: bool,
}

#[derive(Clone, Debug)]
struct Batch {
    steps: Vec<Step>,
    /// Flush one volume after the batch.
    flush: Option<usize>,
    /// Crash after this many polls of the batch (before it finishes if
    /// small), with this seed for what the pool keeps.
    crash: Option<(u8, u64)>,
}

fn step() -> impl Strategy<Value = Step> {
    let action = prop_oneof![
        4 => any::<bool>().prop_map(|fua| Action::Write { fua }),
        2 => Just(Action::Read),
        1 => Just(Action::Discard),
        1 => Just(Action::WriteZeroes),
    ];
    (
        0..VOLUMES,
        action,
        0..VOLUME_BLOCKS,
        1..=MAX_IO_BLOCKS,
        any::<bool>(),
    )
        .prop_map(|(volume, action, block, blocks, aligned)| Step {
            volume,
            action,
            block,
            blocks,
            aligned,
        })
}

fn batch() -> impl Strategy<Value = Batch> {
    (
        prop::collection::vec(step(), 1..6),
        prop::option::weighted(0.2, 0..VOLUMES),
        prop::option::weighted(0.12, (0u8..6, any::<u64>())),
    )
        .prop_map(|(steps, flush, crash)| Batch {
            steps,
            flush,
            crash,
        })
}

/// A request of a batch: volume, tag, write id, op, first block, blocks.
type Submitted = (usize, u64, u32, Op<usize>, u64, u64);

/// What a block may read: `now` without a crash, `crash` after one.
/// Values: 0 for zeroes, else the id of the write that wrote it.
#[derive(Clone, Debug)]
struct Cell {
    now: BTreeSet<u32>,
    crash: BTreeSet<u32>,
}

impl Default for Cell {
    fn default() -> Self {
        Self {
            now: [0].into(),
            crash: [0].into(),
        }
    }
}

/// A block's bytes for write `id` at volume block `block`.
fn pattern(id: u32, block: u64, out: &mut [u8]) {
    out.fill(id as u8 ^ 0x5a);
    out[..4].copy_from_slice(&id.to_le_bytes());
    out[4..12].copy_from_slice(&block.to_le_bytes());
}

/// The value a block holds, or why it is garbage.
fn decode(block: u64, bytes: &[u8]) -> Result<u32, String> {
    if bytes.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let id = u32::from_le_bytes(bytes[..4].try_into().unwrap());
    let mut expected = vec![0; bytes.len()];
    pattern(id, block, &mut expected);
    if expected == bytes {
        Ok(id)
    } else {
        Err(format!(
            "block {block}: neither zeroes nor a write's pattern"
        ))
    }
}

struct World {
    pool: Pool<Disk, usize>,
    volumes: Vec<ThinVolume<Disk, usize>>,
    model: Vec<Vec<Cell>>,
    buffers: Buffers,
    next_id: u32,
    crashes: u32,
    /// The pool device's queue depth.
    depth: u32,
}

/// The pool device's queue depth for a case: 3 for even seeds (requests
/// and map writes wait for room), 64 otherwise.
fn queue_depth(seed: u64) -> u32 {
    if seed % 2 == 0 {
        3
    } else {
        64
    }
}

fn open(
    image: Vec<u8>,
    seed: u64,
    depth: u32,
) -> (
    Pool<Disk, usize>,
    Vec<ThinVolume<Disk, usize>>,
    thin::OpenReport,
) {
    let (pool, report) = Pool::open(
        CrashDisk::from_image(image, seed).with_queue_depth(depth),
        &PoolConfig::default(),
    )
    .unwrap();
    let volumes = (0..VOLUMES)
        .map(|v| {
            pool.volume(&format!("vol{v}"), VOLUME_EXTENTS * EXTENT, 16)
                .unwrap()
        })
        .collect();
    (pool, volumes, report)
}

impl World {
    fn new(seed: u64) -> Self {
        let image = vec![0; ((POOL_EXTENTS + 1) * EXTENT) as usize];
        let depth = queue_depth(seed);
        let (pool, volumes, report) = open(image, seed, depth);
        assert_eq!(report.extents as u64, POOL_EXTENTS);
        Self {
            depth,
            pool,
            volumes,
            model: vec![vec![Cell::default(); VOLUME_BLOCKS as usize]; VOLUMES],
            // One buffer per step of a batch, one for verification.
            buffers: Buffers(vec![vec![0; (MAX_IO_BLOCKS as usize) * BLOCK]; 7]),
            next_id: 1,
            crashes: 0,
        }
    }

    /// Polls every volume once; completions by (volume, tag).
    fn poll_all(&mut self, done: &mut HashMap<(usize, u64), Result<(), IoError>>) {
        for (index, volume) in self.volumes.iter_mut().enumerate() {
            volume.poll(0, &mut self.buffers, 64, &mut |c| {
                done.insert((index, c.tag), c.result);
            });
        }
    }

    fn mapped(&self, volume: usize) -> BTreeSet<u32> {
        let mut set = BTreeSet::new();
        self.volumes[volume].extents(|v, _| {
            set.insert(v);
        });
        set
    }

    fn run(&mut self, batch: &Batch) -> Result<(), TestCaseError> {
        // Steps on disjoint extents only: overlapping in-flight requests
        // have no defined outcome.
        let mut taken: BTreeSet<(usize, u64)> = BTreeSet::new();
        let mut ops = Vec::new();
        for step in &batch.steps {
            let (block, blocks) = match step.action {
                Action::Discard | Action::WriteZeroes if step.aligned => {
                    let first = step.block / BLOCKS_PER_EXTENT * BLOCKS_PER_EXTENT;
                    let count = (step.blocks % 2 + 1) * BLOCKS_PER_EXTENT;
                    (first, count.min(VOLUME_BLOCKS - first))
                }
                _ => (step.block, step.blocks.min(VOLUME_BLOCKS - step.block)),
            };
            let extents: Vec<(usize, u64)> = (block / BLOCKS_PER_EXTENT
                ..=(block + blocks - 1) / BLOCKS_PER_EXTENT)
                .map(|e| (step.volume, e))
                .collect();
            if extents.iter().any(|e| taken.contains(e)) {
                continue;
            }
            taken.extend(extents);
            ops.push((step.clone(), block, blocks));
        }
        let free_before = self.pool.free_extents();
        let mapped_before: Vec<BTreeSet<u32>> = (0..VOLUMES).map(|v| self.mapped(v)).collect();
        let mut needed = 0;
        let mut frees = false;
        let mut submitted = Vec::new();
        for (index, (step, block, blocks)) in ops.iter().enumerate() {
            let offset = block * BLOCK as u64;
            let len = (blocks * BLOCK as u64) as u32;
            let id = self.next_id;
            self.next_id += 1;
            let op = match step.action {
                Action::Write { fua } => {
                    for i in 0..*blocks {
                        let at = i as usize * BLOCK;
                        pattern(id, block + i, &mut self.buffers.0[index][at..at + BLOCK]);
                    }
                    needed += (block / BLOCKS_PER_EXTENT..=(block + blocks - 1) / BLOCKS_PER_EXTENT)
                        .filter(|e| !mapped_before[step.volume].contains(&(*e as u32)))
                        .count() as u32;
                    Op::Write {
                        offset,
                        len,
                        buffer: index,
                        fua,
                    }
                }
                Action::Read => Op::Read {
                    offset,
                    len,
                    buffer: index,
                },
                Action::Discard => {
                    frees = true;
                    Op::Discard { offset, len }
                }
                Action::WriteZeroes => {
                    frees = true;
                    Op::WriteZeroes { offset, len }
                }
            };
            let tag = index as u64;
            self.volumes[step.volume]
                .submit(Request { tag, op }, &mut self.buffers)
                .map_err(|e| TestCaseError::fail(format!("submit {op:?}: {e}")))?;
            submitted.push((step.volume, tag, id, op, *block, *blocks));
        }
        let mut done = HashMap::new();
        let mut polls = 0;
        while done.len() < submitted.len() {
            if let Some((at, seed)) = batch.crash {
                if polls >= u32::from(at) {
                    return self.crash(&submitted, &done, seed);
                }
            }
            self.poll_all(&mut done);
            polls += 1;
            prop_assert!(polls < 100_000, "batch never completed");
        }
        for &(volume, tag, id, op, block, blocks) in &submitted {
            let result = done[&(volume, tag)];
            let cells = &mut self.model[volume][block as usize..(block + blocks) as usize];
            match (op, result) {
                (Op::Read { buffer, .. }, Ok(())) => {
                    for (i, cell) in cells.iter_mut().enumerate() {
                        let bytes = &self.buffers.0[buffer][i * BLOCK..(i + 1) * BLOCK];
                        let value = decode(block + i as u64, bytes).map_err(TestCaseError::fail)?;
                        prop_assert!(
                            cell.now.contains(&value),
                            "volume {volume} block {}: read {value}, model {:?}",
                            block + i as u64,
                            cell.now
                        );
                        cell.now = [value].into();
                    }
                }
                (Op::Write { fua, .. }, Ok(())) => {
                    for cell in cells {
                        cell.now = [id].into();
                        if fua {
                            cell.crash = [id].into();
                        } else {
                            cell.crash.insert(id);
                        }
                    }
                }
                (Op::Write { .. }, Err(error)) => {
                    prop_assert_eq!(error.errno(), 28, "only ENOSPC may fail a write");
                    ENOSPC.fetch_add(1, Relaxed);
                    let needed_new = (block / BLOCKS_PER_EXTENT
                        ..=(block + blocks - 1) / BLOCKS_PER_EXTENT)
                        .any(|e| !mapped_before[volume].contains(&(e as u32)));
                    prop_assert!(needed_new, "ENOSPC for a write into allocated extents");
                    prop_assert!(
                        needed > free_before,
                        "ENOSPC with {free_before} free extents for {needed} needed"
                    );
                    for cell in cells {
                        cell.now.insert(id);
                        cell.crash.insert(id);
                    }
                }
                (Op::Discard { .. } | Op::WriteZeroes { .. }, Ok(())) => {
                    for cell in cells {
                        cell.now = [0].into();
                        cell.crash.insert(0);
                    }
                }
                (op, Err(error)) => {
                    return Err(TestCaseError::fail(format!("{op:?} failed: {error}")));
                }
                (Op::Flush, Ok(())) => {}
            }
        }
        if !frees && needed <= free_before {
            prop_assert_eq!(self.pool.free_extents(), free_before - needed);
        }
        self.check_extents()?;
        if let Some(volume) = batch.flush {
            let flush = Request {
                tag: 99,
                op: Op::Flush,
            };
            self.volumes[volume]
                .submit(flush, &mut self.buffers)
                .unwrap();
            let mut done = HashMap::new();
            while done.is_empty() {
                self.poll_all(&mut done);
            }
            prop_assert_eq!(done[&(volume, 99)], Ok(()));
            for cell in &mut self.model[volume] {
                cell.crash = cell.now.clone();
            }
        }
        Ok(())
    }

    /// No physical extent mapped twice; allocated + free = all.
    fn check_extents(&self) -> Result<(), TestCaseError> {
        let mut physical = BTreeSet::new();
        let mut count = 0;
        for volume in &self.volumes {
            volume.extents(|_, p| {
                physical.insert(p);
                count += 1;
            });
        }
        prop_assert_eq!(physical.len(), count, "a physical extent mapped twice");
        prop_assert_eq!(
            count as u32 + self.pool.free_extents(),
            self.pool.extent_count()
        );
        Ok(())
    }

    fn crash(
        &mut self,
        submitted: &[Submitted],
        done: &HashMap<(usize, u64), Result<(), IoError>>,
        seed: u64,
    ) -> Result<(), TestCaseError> {
        // What a block may hold after the crash: finished requests count
        // as they finished, unfinished ones may or may not have landed.
        for &(volume, tag, id, op, block, blocks) in submitted {
            let finished = done.get(&(volume, tag));
            let cells = &mut self.model[volume][block as usize..(block + blocks) as usize];
            for cell in cells {
                match (op, finished) {
                    (Op::Write { fua: true, .. }, Some(Ok(()))) => cell.crash = [id].into(),
                    (Op::Write { .. }, _) => {
                        cell.crash.insert(id);
                    }
                    (Op::Discard { .. } | Op::WriteZeroes { .. }, _) => {
                        cell.crash.insert(0);
                    }
                    _ => {}
                }
            }
        }
        let image = self.pool.with_device(|d| d.crash(seed));
        self.volumes.clear();
        let (pool, volumes, report) = open(image, seed ^ 0x9e37, self.depth);
        self.crashes += 1;
        CRASHES.fetch_add(1, Relaxed);
        prop_assert_eq!(
            report.reclaimed,
            0,
            "the map never names an unfinished allocation"
        );
        self.pool = pool;
        self.volumes = volumes;
        self.check_extents()?;
        self.verify(true)
    }

    /// Reads every block of every volume and checks it against the model
    /// (`crash`: the after-crash sets); what is read becomes certain.
    fn verify(&mut self, crashed: bool) -> Result<(), TestCaseError> {
        let scratch = 6;
        for volume in 0..VOLUMES {
            let mut block = 0;
            while block < VOLUME_BLOCKS {
                let op = Op::Read {
                    offset: block * BLOCK as u64,
                    len: (MAX_IO_BLOCKS as usize * BLOCK) as u32,
                    buffer: scratch,
                };
                common::run(&mut self.volumes[volume], op, &mut self.buffers)
                    .map_err(|e| TestCaseError::fail(format!("verify read: {e}")))?;
                for i in 0..MAX_IO_BLOCKS {
                    let at = i as usize * BLOCK;
                    let bytes = &self.buffers.0[scratch][at..at + BLOCK];
                    let value = decode(block + i, bytes).map_err(TestCaseError::fail)?;
                    let cell = &mut self.model[volume][(block + i) as usize];
                    let allowed = if crashed { &cell.crash } else { &cell.now };
                    prop_assert!(
                        allowed.contains(&value),
                        "volume {volume} block {} after {} crashes: read {value}, allowed {allowed:?}",
                        block + i,
                        self.crashes
                    );
                    cell.now = [value].into();
                    if crashed {
                        if value != 0 {
                            CHECKED_AFTER_CRASH.fetch_add(1, Relaxed);
                        }
                        cell.crash = [value].into();
                    }
                }
                block += MAX_IO_BLOCKS;
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn thin_volumes_match_the_model(
        seed in any::<u64>(),
        batches in prop::collection::vec(batch(), 1..40),
    ) {
        let mut world = World::new(seed);
        for batch in &batches {
            world.run(batch)?;
        }
        world.verify(false)?;
        // And a last crash after everything settled: only unflushed
        // writes may go.
        world.crash(&[], &HashMap::new(), seed)?;
        eprintln!(
            "model: {} cases, {} crashes, {} written blocks checked after a crash, {} ENOSPC",
            CASES.fetch_add(1, Relaxed) + 1,
            CRASHES.load(Relaxed),
            CHECKED_AFTER_CRASH.load(Relaxed),
            ENOSPC.load(Relaxed),
        );
    }
}
