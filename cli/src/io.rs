//! `brick io`: write, read back and verify a deterministic pattern.
//!
//! The range `offset..offset + size` is walked in `--bs` pieces with the
//! blocking API ([`initiator::hosted::Volume::write`] / `read`; a piece
//! longer than one IO slot runs as parallel slot-sized IOs). Data is the
//! [`crate::pattern`] of `--pattern SEED`, a function of the absolute volume
//! offset, so `read` in a later process checks what an earlier `write`
//! left, and a misplaced, stale or foreign block is named as such. One
//! buffer of `--bs` bytes is allocated up front and reused.
//!
//! `--random COUNT` replaces the walk by COUNT pieces at random
//! block-aligned offsets inside the range, each of a random length from
//! `--min-bs` to `--bs` (whole blocks): because the pattern depends only on
//! the position, overlapping pieces agree, and `verify` reads every piece
//! back after the writes and their FLUSH. The pieces come from a generator
//! seeded with `--pattern`, so a later `read --random` with the same
//! options checks the same pieces.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use initiator::hosted::Volume;

use crate::connect::{finish, mode_name, ConnectArgs};
use crate::pattern::{self, Mismatch};
use crate::progress::Progress;
use crate::size::{format_bytes, format_bytes_approx, parse_bytes};

/// Largest `--bs` (the buffer is allocated whole).
pub const MAX_BLOCK: u64 = 1 << 30;
/// Largest IO slot `brick io` configures; longer pieces are split.
const MAX_TRANSFER: u64 = 1 << 20;

/// What `brick io` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Operation {
    /// Write the pattern.
    Write,
    /// Read and check the pattern (or dump a summary with --dump).
    Read,
    /// Write the pattern, then read it back and check it.
    Verify,
}

/// `brick io` options.
#[derive(Args, Debug)]
pub struct IoArgs {
    /// Connection and volume.
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// write, read or verify (= write, then read back and compare).
    #[arg(value_enum)]
    pub operation: Operation,
    /// First byte (a multiple of the volume's block size).
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    pub offset: u64,
    /// Bytes to transfer (a multiple of the block size).
    #[arg(long, default_value = "1M", value_parser = parse_bytes)]
    pub size: u64,
    /// Bytes per blocking call (a multiple of the block size, at most 1GiB;
    /// pieces over 1MiB run as parallel 1MiB IOs).
    #[arg(long, default_value = "1M", value_parser = parse_bytes)]
    pub bs: u64,
    /// Seed of the data pattern.
    #[arg(long = "pattern", value_name = "SEED", default_value_t = 1)]
    pub seed: u64,
    /// Write with FUA (durable before each call returns); otherwise the
    /// write pass ends with a FLUSH.
    #[arg(long)]
    pub fua: bool,
    /// With read: print one line per --bs piece (first bytes, a
    /// fingerprint, and how it compares with the pattern) instead of
    /// failing on a mismatch.
    #[arg(long)]
    pub dump: bool,
    /// COUNT pieces at random offsets in the range, of random lengths from
    /// --min-bs to --bs, instead of walking it in order.
    #[arg(long, value_name = "COUNT")]
    pub random: Option<u64>,
    /// Shortest random piece (default: the volume's block size).
    #[arg(long, value_parser = parse_bytes)]
    pub min_bs: Option<u64>,
}

/// `brick io` found data that is not the pattern.
#[derive(Debug)]
pub struct DataMismatch(pub Mismatch);

impl std::fmt::Display for DataMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DataMismatch {}

/// Checks `offset..offset + len` against the volume: aligned to its block
/// size and inside it. Errors say what was expected and what was found.
pub fn check_range(
    name: &str,
    capacity: u64,
    block_size: u32,
    offset: u64,
    len: u64,
    what: &str,
) -> Result<()> {
    let block = u64::from(block_size.max(1));
    if offset % block != 0 {
        bail!(
            "--offset {offset} is not a multiple of the {block}-byte block size of volume {name:?}"
        );
    }
    if len % block != 0 {
        bail!("{what} {len} is not a multiple of the {block}-byte block size of volume {name:?}");
    }
    let end = offset.checked_add(len);
    if end.is_none_or(|end| end > capacity) {
        let end = u128::from(offset) + u128::from(len);
        if offset >= capacity {
            bail!(
                "--offset {offset} ({}) is past the end of volume {name:?}: it has {capacity} bytes ({}); expected an offset below {capacity}",
                format_bytes(offset),
                format_bytes(capacity)
            );
        }
        bail!(
            "bytes {offset}..{end} run past the end of volume {name:?}: it has {capacity} bytes ({}); expected offset + {what} <= {capacity}",
            format_bytes(capacity)
        );
    }
    Ok(())
}

/// MB/s (10^6 bytes per second) of `bytes` in `elapsed`.
pub fn megabytes_per_second(bytes: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        bytes as f64 / secs / 1e6
    }
}

/// Runs `brick io`.
///
/// # Errors
///
/// Connection, open, range and IO failures with context; a wrong byte as
/// [`DataMismatch`].
pub fn run(args: &IoArgs) -> Result<()> {
    if args.size == 0 {
        bail!("--size 0: expected at least one block");
    }
    if args.bs == 0 || args.bs > MAX_BLOCK {
        bail!(
            "--bs {}: expected 1..={} bytes",
            args.bs,
            format_bytes(MAX_BLOCK)
        );
    }
    if args.dump && args.operation != Operation::Read {
        bail!("--dump goes with read; found {:?}", args.operation);
    }
    if args.dump && args.random.is_some() {
        bail!("--dump walks the range in order; it does not go with --random");
    }
    if args.min_bs.is_some() && args.random.is_none() {
        bail!("--min-bs goes with --random COUNT");
    }
    let bs = args.bs.min(args.size);
    let max_transfer = bs.next_multiple_of(4096).clamp(4096, MAX_TRANSFER) as u32;
    let spec = args.connect.spec(32, max_transfer)?;
    let (session, volume) = args.connect.open(&spec)?;
    let result = run_open(args, bs, &volume);
    finish(session, volume, result)
}

/// `brick io` on the open volume.
fn run_open(args: &IoArgs, bs: u64, volume: &Volume) -> Result<()> {
    let name = &args.connect.volume;
    let info = volume.info();
    check_range(
        name,
        info.size,
        info.logical_block_size,
        args.offset,
        args.size,
        "--size",
    )?;
    if bs % u64::from(info.logical_block_size) != 0 {
        bail!(
            "--bs {bs} is not a multiple of the {}-byte block size of volume {name:?}",
            info.logical_block_size
        );
    }
    eprintln!(
        "brick io: volume {name:?} {} ({} bytes, {}-byte blocks), {}, session {:?} over {}",
        format_bytes(info.size),
        info.size,
        info.logical_block_size,
        mode_name(info.mode),
        args.connect.session,
        args.connect.link
    );
    let mut buffer = vec![0u8; bs as usize];
    if let Some(count) = args.random {
        let block = u64::from(info.logical_block_size.max(1));
        let min = args.min_bs.unwrap_or(block);
        if min == 0 || min % block != 0 || min > bs {
            bail!(
                "--min-bs {min}: expected a multiple of the {block}-byte block size, at most --bs {bs}"
            );
        }
        let random = RandomPass {
            volume,
            offset: args.offset,
            size: args.size,
            seed: args.seed,
            count,
            min,
            max: bs,
            block,
        };
        match args.operation {
            Operation::Write => random.write(&mut buffer, args.fua)?,
            Operation::Read => random.read(&mut buffer)?,
            Operation::Verify => {
                random.write(&mut buffer, args.fua)?;
                random.read(&mut buffer)?;
            }
        }
        return Ok(());
    }
    let pass = Pass {
        volume,
        offset: args.offset,
        size: args.size,
        seed: args.seed,
    };
    match args.operation {
        Operation::Write => pass.write(&mut buffer, args.fua)?,
        Operation::Read if args.dump => pass.dump(&mut buffer)?,
        Operation::Read => pass.read(&mut buffer)?,
        Operation::Verify => {
            pass.write(&mut buffer, args.fua)?;
            pass.read(&mut buffer)?;
        }
    }
    Ok(())
}

/// One walk over the range.
struct Pass<'a> {
    volume: &'a Volume,
    offset: u64,
    size: u64,
    seed: u64,
}

impl Pass<'_> {
    /// Calls `each(offset, piece)` for every `buffer`-sized piece, with a
    /// progress line once a second; returns the time taken.
    fn walk(
        &self,
        verb: &str,
        buffer: &mut [u8],
        mut each: impl FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<Duration> {
        let start = Instant::now();
        let mut progress = Progress::new();
        let mut done = 0u64;
        while done < self.size {
            let len = (self.size - done).min(buffer.len() as u64) as usize;
            each(self.offset + done, &mut buffer[..len])?;
            done += len as u64;
            progress.tick(|elapsed| {
                format!(
                    "{verb}: {} of {} ({:.0}%), {:.1} MB/s",
                    format_bytes_approx(done),
                    format_bytes(self.size),
                    done as f64 * 100.0 / self.size as f64,
                    megabytes_per_second(done, elapsed)
                )
            });
        }
        progress.finish();
        Ok(start.elapsed())
    }

    fn report(&self, what: &str, elapsed: Duration, extra: &str) {
        println!(
            "{what} {} ({} bytes) at offset {} in {:.3} ms: {:.1} MB/s (seed {}{extra})",
            format_bytes(self.size),
            self.size,
            self.offset,
            elapsed.as_secs_f64() * 1e3,
            megabytes_per_second(self.size, elapsed),
            self.seed
        );
    }

    fn write(&self, buffer: &mut [u8], fua: bool) -> Result<()> {
        let elapsed = self.walk("write", buffer, |offset, piece| {
            pattern::fill(self.seed, offset, piece);
            self.volume
                .write(offset, piece, fua)
                .with_context(|| format!("write of {} bytes at offset {offset}", piece.len()))
        })?;
        let flush_start = Instant::now();
        if !fua {
            self.volume.flush().context("flush after the writes")?;
        }
        let elapsed = elapsed + flush_start.elapsed();
        self.report(
            "wrote",
            elapsed,
            if fua { ", FUA" } else { ", then flushed" },
        );
        Ok(())
    }

    fn read(&self, buffer: &mut [u8]) -> Result<()> {
        let elapsed = self.walk("read", buffer, |offset, piece| {
            self.volume
                .read(offset, piece)
                .with_context(|| format!("read of {} bytes at offset {offset}", piece.len()))?;
            match pattern::check(self.seed, offset, piece) {
                None => Ok(()),
                Some(mismatch) => Err(DataMismatch(mismatch).into()),
            }
        })?;
        self.report("read and checked", elapsed, "");
        Ok(())
    }

    fn dump(&self, buffer: &mut [u8]) -> Result<()> {
        let mut differing = 0u64;
        let mut out = std::io::stdout().lock();
        let elapsed = self.walk("read", buffer, |offset, piece| {
            self.volume
                .read(offset, piece)
                .with_context(|| format!("read of {} bytes at offset {offset}", piece.len()))?;
            let head: String = piece.iter().take(16).map(|b| format!("{b:02x} ")).collect();
            let verdict = match pattern::check(self.seed, offset, piece) {
                None => "pattern ok".to_owned(),
                Some(_) if piece.iter().all(|&b| b == 0) => {
                    differing += 1;
                    "all zeros".to_owned()
                }
                Some(mismatch) => {
                    differing += 1;
                    format!(
                        "differs from +{}: {}",
                        mismatch.offset - offset,
                        mismatch.sector
                    )
                }
            };
            writeln!(
                out,
                "{offset:#012x} {:>8}  {head} fnv {:016x}  {verdict}",
                format_bytes(piece.len() as u64),
                pattern::fingerprint(piece)
            )
            .context("write to stdout")
        })?;
        drop(out);
        self.report(
            "read",
            elapsed,
            &format!(", {differing} pieces differ from the pattern"),
        );
        Ok(())
    }
}

/// COUNT random pieces inside a range (see the module docs).
struct RandomPass<'a> {
    volume: &'a Volume,
    offset: u64,
    size: u64,
    seed: u64,
    count: u64,
    min: u64,
    max: u64,
    block: u64,
}

impl RandomPass<'_> {
    /// The `index`-th piece: (offset, length), block-aligned, inside the
    /// range; the same for the same options in any process.
    fn piece(&self, index: u64) -> (u64, u64) {
        let mut state = self
            .seed
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(index.wrapping_mul(0xbf58_476d_1ce4_e5b9))
            | 1;
        let mut next = || {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let blocks = (self.max.min(self.size) - self.min) / self.block + 1;
        let len = self.min + (next() % blocks) * self.block;
        let slots = (self.size - len) / self.block + 1;
        let offset = self.offset + (next() % slots) * self.block;
        (offset, len)
    }

    /// Runs `each` on every piece with a progress line; returns (bytes, time).
    fn walk(
        &self,
        verb: &str,
        buffer: &mut [u8],
        mut each: impl FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<(u64, Duration)> {
        let start = Instant::now();
        let mut progress = Progress::new();
        let mut bytes = 0u64;
        for index in 0..self.count {
            let (offset, len) = self.piece(index);
            each(offset, &mut buffer[..len as usize])?;
            bytes += len;
            progress.tick(|elapsed| {
                format!(
                    "{verb}: {} of {} pieces ({:.0}%), {:.1} MB/s",
                    index + 1,
                    self.count,
                    (index + 1) as f64 * 100.0 / self.count as f64,
                    megabytes_per_second(bytes, elapsed)
                )
            });
        }
        progress.finish();
        Ok((bytes, start.elapsed()))
    }

    fn report(&self, what: &str, bytes: u64, elapsed: Duration, extra: &str) {
        println!(
            "{what} {} random pieces of {}..{} ({} bytes) in {} at offset {} in {:.3} ms: {:.1} MB/s (seed {}{extra})",
            self.count,
            format_bytes(self.min),
            format_bytes(self.max.min(self.size)),
            bytes,
            format_bytes(self.size),
            self.offset,
            elapsed.as_secs_f64() * 1e3,
            megabytes_per_second(bytes, elapsed),
            self.seed
        );
    }

    fn write(&self, buffer: &mut [u8], fua: bool) -> Result<()> {
        let (bytes, elapsed) = self.walk("write", buffer, |offset, piece| {
            pattern::fill(self.seed, offset, piece);
            self.volume
                .write(offset, piece, fua)
                .with_context(|| format!("write of {} bytes at offset {offset}", piece.len()))
        })?;
        let flush_start = Instant::now();
        if !fua {
            self.volume.flush().context("flush after the writes")?;
        }
        self.report(
            "wrote",
            bytes,
            elapsed + flush_start.elapsed(),
            if fua { ", FUA" } else { ", then flushed" },
        );
        Ok(())
    }

    fn read(&self, buffer: &mut [u8]) -> Result<()> {
        let (bytes, elapsed) = self.walk("read", buffer, |offset, piece| {
            self.volume
                .read(offset, piece)
                .with_context(|| format!("read of {} bytes at offset {offset}", piece.len()))?;
            match pattern::check(self.seed, offset, piece) {
                None => Ok(()),
                Some(mismatch) => Err(DataMismatch(mismatch).into()),
            }
        })?;
        self.report("read and checked", bytes, elapsed, "");
        Ok(())
    }
}
