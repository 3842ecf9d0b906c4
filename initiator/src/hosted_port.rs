//! The device under a hosted session: Brick's software HCA on a frame or
//! UDP link, or an RDMA device through libibverbs (`ibv:DEVICE[:PORT]`,
//! crate `verbs-ibv`) — and the link a session names to get one.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use hal::hosted::{LinkSpec, PooledOsRng};
use hal::Rng;
use roce::hca::{Hca, HcaConfig, LinkMode};
use verbs::{
    AccessError, AccessFlags, AllocError, CmEvent, ConnId, ConnParams,
    ConnectError as VerbsConnectError, KeySource, Lkey, Memory, MemoryHandle, MemoryRegion,
    PostError, RecvWr, RegError, Rkey, SendWr, Verbs, WorkCompletion,
};
#[cfg(feature = "ibv")]
use verbs_ibv::{IbvDevice, IbvLink};

/// The hosted HCA: 64 memory regions, 32 queue pairs (paths ×
/// connections), 4096 completion-queue entries.
pub type HostHca = Hca<Vec<u8>, OsKeys, 64, 32, 4096>;

/// Memory regions and queue pairs an RDMA device is opened with for one
/// session (the software HCA's sizes).
#[cfg(feature = "ibv")]
const IBV_REGIONS: usize = 64;
#[cfg(feature = "ibv")]
const IBV_CONNECTIONS: usize = 32;

/// The OS random source, read a block at a time, as the HCA's key source
/// (a registration per IO draws a key).
#[derive(Clone, Debug, Default)]
pub struct OsKeys(PooledOsRng);

impl KeySource for OsKeys {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
}

/// What `--link` names for a session: a hosted link for the software HCA,
/// or an RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionLink {
    /// `frame:…`, `tcp:…` or `udp:…`.
    Hosted(LinkSpec),
    /// `ibv:DEVICE[:PORT]`.
    #[cfg(feature = "ibv")]
    Ibv(IbvLink),
}

impl From<LinkSpec> for SessionLink {
    fn from(spec: LinkSpec) -> Self {
        Self::Hosted(spec)
    }
}

impl fmt::Display for SessionLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hosted(spec) => spec.fmt(f),
            #[cfg(feature = "ibv")]
            Self::Ibv(link) => link.fmt(f),
        }
    }
}

impl FromStr for SessionLink {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        if spec.starts_with("ibv:") {
            #[cfg(feature = "ibv")]
            return spec.parse().map(Self::Ibv);
            #[cfg(not(feature = "ibv"))]
            return Err(format!(
                "link `{spec}`: this build has no RDMA device support (built without the `ibv` feature)"
            ));
        }
        spec.parse()
            .map(Self::Hosted)
            .map_err(|e| format!("{e}, or ibv:DEVICE[:PORT]"))
    }
}

/// A session's device (every verbs call forwarded), heap-allocated so the
/// initiator that owns it stays small.
pub enum HostPort {
    /// The software HCA.
    Hca(Box<HostHca>),
    /// An RDMA device.
    #[cfg(feature = "ibv")]
    Ibv(Box<IbvDevice>),
}

impl HostPort {
    /// The software HCA, if this is one.
    pub fn hca(&self) -> Option<&HostHca> {
        match self {
            Self::Hca(hca) => Some(hca),
            #[cfg(feature = "ibv")]
            Self::Ibv(_) => None,
        }
    }

    /// The software HCA, if this is one.
    pub fn hca_mut(&mut self) -> Option<&mut HostHca> {
        match self {
            Self::Hca(hca) => Some(hca),
            #[cfg(feature = "ibv")]
            Self::Ibv(_) => None,
        }
    }

    /// An RDMA device's descriptors an idle loop sleeps on (its
    /// completion and connection-manager channels); `None` for the
    /// software HCA, whose link is the descriptor.
    pub fn wake_fds(&self) -> Option<[i32; 2]> {
        match self {
            Self::Hca(_) => None,
            #[cfg(feature = "ibv")]
            Self::Ibv(device) => Some(device.wake_fds()),
        }
    }

    /// An RDMA device: arms its completion queues before a sleep (poll
    /// once more after; see `IbvDevice::arm`). Returns whether they are
    /// armed (always false for the software HCA).
    pub fn arm(&self) -> bool {
        match self {
            Self::Hca(_) => false,
            #[cfg(feature = "ibv")]
            Self::Ibv(device) => device.arm(),
        }
    }

    /// An RDMA device: acknowledges its completion channel after a sleep.
    pub fn disarm(&self) {
        #[cfg(feature = "ibv")]
        if let Self::Ibv(device) = self {
            device.disarm();
        }
    }

    /// When the software HCA next has timed work (an RDMA device has
    /// none of its own).
    pub fn poll_at(&self, now: u64) -> Option<u64> {
        self.hca().and_then(|hca| hca.poll_at(now))
    }

    /// The software HCA's frame, drop and retransmission counters (zero
    /// on an RDMA device: the kernel or the HCA keeps its own).
    pub fn counters(&self) -> roce::qp::Counters {
        self.hca().map(|hca| *hca.counters()).unwrap_or_default()
    }

    /// Opens RDMA device `link` holding `address`, sized for one session
    /// with `memory_bytes` of registered memory and queue depth
    /// `queue_depth`: completion entries for every queue pair's send
    /// (4 per request, as the RTRS client asks) and receive depth.
    ///
    /// # Errors
    /// [`verbs_ibv::OpenError`].
    #[cfg(feature = "ibv")]
    pub fn open_ibv(
        link: &IbvLink,
        address: std::net::Ipv4Addr,
        memory_bytes: usize,
        queue_depth: u16,
    ) -> Result<Self, verbs_ibv::OpenError> {
        let qd = u32::from(queue_depth);
        let per_qp = (4 * qd + 1) + (2 * qd + 9);
        let cq_entries = per_qp.saturating_mul(IBV_CONNECTIONS as u32);
        IbvDevice::open(verbs_ibv::IbvConfig {
            device: link.device.clone(),
            port: link.port,
            address,
            memory_bytes,
            regions: IBV_REGIONS,
            connections: IBV_CONNECTIONS,
            cq_entries,
        })
        .map(|device| Self::Ibv(Box::new(device)))
    }
}

/// Forwards one call to whichever device this is.
macro_rules! forward {
    ($self:ident, $call:ident($($arg:expr),*)) => {
        match $self {
            HostPort::Hca(hca) => hca.$call($($arg),*),
            #[cfg(feature = "ibv")]
            HostPort::Ibv(device) => device.$call($($arg),*),
        }
    };
}

impl Memory for HostPort {
    fn with_slice<R>(
        &self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, AccessError> {
        forward!(self, with_slice(handle, offset, len, f))
    }

    fn with_slice_mut<R>(
        &mut self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, AccessError> {
        forward!(self, with_slice_mut(handle, offset, len, f))
    }
}

impl Verbs for HostPort {
    fn alloc(&mut self, len: u32, align: u32) -> Result<MemoryHandle, AllocError> {
        forward!(self, alloc(len, align))
    }
    fn free(&mut self, buffer: MemoryHandle) -> Result<(), RegError> {
        forward!(self, free(buffer))
    }
    fn reg_mr(
        &mut self,
        buffer: MemoryHandle,
        access: AccessFlags,
    ) -> Result<MemoryRegion, RegError> {
        forward!(self, reg_mr(buffer, access))
    }
    fn rekey(&mut self, lkey: Lkey) -> Result<Rkey, RegError> {
        forward!(self, rekey(lkey))
    }
    fn dereg_mr(&mut self, lkey: Lkey) -> Result<(), RegError> {
        forward!(self, dereg_mr(lkey))
    }
    fn post_send(&mut self, conn: ConnId, requests: &[SendWr]) -> Result<(), PostError> {
        forward!(self, post_send(conn, requests))
    }
    fn post_recv(&mut self, conn: ConnId, requests: &[RecvWr]) -> Result<(), PostError> {
        forward!(self, post_recv(conn, requests))
    }
    fn poll_cq(&mut self, out: &mut [WorkCompletion]) -> usize {
        forward!(self, poll_cq(out))
    }
    fn listen(&mut self, port: u16) -> Result<(), VerbsConnectError> {
        forward!(self, listen(port))
    }
    fn connect(
        &mut self,
        remote: SocketAddr,
        params: &ConnParams<'_>,
    ) -> Result<ConnId, VerbsConnectError> {
        forward!(self, connect(remote, params))
    }
    fn accept(&mut self, conn: ConnId, params: &ConnParams<'_>) -> Result<(), VerbsConnectError> {
        forward!(self, accept(conn, params))
    }
    fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), VerbsConnectError> {
        forward!(self, reject(conn, private_data))
    }
    fn disconnect(&mut self, conn: ConnId) -> Result<(), VerbsConnectError> {
        forward!(self, disconnect(conn))
    }
    fn destroy(&mut self, conn: ConnId) -> Result<(), VerbsConnectError> {
        forward!(self, destroy(conn))
    }
    fn poll_cm_event(&mut self) -> Option<CmEvent> {
        forward!(self, poll_cm_event())
    }
}

/// Builds the (large) software HCA on a thread with a big stack and
/// returns it boxed, so the caller's stack never holds it.
pub(crate) fn build_hca(arena: usize, config: HcaConfig, mode: LinkMode) -> HostPort {
    match std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || build_hca_here(arena, config, mode))
        .map(|handle| handle.join())
    {
        Ok(Ok(hca)) => hca,
        // No thread could be made (or it died): build it here.
        _ => build_hca_here(arena, config, mode),
    }
}

/// The HCA built on this thread's stack (in debug builds the value passes
/// through the stack before it is boxed: several MiB).
#[inline(never)]
fn build_hca_here(arena: usize, config: HcaConfig, mode: LinkMode) -> HostPort {
    HostPort::Hca(Box::new(Hca::with_link(
        vec![0u8; arena],
        OsKeys::default(),
        config,
        mode,
    )))
}
