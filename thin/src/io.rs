//! One thin-volume request, extent by extent: the pieces it goes to the
//! pool as, allocation on first write, freeing on discard, and the order
//! that keeps the map crash-consistent (data durable, then the map entry,
//! then the acknowledgement).

use hal::block::{BlockDevice, BufferAccess, Completion, IoError, Op, Request, SubmitError};

use crate::buffers::{PoolBuf, Resolve};
use crate::format::Entry;
use crate::state::{Ext, PoolState, TAG_SLOT};

/// Most pool requests one piece needs (a write into a new extent: the
/// data and the zeroes before and after it).
const PIECE_OPS: usize = 3;

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Start the piece at `cursor` (or finish).
    Start,
    /// Pool requests of the piece in flight; then `then`.
    Io(After),
    /// A freed extent waits for the pool requests still on it.
    Drain,
    /// Waits for map block `block` to be durable at `version`.
    Map {
        block: u32,
        version: u64,
        allocated: bool,
    },
}

/// What follows a piece's pool requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum After {
    /// Nothing: the piece is done.
    Plain,
    /// A new extent's data and zeroes are written: make them durable.
    Filled,
    /// ... and durable: enter the map entry.
    Durable,
    /// A freed extent is discarded or zeroed on the pool: clear its entry.
    Emptied,
}

/// An accepted request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot<H> {
    pub(crate) tag: u64,
    pub(crate) op: Op<H>,
    /// Bytes of the request done.
    pub(crate) cursor: u32,
    pub(crate) phase: Phase,
    /// The current piece: virtual extent, physical extent, bytes.
    pub(crate) extent: u32,
    pub(crate) physical: u32,
    pub(crate) piece: u32,
    /// The piece holds an `io_count` reference on `physical`.
    pub(crate) counted: bool,
    /// Pool requests not yet accepted by the pool.
    pub(crate) pending: [Option<Op<PoolBuf<H>>>; PIECE_OPS],
    /// Pool requests accepted and not completed.
    pub(crate) outstanding: u8,
    pub(crate) error: Option<IoError>,
    /// A flush request was sent to the pool.
    pub(crate) flushed: bool,
}

impl<H: Copy> Slot<H> {
    pub(crate) fn new(request: Request<H>) -> Self {
        Self {
            tag: request.tag,
            op: request.op,
            cursor: 0,
            phase: Phase::Start,
            extent: 0,
            physical: 0,
            piece: 0,
            counted: false,
            pending: [None; PIECE_OPS],
            outstanding: 0,
            error: None,
            flushed: false,
        }
    }

    /// A pool request of this slot completed.
    pub(crate) fn pool_done(&mut self, result: Result<(), IoError>) {
        self.outstanding = self.outstanding.saturating_sub(1);
        if let Err(error) = result {
            self.error.get_or_insert(error);
        }
    }
}

fn enospc() -> IoError {
    IoError::Io(i32::from(errno::ENOSPC))
}

impl<D: BlockDevice<PoolBuf<H>>, H: Copy> PoolState<D, H> {
    /// Moves request `slot` of `volume` on until it waits or finishes.
    pub(crate) fn advance<A: BufferAccess<H> + ?Sized>(
        &mut self,
        volume: usize,
        slot: usize,
        buffers: &mut A,
    ) {
        let Some(mut state) = self.volumes[volume].slots[slot] else {
            return;
        };
        let outcome = self.step(volume, slot, &mut state, buffers);
        match outcome {
            Some(result) => {
                let done = Completion {
                    tag: state.tag,
                    kind: state.op.kind(),
                    buffer: state.op.buffer(),
                    result,
                };
                let vol = &mut self.volumes[volume];
                vol.slots[slot] = None;
                // Cannot exceed the capacity: accepted requests are bounded
                // by the queue depth, delivered or not.
                vol.done.push_back(done);
            }
            None => self.volumes[volume].slots[slot] = Some(state),
        }
    }

    /// Runs the slot's state machine; `Some(result)` when it finishes.
    fn step<A: BufferAccess<H> + ?Sized>(
        &mut self,
        volume: usize,
        slot: usize,
        s: &mut Slot<H>,
        buffers: &mut A,
    ) -> Option<Result<(), IoError>> {
        let extent_size = self.layout.extent_size;
        loop {
            match s.phase {
                Phase::Start => {
                    if let Op::Flush = s.op {
                        if s.flushed {
                            return Some(Ok(()));
                        }
                        s.flushed = true;
                        s.pending[0] = Some(Op::Flush);
                        s.phase = Phase::Io(After::Plain);
                        s.piece = 0;
                        continue;
                    }
                    let (offset, len) = s.op.range()?;
                    if s.cursor >= len {
                        return Some(Ok(()));
                    }
                    let position = offset + u64::from(s.cursor);
                    let extent = (position / u64::from(extent_size)) as u32;
                    let within = (position % u64::from(extent_size)) as u32;
                    let piece = (len - s.cursor).min(extent_size - within);
                    s.extent = extent;
                    s.piece = piece;
                    let ext = self.volumes[volume].map[extent as usize];
                    match (s.op, ext) {
                        (_, Ext::Allocating(_) | Ext::Freeing(_)) => return None,
                        (Op::Read { buffer, .. }, Ext::Unmapped) => {
                            let skip = s.cursor as usize;
                            let zeroed = buffers.with_slice_mut(buffer, s.cursor + piece, |b| {
                                b[skip..].fill(0);
                            });
                            if let Err(error) = zeroed {
                                return Some(Err(IoError::Buffer(error)));
                            }
                            s.cursor += piece;
                        }
                        (Op::Read { buffer, .. }, Ext::Mapped(physical)) => {
                            s.pending[0] = Some(Op::Read {
                                offset: self.layout.extent_offset(physical) + u64::from(within),
                                len: piece,
                                buffer: PoolBuf::Caller {
                                    handle: buffer,
                                    skip: s.cursor,
                                },
                            });
                            self.hold(s, physical);
                        }
                        (Op::Write { buffer, fua, .. }, Ext::Mapped(physical)) => {
                            s.pending[0] = Some(Op::Write {
                                offset: self.layout.extent_offset(physical) + u64::from(within),
                                len: piece,
                                buffer: PoolBuf::Caller {
                                    handle: buffer,
                                    skip: s.cursor,
                                },
                                fua,
                            });
                            self.hold(s, physical);
                        }
                        (Op::Write { buffer, .. }, Ext::Unmapped) => {
                            let Some(physical) = self.free.pop() else {
                                self.stats.enospc += 1;
                                return Some(Err(enospc()));
                            };
                            self.volumes[volume].map[extent as usize] = Ext::Allocating(physical);
                            s.physical = physical;
                            let base = self.layout.extent_offset(physical);
                            s.pending[0] = Some(Op::Write {
                                offset: base + u64::from(within),
                                len: piece,
                                buffer: PoolBuf::Caller {
                                    handle: buffer,
                                    skip: s.cursor,
                                },
                                fua: false,
                            });
                            if within > 0 {
                                s.pending[1] = Some(Op::WriteZeroes {
                                    offset: base,
                                    len: within,
                                });
                            }
                            let end = within + piece;
                            if end < extent_size {
                                s.pending[2] = Some(Op::WriteZeroes {
                                    offset: base + u64::from(end),
                                    len: extent_size - end,
                                });
                            }
                            s.phase = Phase::Io(After::Filled);
                        }
                        (Op::Discard { .. } | Op::WriteZeroes { .. }, Ext::Unmapped) => {
                            s.cursor += piece;
                        }
                        (Op::Discard { .. } | Op::WriteZeroes { .. }, Ext::Mapped(physical))
                            if piece == extent_size =>
                        {
                            self.volumes[volume].map[extent as usize] = Ext::Freeing(physical);
                            s.physical = physical;
                            s.phase = Phase::Drain;
                        }
                        (Op::Discard { .. } | Op::WriteZeroes { .. }, Ext::Mapped(physical)) => {
                            s.pending[0] = Some(Op::WriteZeroes {
                                offset: self.layout.extent_offset(physical) + u64::from(within),
                                len: piece,
                            });
                            self.hold(s, physical);
                        }
                        (Op::Flush, _) => return Some(Ok(())),
                    }
                }
                Phase::Drain => {
                    if self.io_count[s.physical as usize] > 0 {
                        return None;
                    }
                    let offset = self.layout.extent_offset(s.physical);
                    let len = extent_size;
                    // Discard returns the space to the pool's own device
                    // where it can; write-zeroes (RNBD's SECURE_ERASE)
                    // zeroes it. Reallocation zeroes the extent anyway.
                    s.pending[0] = Some(match (s.op, self.pool_info.discard) {
                        (Op::Discard { .. }, Some(_)) => Op::Discard { offset, len },
                        _ => Op::WriteZeroes { offset, len },
                    });
                    s.phase = Phase::Io(After::Emptied);
                }
                Phase::Io(after) => {
                    self.submit_pending(volume, slot, s, buffers);
                    if s.outstanding > 0 || s.pending.iter().any(Option::is_some) {
                        return None;
                    }
                    if s.counted {
                        s.counted = false;
                        let count = &mut self.io_count[s.physical as usize];
                        *count = count.saturating_sub(1);
                    }
                    if let Some(error) = s.error {
                        let map = &mut self.volumes[volume].map[s.extent as usize];
                        match after {
                            After::Filled | After::Durable => {
                                *map = Ext::Unmapped;
                                self.free.push(s.physical);
                            }
                            After::Emptied => *map = Ext::Mapped(s.physical),
                            After::Plain => {}
                        }
                        return Some(Err(error));
                    }
                    match after {
                        After::Plain => s.cursor += s.piece,
                        After::Filled if self.pool_info.volatile_write_cache => {
                            s.pending[0] = Some(Op::Flush);
                            s.phase = Phase::Io(After::Durable);
                            continue;
                        }
                        After::Filled | After::Durable => {
                            let generation = self.next_generation;
                            self.next_generation += 1;
                            let table = self.volumes[volume].table;
                            let entry = Entry {
                                volume: table + 1,
                                virtual_extent: s.extent,
                                generation,
                            };
                            let (block, version) = self.set_owner(s.physical, entry);
                            s.phase = Phase::Map {
                                block,
                                version,
                                allocated: true,
                            };
                            continue;
                        }
                        After::Emptied => {
                            let (block, version) = self.set_owner(s.physical, Entry::FREE);
                            s.phase = Phase::Map {
                                block,
                                version,
                                allocated: false,
                            };
                            continue;
                        }
                    }
                    s.phase = Phase::Start;
                }
                Phase::Map {
                    block,
                    version,
                    allocated,
                } => {
                    let state = self.blocks[block as usize];
                    let map = &mut self.volumes[volume].map[s.extent as usize];
                    if state.durable >= version {
                        if allocated {
                            *map = Ext::Mapped(s.physical);
                            self.stats.allocations += 1;
                        } else {
                            *map = Ext::Unmapped;
                            self.free.push(s.physical);
                            self.stats.frees += 1;
                        }
                        s.cursor += s.piece;
                        s.phase = Phase::Start;
                        continue;
                    }
                    if state.failed < version || state.writing.is_some() {
                        return None;
                    }
                    // The map write failed: undo the change in memory (it
                    // is rewritten with the next change of the block). An
                    // extent whose allocation failed is not reused before
                    // the next open, where the check settles it.
                    if allocated {
                        *map = Ext::Unmapped;
                        self.set_owner(s.physical, Entry::FREE);
                    } else {
                        *map = Ext::Mapped(s.physical);
                        let table = self.volumes[volume].table;
                        let entry = Entry {
                            volume: table + 1,
                            virtual_extent: s.extent,
                            generation: self.next_generation,
                        };
                        self.next_generation += 1;
                        self.set_owner(s.physical, entry);
                    }
                    return Some(Err(IoError::device()));
                }
            }
        }
    }

    /// The piece reads or writes mapped extent `physical`: it is not freed
    /// until the piece is done.
    fn hold(&mut self, s: &mut Slot<H>, physical: u32) {
        s.physical = physical;
        s.counted = true;
        self.io_count[physical as usize] += 1;
        s.phase = Phase::Io(After::Plain);
    }

    /// Hands the slot's pending pool requests to the pool as far as its
    /// queue allows; a refusal other than a full queue fails the piece.
    fn submit_pending<A: BufferAccess<H> + ?Sized>(
        &mut self,
        volume: usize,
        slot: usize,
        s: &mut Slot<H>,
        buffers: &mut A,
    ) {
        for pending in &mut s.pending {
            let Some(op) = *pending else {
                continue;
            };
            if s.error.is_some() {
                *pending = None;
                continue;
            }
            let request = Request {
                tag: TAG_SLOT | (volume as u64) << 32 | slot as u64,
                op,
            };
            let mut resolve = Resolve::new(&mut *buffers, &mut self.meta);
            match self.device.submit(request, &mut resolve) {
                Ok(()) => {
                    *pending = None;
                    s.outstanding += 1;
                }
                Err(SubmitError::QueueFull) => return,
                Err(SubmitError::Buffer(error)) => {
                    *pending = None;
                    s.error = Some(IoError::Buffer(error));
                }
                Err(_) => {
                    *pending = None;
                    s.error = Some(IoError::device());
                }
            }
        }
    }
}
