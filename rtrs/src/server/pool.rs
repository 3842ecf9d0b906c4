//! A path's registered memory: its chunk pool and control buffers, taken
//! from and given back to the path's port.

use verbs::{AccessFlags, MemoryRegion, Verbs};

use super::table::ChunkSlot;
use super::{ConnectRefusal, Lent};
use crate::wire::InfoReq;

impl<V: Verbs> Lent<'_, V> {
    /// Allocates and registers one buffer of `len` bytes on `port`.
    fn register(
        verbs: &mut V,
        len: u32,
        align: u32,
        access: AccessFlags,
    ) -> Result<MemoryRegion, ConnectRefusal> {
        let buffer = verbs
            .alloc(len, align)
            .map_err(|_| ConnectRefusal::OutOfMemory)?;
        verbs.reg_mr(buffer, access).map_err(|_| {
            let _ = verbs.free(buffer);
            ConnectRefusal::OutOfMemory
        })
    }

    /// The INFO_REQ receive buffer of a new path (rtrs.md §2.4 step 6): all
    /// a half-open path holds besides its connections.
    pub(super) fn allocate_info_req(&mut self, index: usize) -> Result<(), ConnectRefusal> {
        let verbs = &mut self.ports[self.server.paths[index].port];
        let region = Self::register(verbs, InfoReq::LEN as u32, 64, AccessFlags::LOCAL_WRITE)?;
        self.server.paths[index].info_req = Some(region);
        Ok(())
    }

    /// Allocates and registers the chunk pool and the INFO_RSP buffer of an
    /// admitted path on the path's port (RKEY_RSP goes inline, in the work
    /// request). What was allocated
    /// before a failure stays with the path and goes with
    /// [`release_pool`](Self::release_pool).
    pub(super) fn allocate_pool(&mut self, index: usize) -> Result<(), ConnectRefusal> {
        let config = self.server.config;
        let verbs = &mut self.ports[self.server.paths[index].port];
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        for _ in 0..config.queue_depth {
            let region = Self::register(verbs, config.chunk_size, 4096, remote)?;
            self.server.paths[index].chunks.push(ChunkSlot::new(region));
        }
        let info_rsp_len = 8 + 16 * u32::from(config.queue_depth);
        let region = Self::register(verbs, info_rsp_len, 64, AccessFlags::EMPTY)?;
        self.server.paths[index].info_rsp = Some(region);
        Ok(())
    }

    /// Frees every buffer of a path on its port; `false` if some are still
    /// pinned.
    pub(super) fn release_pool(&mut self, index: usize) -> bool {
        let mut all = true;
        let path = &mut self.server.paths[index];
        let verbs = &mut self.ports[path.port];
        while let Some(chunk) = path.chunks.pop() {
            if verbs.free(chunk.region.handle).is_err() {
                path.chunks.push(chunk);
                all = false;
                break;
            }
        }
        for slot in [&mut path.info_req, &mut path.info_rsp] {
            if let Some(region) = *slot {
                if verbs.free(region.handle).is_ok() {
                    *slot = None;
                } else {
                    all = false;
                }
            }
        }
        all
    }
}
