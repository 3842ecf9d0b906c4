//! The crash check of thin volumes (docs/THIN.md §5), shared by the hosted
//! target's test (`initiator/tests/thin_crash.rs`, SIGKILL of
//! `brick-target`) and the image's (`cargo xtask test`'s `image thin`
//! cases, SIGKILL of QEMU; driver `initiator/examples/thin_crash.rs`).
//!
//! [`run`] connects to a [`CrashTarget`], keeps concurrent writes and
//! discards (whole extents and partial ones) in flight on its thin
//! volumes, kills the target at a random moment, restarts it on the same
//! pool and reads every block of every volume back: a block must hold the
//! last acknowledged write or discard, or what an unacknowledged one left.
//! Each block's pattern names its write, volume and block, so an extent
//! mapped twice (two volumes, or two places of one) reads as a foreign
//! pattern and fails the check; and every extent that holds data must be
//! among the pool's allocated ones. The pool's check at start reports the
//! extents it reclaimed; [`run`] sums them.
//!
//! [`write_discard_read`] is the plain case: a pattern into some extents,
//! one discarded, read back.

use std::time::{Duration, Instant};

use crate::hosted::{Session, Volume};
use crate::IoKind;

/// Bytes of a checked block.
pub const BLOCK: u64 = 4096;
/// The pools' extent.
pub const EXTENT: u64 = 2 << 20;

/// xorshift64.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A block's bytes for write `id` at block `block` of volume `volume`.
pub fn fill(id: u32, volume: usize, block: usize, out: &mut [u8]) {
    out.fill(id as u8 ^ 0xa5);
    out[..4].copy_from_slice(&id.to_le_bytes());
    out[4..8].copy_from_slice(&(volume as u32).to_le_bytes());
    out[8..16].copy_from_slice(&(block as u64).to_le_bytes());
}

/// The write id a block holds (0: zeroes), or why it is garbage.
///
/// # Errors
/// The block is neither zeroes nor the pattern of a write to this block
/// of this volume.
pub fn decode(volume: usize, block: usize, bytes: &[u8]) -> Result<u32, String> {
    if bytes.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let mut id = [0u8; 4];
    id.copy_from_slice(&bytes[..4]);
    let id = u32::from_le_bytes(id);
    let mut expected = vec![0; bytes.len()];
    fill(id, volume, block, &mut expected);
    if expected == bytes {
        Ok(id)
    } else {
        let mut owner = [0u8; 4];
        owner.copy_from_slice(&bytes[4..8]);
        Err(format!(
            "volume {volume} block {block}: neither zeroes nor a write's pattern for it (first \
             bytes say write {id}, volume {})",
            u32::from_le_bytes(owner)
        ))
    }
}

/// A target the check kills and restarts.
pub trait CrashTarget {
    /// Starts the target on the same pool and returns once it serves.
    ///
    /// # Errors
    /// It did not come up.
    fn start(&mut self) -> Result<(), String>;
    /// Kills it at once (SIGKILL), requests in flight.
    fn kill(&mut self);
    /// `(allocated, reclaimed)` from the pool's open report of the last
    /// start ([`pool_report`] reads the line).
    ///
    /// # Errors
    /// No report.
    fn pool_report(&self) -> Result<(u64, u64), String>;
}

/// `(allocated, reclaimed)` from the report a pool logs when it opens
/// (`pool pool0: 31 extents, 12 allocated, 0 reclaimed by the check`),
/// found in `lines` for pool `pool`.
pub fn pool_report<'a>(lines: impl IntoIterator<Item = &'a str>, pool: &str) -> Option<(u64, u64)> {
    let marker = format!("pool {pool}: ");
    let line = lines.into_iter().find(|l| l.contains(&marker))?;
    let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    let number = |after: &str| -> Option<u64> {
        let at = words.iter().position(|w| *w == after)?;
        words.get(at.checked_sub(1)?)?.parse().ok()
    };
    Some((number("allocated")?, number("reclaimed")?))
}

/// How [`run`] runs.
#[derive(Clone, Debug)]
pub struct CrashConfig {
    /// Bytes of every volume (a multiple of [`EXTENT`]).
    pub volume_bytes: u64,
    /// Kills (the target is started `runs + 1` times).
    pub runs: usize,
    /// Requests kept in flight.
    pub queue_depth: usize,
    /// The load runs this long at least before the kill...
    pub min_load: Duration,
    /// ... plus a random part of this.
    pub random_load: Duration,
    /// Most blocks of one write.
    pub max_write_blocks: usize,
    /// The seed.
    pub seed: u64,
}

/// What [`run`] checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashSummary {
    /// Kills.
    pub runs: usize,
    /// Writes acknowledged before the kills.
    pub acked_writes: u64,
    /// Blocks holding an acknowledged write, checked after restarts.
    pub checked_blocks: u64,
    /// Extents the pool's check reclaimed, over all restarts.
    pub reclaimed: u64,
    /// Writes that failed with ENOSPC (the pool overcommitted).
    pub enospc: u64,
    /// Requests in flight at the kills, summed.
    pub in_flight_at_kills: u64,
}

impl std::fmt::Display for CrashSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} kills, {} writes acknowledged, {} written blocks checked after restarts, {} \
             extents reclaimed, {} ENOSPC, {} requests in flight at the kills",
            self.runs,
            self.acked_writes,
            self.checked_blocks,
            self.reclaimed,
            self.enospc,
            self.in_flight_at_kills
        )
    }
}

/// What a block may hold: the last acknowledged value, plus values of
/// requests that had not been acknowledged (in flight at the kill, or
/// failed).
#[derive(Clone, Default)]
struct Cell {
    acked: u32,
    maybe: Vec<u32>,
    busy: bool,
}

struct Op {
    volume: usize,
    kind: IoKind,
    first: usize,
    blocks: usize,
    id: u32,
}

/// The model of every volume's blocks.
struct Model {
    cells: Vec<Vec<Cell>>,
    next_id: u32,
}

impl Model {
    /// Reads every block back and checks it; what is read becomes the
    /// acknowledged value. Returns (written blocks checked, extents
    /// holding data).
    fn verify(&mut self, volumes: &[Volume], run: usize) -> Result<(u64, u64), String> {
        let mut checked = 0;
        let mut extents = 0;
        let mut buffer = vec![0u8; EXTENT as usize];
        for (v, volume) in volumes.iter().enumerate() {
            let blocks = self.cells[v].len() as u64;
            for extent in 0..blocks * BLOCK / EXTENT {
                volume
                    .read(extent * EXTENT, &mut buffer)
                    .map_err(|e| format!("run {run}: read volume {v} extent {extent}: {e}"))?;
                let mut data = false;
                for i in 0..(EXTENT / BLOCK) as usize {
                    let block = (extent * EXTENT / BLOCK) as usize + i;
                    let bytes = &buffer[i * BLOCK as usize..(i + 1) * BLOCK as usize];
                    let value = decode(v, block, bytes).map_err(|e| format!("run {run}: {e}"))?;
                    let cell = &mut self.cells[v][block];
                    if value != cell.acked && !cell.maybe.contains(&value) {
                        return Err(format!(
                            "run {run}: volume {v} block {block} holds write {value}; \
                             acknowledged {}, unacknowledged {:?}",
                            cell.acked, cell.maybe
                        ));
                    }
                    if cell.acked != 0 {
                        checked += 1;
                    }
                    data |= value != 0;
                    *cell = Cell {
                        acked: value,
                        ..Cell::default()
                    };
                }
                extents += u64::from(data);
            }
        }
        Ok((checked, extents))
    }

    /// Keeps `config.queue_depth` writes and discards in flight until
    /// `until`; returns how many are in flight then.
    fn load(
        &mut self,
        session: &Session,
        volumes: &[Volume],
        rng: &mut Rng,
        config: &CrashConfig,
        until: Instant,
        summary: &mut CrashSummary,
    ) -> Result<usize, String> {
        let volume_blocks = (config.volume_bytes / BLOCK) as usize;
        let extent_blocks = (EXTENT / BLOCK) as usize;
        let max_blocks = config.max_write_blocks.clamp(1, 64);
        let mut data = vec![0u8; 64 * BLOCK as usize];
        let mut in_flight: Vec<Option<Op>> = (0..config.queue_depth).map(|_| None).collect();
        while Instant::now() < until {
            for (tag, slot) in in_flight.iter_mut().enumerate() {
                if slot.is_some() {
                    continue;
                }
                let volume = rng.below(volumes.len() as u64) as usize;
                let (kind, first, blocks) = match rng.below(10) {
                    0 => {
                        let extent = rng.below((volume_blocks / extent_blocks) as u64) as usize;
                        (IoKind::Discard, extent * extent_blocks, extent_blocks)
                    }
                    1 | 2 => {
                        let blocks = 1 + rng.below(64) as usize;
                        (
                            IoKind::Discard,
                            rng.below((volume_blocks - blocks) as u64) as usize,
                            blocks,
                        )
                    }
                    _ => {
                        let blocks = 1 + rng.below(max_blocks as u64) as usize;
                        (
                            IoKind::Write,
                            rng.below((volume_blocks - blocks) as u64) as usize,
                            blocks,
                        )
                    }
                };
                let cells = &mut self.cells[volume][first..first + blocks];
                if cells.iter().any(|c| c.busy) {
                    continue;
                }
                let id = if kind == IoKind::Write {
                    self.next_id += 1;
                    self.next_id
                } else {
                    0
                };
                let offset = first as u64 * BLOCK;
                let len = (blocks as u64 * BLOCK) as u32;
                let submitted = if kind == IoKind::Write {
                    for i in 0..blocks {
                        let at = i * BLOCK as usize;
                        fill(id, volume, first + i, &mut data[at..at + BLOCK as usize]);
                    }
                    volumes[volume].submit_write(tag as u64, offset, &data[..len as usize], false)
                } else {
                    volumes[volume].submit_discard(tag as u64, offset, len)
                };
                submitted.map_err(|e| format!("submit: {e}"))?;
                for cell in cells.iter_mut() {
                    cell.busy = true;
                    cell.maybe.push(id);
                }
                *slot = Some(Op {
                    volume,
                    kind,
                    first,
                    blocks,
                    id,
                });
            }
            let mut failure = None;
            session
                .reap(config.queue_depth, Duration::from_millis(5), |done, _| {
                    let Some(op) = in_flight.get_mut(done.tag as usize).and_then(Option::take)
                    else {
                        failure = Some(format!("a completion for tag {} not in flight", done.tag));
                        return;
                    };
                    let cells = &mut self.cells[op.volume][op.first..op.first + op.blocks];
                    for cell in cells.iter_mut() {
                        cell.busy = false;
                    }
                    match &done.result {
                        Ok(()) => {
                            if op.kind == IoKind::Write {
                                summary.acked_writes += 1;
                            }
                            for cell in cells {
                                cell.acked = op.id;
                                cell.maybe.clear();
                            }
                        }
                        // Only a write that needs an extent of a full pool
                        // may fail; what it wrote may stay.
                        Err(error)
                            if op.kind == IoKind::Write
                                && error.to_string().contains("errno 28") =>
                        {
                            summary.enospc += 1;
                        }
                        Err(error) => {
                            failure = Some(format!("{:?} failed: {error}", op.kind));
                        }
                    }
                })
                .map_err(|e| format!("reap: {e}"))?;
            if let Some(failure) = failure {
                return Err(failure);
            }
        }
        Ok(in_flight.iter().filter(|op| op.is_some()).count())
    }
}

/// Runs the crash check (module docs) against `target`, whose thin
/// volumes `connect` opens (in the same order every time, all of
/// `config.volume_bytes`); `note` gets a line per kill.
///
/// # Errors
/// The first block that holds what it may not, an extent count that
/// disagrees with the pool's report, or a target that did not come up.
pub fn run(
    target: &mut impl CrashTarget,
    mut connect: impl FnMut() -> Result<(Session, Vec<Volume>), String>,
    config: &CrashConfig,
    mut note: impl FnMut(&str),
) -> Result<CrashSummary, String> {
    let mut rng = Rng(config.seed | 1);
    let mut model: Option<Model> = None;
    let mut summary = CrashSummary::default();
    for run in 0..=config.runs {
        target.start()?;
        let (allocated, reclaimed) = target.pool_report()?;
        summary.reclaimed += reclaimed;
        let (session, volumes) = connect()?;
        if let Some(volume) = volumes.iter().find(|v| v.size() != config.volume_bytes) {
            return Err(format!(
                "a volume of {} bytes; the check expects {}",
                volume.size(),
                config.volume_bytes
            ));
        }
        let model = model.get_or_insert_with(|| Model {
            cells: vec![
                vec![Cell::default(); (config.volume_bytes / BLOCK) as usize];
                volumes.len()
            ],
            next_id: 1,
        });
        let (checked, extents) = model.verify(&volumes, run)?;
        summary.checked_blocks += checked;
        // Every extent holding data is allocated (an extent read back as
        // zeroes may still be: written with zeroes, or its discard not
        // acknowledged).
        if allocated < extents {
            return Err(format!(
                "run {run}: the pool reports {allocated} extents allocated, {extents} hold data"
            ));
        }
        if run == config.runs {
            break;
        }
        let random = config.random_load.as_millis().max(1) as u64;
        let until = Instant::now() + config.min_load + Duration::from_millis(rng.below(random));
        let busy = model.load(&session, &volumes, &mut rng, config, until, &mut summary)?;
        target.kill();
        summary.runs += 1;
        summary.in_flight_at_kills += busy as u64;
        note(&format!(
            "run {run}: killed with {busy} requests in flight ({} writes acknowledged so far; \
             the check at this start reclaimed {reclaimed})",
            summary.acked_writes
        ));
        drop(volumes);
        drop(session);
    }
    if summary.acked_writes == 0 || summary.checked_blocks == 0 {
        return Err(format!("nothing was checked: {summary}"));
    }
    Ok(summary)
}

/// Writes a pattern into extents 0, 1 and 3 of `volume` (of at least four
/// extents; extent 3 only in its second half), discards extent 1, and
/// reads the first four extents back: extent 0 and the second half of 3
/// hold the pattern, extent 1 (discarded), 2 (never written) and the first
/// half of 3 read zeroes. `index` is the volume's, for the pattern.
///
/// # Errors
/// The IO that failed, or the first block that holds something else.
pub fn write_discard_read(volume: &Volume, index: usize) -> Result<String, String> {
    let blocks = (EXTENT / BLOCK) as usize;
    let mut data = vec![0u8; EXTENT as usize];
    for extent in [0usize, 1, 3] {
        for i in 0..blocks {
            let block = extent * blocks + i;
            fill(
                7,
                index,
                block,
                &mut data[i * BLOCK as usize..(i + 1) * BLOCK as usize],
            );
        }
        let (skip, len) = if extent == 3 {
            (EXTENT / 2, EXTENT / 2)
        } else {
            (0, EXTENT)
        };
        volume
            .write(
                extent as u64 * EXTENT + skip,
                &data[skip as usize..(skip + len) as usize],
                false,
            )
            .map_err(|e| format!("write extent {extent}: {e}"))?;
    }
    volume
        .discard(EXTENT, EXTENT)
        .map_err(|e| format!("discard extent 1: {e}"))?;
    read_back(volume, index)
}

/// Checks what [`write_discard_read`] left on `volume` (after a restart,
/// say), with the same message.
///
/// # Errors
/// The read that failed, or the first block that holds something else.
pub fn read_back(volume: &Volume, index: usize) -> Result<String, String> {
    let blocks = (EXTENT / BLOCK) as usize;
    let mut data = vec![0u8; EXTENT as usize];
    let written = |extent: usize, i: usize| extent == 0 || (extent == 3 && i >= blocks / 2);
    let mut pattern = 0;
    let mut zeroes = 0;
    for extent in 0..4usize {
        volume
            .read(extent as u64 * EXTENT, &mut data)
            .map_err(|e| format!("read extent {extent}: {e}"))?;
        for i in 0..blocks {
            let block = extent * blocks + i;
            let bytes = &data[i * BLOCK as usize..(i + 1) * BLOCK as usize];
            let found = decode(index, block, bytes)?;
            let expected = if written(extent, i) { 7 } else { 0 };
            if found != expected {
                return Err(format!(
                    "extent {extent} block {block}: expected {}, found {}",
                    if expected == 0 {
                        "zeroes"
                    } else {
                        "the pattern"
                    },
                    if found == 0 { "zeroes" } else { "the pattern" }
                ));
            }
            if found == 0 {
                zeroes += 1;
            } else {
                pattern += 1;
            }
        }
    }
    Ok(format!(
        "{pattern} blocks read back the pattern (extent 0, half of extent 3), {zeroes} read \
         zeroes (extent 1 discarded, extent 2 never written, half of extent 3)"
    ))
}
