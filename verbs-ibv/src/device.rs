//! [`IbvDevice`]: one RDMA device port, its protection domain, its one
//! completion queue, its registered memory and its connections.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fmt;
use std::net::Ipv4Addr;

use verbs::memory::Arena;
use verbs::{
    AccessError, AccessFlags, AllocError, Lkey, Memory, MemoryHandle, MemoryRegion, PostError,
    RegError, RegionId, Rkey, Sge,
};

use crate::conn::Conns;
use crate::cqs::CompletionQueues;
use crate::dma::DmaMemory;
use crate::ffi::{self, BiSge};
use crate::translate::ResolveSge;

/// What to open and how large to make it (from the manifest's limits).
#[derive(Clone, Debug)]
pub struct IbvConfig {
    /// The RDMA device name (`rxe0`, `mlx5_0`); the address must be on it.
    pub device: String,
    /// The device port (1 for every RoCE device with one port).
    pub port: u8,
    /// The IPv4 address to listen on and connect from; rdma_cm finds the
    /// device through it.
    pub address: Ipv4Addr,
    /// Bytes of registered memory, mapped once at open.
    pub memory_bytes: usize,
    /// Most buffers (and so memory regions) at once.
    pub regions: usize,
    /// Most connections (queue pairs) at once.
    pub connections: usize,
    /// Completion-queue entries; every queue pair reserves its send and
    /// receive depth from them, so the queue cannot overflow.
    pub cq_entries: u32,
}

/// Why a device did not open.
#[derive(Debug)]
pub enum OpenError {
    /// A call failed: what was being done and the OS error.
    Call(&'static str, std::io::Error),
    /// The address is on another device or port than the configuration
    /// names.
    WrongDevice {
        /// What the configuration names.
        expected: String,
        /// What rdma_cm bound the address to.
        found: String,
    },
    /// The device cannot hold what the configuration asks.
    TooSmall(String),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Call(what, err) => write!(f, "{what}: {err}"),
            Self::WrongDevice { expected, found } => {
                write!(
                    f,
                    "expected the address on RDMA device {expected}, found it on {found}"
                )
            }
            Self::TooSmall(why) => write!(f, "device too small: {why}"),
        }
    }
}

impl std::error::Error for OpenError {}

pub(crate) fn os_error(code: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(code.unsigned_abs() as i32)
}

/// One registration: the HCA's memory region over one arena buffer.
#[derive(Clone, Copy)]
pub(crate) struct Registration {
    mr: *mut ffi::Mr,
    handle: MemoryHandle,
    addr: u64,
    access: AccessFlags,
    rkey: Rkey,
    /// Posted requests that name the region and have not completed.
    pins: u32,
}

/// The registrations by the HCA's lkey.
pub(crate) type Regions = HashMap<u32, Registration>;

/// A posted request names `lkey`: the region stays registered until it
/// completes.
pub(crate) fn pin(regions: &mut Regions, lkey: u32) {
    if let Some(reg) = regions.get_mut(&lkey) {
        reg.pins = reg.pins.saturating_add(1);
    }
}

/// A request that named `lkey` completed (or its queue pair is gone).
pub(crate) fn unpin(regions: &mut Regions, lkey: u32) {
    if let Some(reg) = regions.get_mut(&lkey) {
        reg.pins = reg.pins.saturating_sub(1);
    }
}

/// An RDMA device port with Brick's memory and connections, implementing
/// [`verbs::Verbs`].
pub struct IbvDevice {
    pub(crate) channel: *mut ffi::Channel,
    /// The id bound to the configured address: it holds the device open.
    anchor: *mut ffi::CmId,
    pub(crate) pd: *mut ffi::Pd,
    /// Wakes an idle loop when an armed completion queue gets an entry
    /// ([`IbvDevice::arm`]); never read on the data path.
    comp: *mut ffi::CompChannel,
    pub(crate) config: IbvConfig,
    pub(crate) limits: ffi::BiLimits,
    device_name: String,
    /// Registrations by the HCA's lkey, and the lkey of each buffer.
    pub(crate) regions: Regions,
    by_buffer: HashMap<RegionId, u32>,
    pub(crate) conns: Conns,
    /// The completion queues every queue pair reserves its depths from.
    pub(crate) cqs: CompletionQueues,
    /// Dropped last: the HCA may write it until every QP is gone.
    arena: Arena<DmaMemory>,
}

// SAFETY: the raw pointers name librdmacm/libibverbs objects this device
// owns exclusively; libibverbs objects may be used from any thread, one at a
// time, which `&mut self` on every call guarantees.
unsafe impl Send for IbvDevice {}

impl IbvDevice {
    /// Opens the device port that holds `config.address`, its protection
    /// domain and completion queue, and maps its memory.
    ///
    /// # Errors
    /// [`OpenError`]: no RDMA device has the address, another device or
    /// port than configured has it, or a resource could not be made.
    pub fn open(config: IbvConfig) -> Result<Self, OpenError> {
        let memory = DmaMemory::new(config.memory_bytes)
            .map_err(|e| OpenError::Call("mmap registered memory", e))?;
        let mut err = 0;
        // SAFETY: plain constructor; the result is checked.
        let channel = unsafe { ffi::bi_channel(&raw mut err) };
        if channel.is_null() {
            return Err(OpenError::Call("rdma_create_event_channel", os_error(err)));
        }
        let mut device = Self {
            channel,
            anchor: core::ptr::null_mut(),
            pd: core::ptr::null_mut(),
            comp: core::ptr::null_mut(),
            limits: ffi::BiLimits::default(),
            device_name: String::new(),
            regions: HashMap::with_capacity(config.regions),
            by_buffer: HashMap::with_capacity(config.regions),
            conns: Conns::new(config.connections),
            cqs: CompletionQueues::new(),
            arena: Arena::with_regions(memory, config.regions),
            config,
        };
        device.bind()?;
        Ok(device)
    }

    fn bind(&mut self) -> Result<(), OpenError> {
        let ip = u32::from_ne_bytes(self.config.address.octets());
        // SAFETY: `channel` is live; `anchor` receives the new id.
        let rc = unsafe { ffi::bi_bind(self.channel, ip, &raw mut self.anchor) };
        if rc != 0 {
            return Err(OpenError::Call(
                "bind the address with rdma_cm (is an RDMA device on it?)",
                os_error(rc),
            ));
        }
        // SAFETY: `anchor` is a bound id; its context is the device's.
        let ctx = unsafe { ffi::bi_id_context(self.anchor) };
        if ctx.is_null() {
            return Err(OpenError::WrongDevice {
                expected: self.config.device.clone(),
                found: format!(
                    "no RDMA device ({} is not on an RDMA netdev)",
                    self.config.address
                ),
            });
        }
        // SAFETY: `ctx` is live while `anchor` is; the name is a C string it owns.
        let name = unsafe { ffi::bi_device_name(ctx) };
        // SAFETY: a NUL-terminated name libibverbs keeps for the device's life.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: as above.
        let port = unsafe { ffi::bi_id_port(self.anchor) };
        if name != self.config.device || (port != 0 && port != self.config.port) {
            return Err(OpenError::WrongDevice {
                expected: format!("{} port {}", self.config.device, self.config.port),
                found: format!("{name} port {port}"),
            });
        }
        self.device_name = name;
        // SAFETY: `ctx` is live; `limits` is written by the call.
        let rc = unsafe { ffi::bi_device_limits(ctx, &raw mut self.limits) };
        if rc != 0 {
            return Err(OpenError::Call("ibv_query_device", os_error(rc)));
        }
        // Completion queues of at most the device's size, enough of them
        // for every queue pair's reservation.
        let per_cq = self.limits.max_cqe.max(1);
        let cqs = self.config.cq_entries.div_ceil(per_cq).max(1);
        if cqs > self.limits.max_cq {
            return Err(OpenError::TooSmall(format!(
                "expected {} completion-queue entries ({cqs} queues of {per_cq}), the device allows {} queues",
                self.config.cq_entries, self.limits.max_cq
            )));
        }
        if self.config.regions > self.limits.max_mr as usize {
            return Err(OpenError::TooSmall(format!(
                "expected {} memory regions, the device allows {}",
                self.config.regions, self.limits.max_mr
            )));
        }
        // SAFETY: `ctx` is live; results are checked.
        self.pd = unsafe { ffi::bi_alloc_pd(ctx) };
        if self.pd.is_null() {
            return Err(OpenError::Call(
                "ibv_alloc_pd",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: as above.
        self.comp = unsafe { ffi::bi_comp_channel(ctx) };
        if self.comp.is_null() {
            return Err(OpenError::Call(
                "ibv_create_comp_channel",
                std::io::Error::last_os_error(),
            ));
        }
        let mut left = self.config.cq_entries.max(1);
        while left > 0 {
            let entries = left.min(per_cq);
            left -= entries;
            // SAFETY: as above.
            let cq = unsafe { ffi::bi_create_cq(ctx, entries as i32, self.comp) };
            if cq.is_null() {
                return Err(OpenError::Call(
                    "ibv_create_cq",
                    std::io::Error::last_os_error(),
                ));
            }
            self.cqs.add(cq, entries);
        }
        Ok(())
    }

    /// The device's name (`rxe0`).
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The configured address.
    pub fn address(&self) -> Ipv4Addr {
        self.config.address
    }

    /// The connection manager's descriptor: readable when a connection
    /// event waits (a hosted loop may sleep on it when idle; completions
    /// have no descriptor, the loop polls them).
    pub fn cm_fd(&self) -> i32 {
        // SAFETY: `channel` is live for the device's life.
        unsafe { ffi::bi_channel_fd(self.channel) }
    }

    /// Descriptors an idle loop sleeps on: the connection manager's, and
    /// the completion channel's (readable once an armed queue gets an
    /// entry).
    pub fn wake_fds(&self) -> [i32; 2] {
        // SAFETY: both channels are live for the device's life.
        [self.cm_fd(), unsafe { ffi::bi_comp_fd(self.comp) }]
    }

    /// Before an idle loop sleeps: asks every completion queue to signal
    /// the completion channel on its next entry. Poll once more after
    /// arming (an entry that came before it signals nothing) and sleep
    /// only if that finds nothing. Returns whether every queue was armed.
    pub fn arm(&self) -> bool {
        // SAFETY: each queue is live; arming only sets its notify state.
        self.cqs.iter().all(|cq| unsafe { ffi::bi_arm_cq(cq) } == 0)
    }

    /// After a sleep: takes and acknowledges the completion channel's
    /// events (the loop polls the queues itself). Returns how many.
    pub fn disarm(&self) -> usize {
        // SAFETY: the channel is live and non-blocking.
        let n = unsafe { ffi::bi_drain_comp_events(self.comp) };
        usize::try_from(n).unwrap_or(0)
    }

    /// Connections (queue pairs) open now.
    pub fn connections(&self) -> usize {
        self.conns.live()
    }

    /// Memory regions registered now.
    pub fn registrations(&self) -> usize {
        self.regions.len()
    }

    pub(crate) fn alloc_buffer(
        &mut self,
        len: u32,
        align: u32,
    ) -> Result<MemoryHandle, AllocError> {
        self.arena.alloc(len, align.max(64))
    }

    pub(crate) fn free_buffer(&mut self, buffer: MemoryHandle) -> Result<(), RegError> {
        if let Some(lkey) = self.by_buffer.get(&buffer.region()).copied() {
            self.deregister(Lkey(lkey))?;
        }
        self.arena.free(buffer)
    }

    pub(crate) fn register(
        &mut self,
        buffer: MemoryHandle,
        access: AccessFlags,
    ) -> Result<MemoryRegion, RegError> {
        if !access.is_valid() {
            return Err(RegError::InvalidAccess);
        }
        if self.by_buffer.contains_key(&buffer.region()) {
            return Err(RegError::AlreadyRegistered);
        }
        if self.regions.len() >= self.config.regions {
            return Err(RegError::Busy);
        }
        let addr = self
            .arena
            .with_slice(buffer, 0, buffer.len(), |bytes| bytes.as_ptr() as u64)
            .map_err(|_| RegError::StaleHandle)?;
        if buffer.offset() != 0 {
            return Err(RegError::PartialBuffer);
        }
        let mut bits = 0;
        for (flag, bit) in [
            (AccessFlags::LOCAL_WRITE, ffi::ACCESS_LOCAL_WRITE),
            (AccessFlags::REMOTE_WRITE, ffi::ACCESS_REMOTE_WRITE),
            (AccessFlags::REMOTE_READ, ffi::ACCESS_REMOTE_READ),
        ] {
            if access.contains(flag) {
                bits |= bit;
            }
        }
        let (mut lkey, mut rkey) = (0, 0);
        // SAFETY: `addr..addr+len` lies inside the arena's mapping, which
        // outlives every registration (dropped last); `pd` is live.
        let mr = unsafe {
            ffi::bi_reg_mr(
                self.pd,
                addr as *mut core::ffi::c_void,
                buffer.len() as usize,
                bits,
                &raw mut lkey,
                &raw mut rkey,
            )
        };
        if mr.is_null() {
            return Err(RegError::Busy);
        }
        self.regions.insert(
            lkey,
            Registration {
                mr,
                handle: buffer,
                addr,
                access,
                rkey: Rkey(rkey),
                pins: 0,
            },
        );
        self.by_buffer.insert(buffer.region(), lkey);
        Ok(MemoryRegion {
            handle: buffer,
            lkey: Lkey(lkey),
            rkey: Rkey(rkey),
            iova: addr,
            access,
        })
    }

    pub(crate) fn deregister(&mut self, lkey: Lkey) -> Result<(), RegError> {
        match self.regions.get(&lkey.0) {
            None => return Err(RegError::InvalidKey),
            Some(reg) if reg.pins > 0 => return Err(RegError::Busy),
            Some(_) => {}
        }
        let reg = self.regions.remove(&lkey.0).ok_or(RegError::InvalidKey)?;
        self.by_buffer.remove(&reg.handle.region());
        // SAFETY: `mr` came from `bi_reg_mr` and is deregistered once.
        unsafe { ffi::bi_dereg_mr(reg.mr) };
        Ok(())
    }

    /// The registration of `rkey`, if it is one of ours (tests, stats).
    pub fn region_of(&self, rkey: Rkey) -> Option<MemoryHandle> {
        self.regions
            .values()
            .find(|r| r.rkey == rkey)
            .map(|r| r.handle)
    }
}

impl ResolveSge for IbvDevice {
    fn resolve(&self, sge: &Sge, access: AccessFlags) -> Result<BiSge, PostError> {
        let reg = self.regions.get(&sge.lkey.0).ok_or(PostError::InvalidKey)?;
        if u64::from(sge.offset) + u64::from(sge.len) > u64::from(reg.handle.len()) {
            return Err(PostError::OutOfBounds);
        }
        if !reg.access.contains(access) {
            return Err(PostError::AccessDenied);
        }
        Ok(BiSge {
            addr: reg.addr + u64::from(sge.offset),
            length: sge.len,
            lkey: sge.lkey.0,
        })
    }
}

impl Memory for IbvDevice {
    fn with_slice<R>(
        &self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, AccessError> {
        self.arena.with_slice(handle, offset, len, f)
    }

    fn with_slice_mut<R>(
        &mut self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, AccessError> {
        self.arena.with_slice_mut(handle, offset, len, f)
    }
}

impl Drop for IbvDevice {
    fn drop(&mut self) {
        if !self.comp.is_null() {
            self.disarm();
        }
        self.conns.destroy_all();
        // Every queue pair is gone: nothing the HCA holds names a region.
        for reg in self.regions.values_mut() {
            reg.pins = 0;
        }
        let keys: Vec<u32> = self.regions.keys().copied().collect();
        for lkey in keys {
            let _ = self.deregister(Lkey(lkey));
        }
        // SAFETY (each block below): every object is owned by this device
        // and released once, children before parents (QPs and MRs are gone
        // above).
        for cq in self.cqs.iter() {
            // SAFETY: as above.
            unsafe { ffi::bi_destroy_cq(cq) };
        }
        if !self.comp.is_null() {
            // SAFETY: as above; its queues are gone (their events were
            // acknowledged before they were destroyed).
            unsafe { ffi::bi_destroy_comp_channel(self.comp) };
        }
        if !self.pd.is_null() {
            // SAFETY: as above.
            unsafe { ffi::bi_dealloc_pd(self.pd) };
        }
        if !self.anchor.is_null() {
            // SAFETY: as above.
            unsafe { ffi::bi_destroy(self.anchor) };
        }
        self.conns.destroy_listeners();
        // SAFETY: as above; the channel goes last, after every id.
        unsafe { ffi::bi_channel_destroy(self.channel) };
    }
}
