//! The `Verbs` trait: what a provider (software HCA, rdma-sys) offers.
//!
//! One object stands for one device with one protection domain, one pool
//! of registered memory and one completion queue shared by all connections
//! (completions name their connection). Calls never block and never read a
//! clock: the provider makes progress in its own poll function, which the
//! owner of the run loop calls with the time; these calls only queue work
//! and collect results.

use core::net::SocketAddr;

use crate::access::AccessFlags;
use crate::cm::{CmEvent, ConnId, ConnParams};
use crate::error::{AllocError, ConnectError, PostError, RegError};
use crate::key::{Lkey, Rkey};
use crate::memory::{Memory, MemoryHandle, MemoryRegion};
use crate::wc::WorkCompletion;
use crate::wr::{RecvWr, SendWr};

/// A verbs provider: registered memory, work queues, completions and
/// connection management.
pub trait Verbs: Memory {
    /// Allocates a zeroed buffer of `len` bytes, aligned to `align` (a power
    /// of two), from the pool set aside at construction.
    ///
    /// # Errors
    ///
    /// [`AllocError`]: the pool or its table is exhausted, or bad arguments.
    fn alloc(&mut self, len: u32, align: u32) -> Result<MemoryHandle, AllocError>;

    /// Frees a whole buffer, deregistering it first.
    ///
    /// # Errors
    ///
    /// [`RegError::Busy`] while posted work requests pin it;
    /// [`RegError::StaleHandle`], [`RegError::PartialBuffer`].
    fn free(&mut self, buffer: MemoryHandle) -> Result<(), RegError>;

    /// Registers a whole buffer (`ibv_reg_mr`) with `access`, returning its
    /// keys and iova. The rkey is fresh and unpredictable.
    ///
    /// # Errors
    ///
    /// [`RegError`]: stale or partial handle, already registered, invalid
    /// access set.
    fn reg_mr(
        &mut self,
        buffer: MemoryHandle,
        access: AccessFlags,
    ) -> Result<MemoryRegion, RegError>;

    /// Gives the region a fresh, unpredictable rkey and makes remote access
    /// valid again; the previous rkey never works again. Takes effect before
    /// any work request posted after this call. Advertise the new key only
    /// after the memory's previous use is complete.
    ///
    /// # Errors
    ///
    /// [`RegError::Busy`] while posted work requests pin the region;
    /// [`RegError::InvalidKey`].
    fn rekey(&mut self, lkey: Lkey) -> Result<Rkey, RegError>;

    /// Revokes remote access through `rkey` now, outside the send queue:
    /// what a signalled LOCAL_INV work request does, without the work
    /// request and its completion. Revoking is always safe (posted work
    /// requests use the lkey), so it need not wait behind the queue. A
    /// provider that can invalidate only through the send queue (a
    /// hardware HCA) answers [`RegError::Unsupported`] (the default): the
    /// caller then posts the LOCAL_INV.
    ///
    /// # Errors
    ///
    /// [`RegError::InvalidKey`] if `rkey` is not a currently valid rkey;
    /// [`RegError::Unsupported`].
    fn revoke_remote(&mut self, rkey: Rkey) -> Result<(), RegError> {
        let _ = rkey;
        Err(RegError::Unsupported)
    }

    /// Deregisters a region (`ibv_dereg_mr`); the buffer stays allocated.
    ///
    /// # Errors
    ///
    /// [`RegError::Busy`] while pinned; [`RegError::InvalidKey`].
    fn dereg_mr(&mut self, lkey: Lkey) -> Result<(), RegError>;

    /// Posts send work requests on `conn`, all or none, in order.
    ///
    /// Each request pins the regions its SGL names until its completion is
    /// generated (see the crate docs). A provider may check lkeys and bounds
    /// here or report them later as `LocProtErr` completions.
    ///
    /// # Errors
    ///
    /// [`PostError`]; on error nothing was posted.
    fn post_send(&mut self, conn: ConnId, requests: &[SendWr]) -> Result<(), PostError>;

    /// Posts receive work requests on `conn`, all or none, in order. Allowed
    /// from `ConnectRequest` (passive) or `connect` (active) on.
    ///
    /// # Errors
    ///
    /// [`PostError`]; on error nothing was posted.
    fn post_recv(&mut self, conn: ConnId, requests: &[RecvWr]) -> Result<(), PostError>;

    /// Moves up to `out.len()` completions into `out`, oldest first, and
    /// returns how many.
    fn poll_cq(&mut self, out: &mut [WorkCompletion]) -> usize;

    /// Accepts connect requests for `port` (the RDMA CM port; service id
    /// `0x0106_0000 + port`).
    ///
    /// # Errors
    ///
    /// [`ConnectError::PortInUse`], [`ConnectError::NoResources`].
    fn listen(&mut self, port: u16) -> Result<(), ConnectError>;

    /// Starts connecting to `remote`; the outcome arrives as `Established`,
    /// `Rejected` or `Unreachable`. Receives may be posted at once.
    ///
    /// # Errors
    ///
    /// [`ConnectError`]: no free slot, private data over
    /// [`REQ_PRIVATE_DATA_LEN`](crate::REQ_PRIVATE_DATA_LEN), unsupported
    /// address.
    fn connect(
        &mut self,
        remote: SocketAddr,
        params: &ConnParams<'_>,
    ) -> Result<ConnId, ConnectError>;

    /// Accepts a `ConnectRequest` (sends the REP). Post receives first: the
    /// peer may send as soon as it has the REP.
    ///
    /// # Errors
    ///
    /// [`ConnectError`]: unknown connection, not awaiting an answer, private
    /// data over [`REP_PRIVATE_DATA_LEN`](crate::REP_PRIVATE_DATA_LEN).
    fn accept(&mut self, conn: ConnId, params: &ConnParams<'_>) -> Result<(), ConnectError>;

    /// Rejects a `ConnectRequest` (REJ, consumer-defined reason) and
    /// releases the connection.
    ///
    /// # Errors
    ///
    /// [`ConnectError`]: unknown connection, not awaiting an answer, private
    /// data over [`REJ_PRIVATE_DATA_LEN`](crate::REJ_PRIVATE_DATA_LEN).
    fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), ConnectError>;

    /// Starts tearing a connection down (DREQ); outstanding work requests
    /// flush and `Disconnected` follows.
    ///
    /// # Errors
    ///
    /// [`ConnectError::UnknownConnection`], [`ConnectError::InvalidState`].
    fn disconnect(&mut self, conn: ConnId) -> Result<(), ConnectError>;

    /// Releases a connection after `Disconnected`, `Rejected` or
    /// `Unreachable` (or gives up on an unanswered one, which disconnects
    /// it first). Its remaining completions are dropped and its pins
    /// released; the id may be reused afterwards.
    ///
    /// # Errors
    ///
    /// [`ConnectError::UnknownConnection`].
    fn destroy(&mut self, conn: ConnId) -> Result<(), ConnectError>;

    /// The next connection event, if any.
    fn poll_cm_event(&mut self) -> Option<CmEvent>;
}
