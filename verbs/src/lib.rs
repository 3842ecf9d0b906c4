//! The fabric seam: verbs-shaped traits that RTRS and the initiator use.
//!
//! RTRS and the userspace initiator program against this crate, not against
//! the software HCA (`roce`), so an rdma-sys provider (libibverbs +
//! librdmacm, a real HCA or Linux rxe) can implement the same traits later
//! (ARCHITECTURE.md §4). The vocabulary is verbs': memory regions with lkeys and
//! rkeys, send and receive work requests, work completions with immediate
//! data and statuses, connection events with private data. What RTRS needs
//! of it is listed in `docs/protocol/rtrs.md` §1.
//!
//! The crate is `no_std` (with `alloc`: [`memory::Arena`] allocates its
//! region table once, when built; nothing allocates after) and sans-IO: nothing reads a
//! clock, and the provider advances in its own poll function. [`Verbs`] is
//! the provider trait, [`Memory`] the checked access to registered memory,
//! and [`memory::Arena`] a reference pool providers build on.
//!
//! # Registered memory
//!
//! *Allocated once.* A provider is built with its arena: every byte it will
//! ever register is set aside at start (sized from the manifest). Buffers
//! are then carved from it ([`Verbs::alloc`]) and freed back
//! ([`Verbs::free`]) when a session ends; nothing is allocated later, and a
//! buffer is zeroed when handed out, so no owner or peer sees old data.
//!
//! *Handles, not pointers.* A consumer holds [`MemoryHandle`]s: buffer id
//! (slot + generation) + offset + length. Handles are plain data and grant
//! nothing; every access through [`Memory::read`], [`Memory::write`],
//! [`Memory::with_slice`] or [`Memory::with_slice_mut`] checks that the
//! buffer is still allocated (the generation catches a freed, reused slot)
//! and that the range lies inside the handle, and returns an error, never
//! panics. The closures see exactly the checked range for the duration of
//! the call. So portable crates (`rtrs`, `rnbd`) read headers out of chunks
//! and fill chunks for volume reads without `unsafe`.
//!
//! *Keys.* Registering a whole buffer ([`Verbs::reg_mr`]) with
//! [`AccessFlags`] (LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ; remote write
//! requires local write, as in verbs) gives a [`MemoryRegion`]: an [`Lkey`]
//! for this host's scatter-gather entries ([`Sge`]: lkey + offset + length;
//! a list of them is an [`Sgl`]), an [`Rkey`] and an iova for peers. Keys
//! are laid out like a real HCA's: 24-bit index + 8-bit variant; a key works
//! only while it equals the region's current key exactly. Every HCA access
//! is checked against key, access flag and bounds (`roce-v2.md` §2.7); CPU
//! access through handles needs no key.
//!
//! *Invalidation and re-keying* (the `always_invalidate` guarantee,
//! `rtrs.md` §4.9). Invalidation ([`SendOp::LocalInv`] here, or a peer's
//! SEND_WITH_INV) makes the rkey stop working: peers can no longer touch the
//! memory, while local access through the lkey continues (this mirrors the
//! Linux server, which revokes a chunk's MR but sends from it with the
//! device-wide local key). Re-keying ([`Verbs::rekey`]) gives the same
//! memory a fresh, unpredictable rkey, valid at once; the old one never
//! works again. The RTRS server invalidates a chunk's rkey when a request
//! arrives, serves the IO, re-keys, then posts the response data and the
//! RKEY_RSP carrying the new key; RC ordering delivers the data before the
//! peer can learn the key. (If the chunk's previous response is still
//! unacknowledged, the re-key is refused as busy, below, and the request
//! waits in a named state for that completion.)
//!
//! # Sending without copies
//!
//! An outgoing data packet is its headers, built in a small buffer, plus a
//! scatter-gather reference into registered memory; the payload is never
//! copied into a frame buffer. The provider resolves each packet's share of
//! the SGL into slices of the pool ([`memory::Arena::sgl_pieces`], one pass over the entries it touches) and
//! hands header + slices to the NIC, which gathers them (writev, virtio
//! descriptor chains). Retransmission resends from the same memory.
//!
//! So the memory must not change until the peer has it. Posting a work
//! request (send or receive) *pins* every region its SGL names; the pin is
//! released when the request completes, signaled or not: for a send, when
//! the peer's ACK covers its last packet (or it fails or is flushed); for a
//! receive, when data landed or it was flushed. While pinned, the provider
//! refuses [`Verbs::rekey`], [`Verbs::dereg_mr`] and [`Verbs::free`] with
//! [`RegError::Busy`] (invalidation stays allowed: revoking remote access is
//! always safe). The CPU writing bytes a posted request names is not
//! detected (pins are per region, and other parts of a region may be in
//! use); it is the consumer's obligation:
//!
//! *Ownership returns with the completion.* From `post_send`/`post_recv`
//! until [`Verbs::poll_cq`] returns the request's [`WorkCompletion`] (same
//! [`WrId`]), the named bytes belong to the provider: the consumer does not
//! write them (nor, for receives and RDMA READ destinations, read them).
//! An unsignaled send has no completion of its own; it is complete when a
//! later signaled send on the same connection completes, because a send
//! queue completes in order. After `Disconnected`, every outstanding
//! request completes with [`WcStatus::WrFlushErr`], returning its memory.
//!
//! # Connections
//!
//! Queue pairs are created by the CM calls, as with librdmacm: by
//! [`Verbs::connect`] (active) or an incoming [`CmEvent::ConnectRequest`]
//! (passive), and released by [`Verbs::destroy`]. Events carry the CM
//! private data (bounded by the CM message sizes) and the addresses.
//!
//! # Errors
//!
//! One error enum per operation ([`AccessError`], [`AllocError`],
//! [`RegError`], [`PostError`], [`ConnectError`]), variants named after the
//! rule that was broken, all `#[non_exhaustive]`.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod access;
pub mod cm;
pub mod error;
pub mod key;
pub mod memory;
pub mod provider;
pub mod wc;
pub mod wr;

pub use access::AccessFlags;
pub use cm::{
    CmEvent, ConnId, ConnParams, PrivateData, RejectReason, MAX_PRIVATE_DATA_LEN,
    REJ_PRIVATE_DATA_LEN, REP_PRIVATE_DATA_LEN, REQ_PRIVATE_DATA_LEN,
};
pub use error::{AccessError, AllocError, ConnectError, PostError, RegError};
pub use key::{KeySource, Lkey, Rkey};
pub use memory::{Memory, MemoryHandle, MemoryRegion, RegionId};
pub use provider::Verbs;
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
pub use wr::{Inline, RecvWr, SendOp, SendWr, Sge, Sgl, WrId, MAX_INLINE, MAX_SGE};
