//! A path's registered memory: its chunk pool and control buffers, taken
//! from and given back to the path's port.

use super::*;

impl<V: Verbs> Server<V> {
    pub(super) fn allocate_pool(&mut self, index: usize) -> Result<(), ConnectRefusal> {
        let config = self.config;
        let verbs = &mut self.ports[self.paths[index].port];
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let oom = |_| ConnectRefusal::OutOfMemory;
        for _ in 0..config.queue_depth {
            let buffer = verbs.alloc(config.chunk_size, 4096).map_err(oom)?;
            let region = match verbs.reg_mr(buffer, remote) {
                Ok(region) => region,
                Err(_) => {
                    let _ = verbs.free(buffer);
                    return Err(ConnectRefusal::OutOfMemory);
                }
            };
            self.paths[index].chunks.push(ChunkSlot::new(region));
        }
        let info_rsp_len = 8 + 16 * u32::from(config.queue_depth);
        let sizes = [
            (InfoReq::LEN as u32, AccessFlags::LOCAL_WRITE),
            (info_rsp_len, AccessFlags::EMPTY),
            (
                RkeyRsp::LEN as u32 * u32::from(config.queue_depth),
                AccessFlags::EMPTY,
            ),
        ];
        for (which, (len, access)) in sizes.into_iter().enumerate() {
            let buffer = verbs.alloc(len, 64).map_err(oom)?;
            let region = match verbs.reg_mr(buffer, access) {
                Ok(region) => region,
                Err(_) => {
                    let _ = verbs.free(buffer);
                    return Err(ConnectRefusal::OutOfMemory);
                }
            };
            let path = &mut self.paths[index];
            match which {
                0 => path.info_req = Some(region),
                1 => path.info_rsp = Some(region),
                _ => path.rkey_rsp = Some(region),
            }
        }
        Ok(())
    }

    /// Frees every buffer of a path on its port; `false` if some are still
    /// pinned.
    pub(super) fn release_pool(&mut self, index: usize) -> bool {
        let mut all = true;
        let path = &mut self.paths[index];
        let verbs = &mut self.ports[path.port];
        while let Some(chunk) = path.chunks.pop() {
            if verbs.free(chunk.region.handle).is_err() {
                path.chunks.push(chunk);
                all = false;
                break;
            }
        }
        for slot in [&mut path.info_req, &mut path.info_rsp, &mut path.rkey_rsp] {
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
