//! Brick's work requests and completions to and from the C layer's flat
//! structures: pure functions, tested without a device.

use verbs::{
    AccessFlags, ConnId, PostError, RecvWr, Rkey, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion, WrId,
};

use crate::ffi::{self, BiRecv, BiSend, BiSge, BiWc};

/// Resolves a scatter-gather entry to the HCA's view: the host address of
/// its first byte and the HCA's lkey, checking it against the region.
pub trait ResolveSge {
    /// The entry as the HCA sees it.
    ///
    /// # Errors
    /// [`PostError::InvalidKey`], [`PostError::OutOfBounds`],
    /// [`PostError::AccessDenied`].
    fn resolve(&self, sge: &Sge, access: AccessFlags) -> Result<BiSge, PostError>;
}

fn sges(
    resolver: &impl ResolveSge,
    list: &[Sge],
    access: AccessFlags,
) -> Result<([BiSge; ffi::MAX_SGE], u8), PostError> {
    let mut out = [BiSge::default(); ffi::MAX_SGE];
    if list.len() > ffi::MAX_SGE {
        return Err(PostError::TooManySge);
    }
    verbs::wr::total_len(list).ok_or(PostError::LengthOverflow)?;
    for (slot, sge) in out.iter_mut().zip(list) {
        *slot = resolver.resolve(sge, access)?;
    }
    // At most MAX_SGE (4) entries: fits a u8.
    Ok((out, list.len() as u8))
}

/// One send work request in the C layer's form.
///
/// # Errors
/// As [`ResolveSge::resolve`]; [`PostError::Unsupported`] for LOCAL_INV
/// (userspace verbs cannot invalidate: no fast-register either) and for
/// inline sends (see below).
pub fn send(resolver: &impl ResolveSge, wr: &SendWr) -> Result<BiSend, PostError> {
    let mut out = BiSend {
        wr_id: wr.wr_id.0,
        signaled: u8::from(wr.signaled),
        ..BiSend::default()
    };
    let (list, access) = match &wr.op {
        SendOp::Send { sgl, imm } => {
            out.opcode = if let Some(imm) = imm {
                out.imm = *imm;
                ffi::OP_SEND_WITH_IMM
            } else {
                ffi::OP_SEND
            };
            (sgl.as_slice(), AccessFlags::EMPTY)
        }
        SendOp::SendWithInv { sgl, invalidate } => {
            out.opcode = ffi::OP_SEND_WITH_INV;
            out.rkey = invalidate.0;
            (sgl.as_slice(), AccessFlags::EMPTY)
        }
        SendOp::RdmaWrite {
            sgl,
            remote_addr,
            rkey,
            imm,
        } => {
            out.opcode = if let Some(imm) = imm {
                out.imm = *imm;
                ffi::OP_RDMA_WRITE_WITH_IMM
            } else {
                ffi::OP_RDMA_WRITE
            };
            out.remote_addr = *remote_addr;
            out.rkey = rkey.0;
            (sgl.as_slice(), AccessFlags::EMPTY)
        }
        SendOp::RdmaRead {
            sgl,
            remote_addr,
            rkey,
        } => {
            out.opcode = ffi::OP_RDMA_READ;
            out.remote_addr = *remote_addr;
            out.rkey = rkey.0;
            (sgl.as_slice(), AccessFlags::LOCAL_WRITE)
        }
        // Only `always_invalidate` posts inline sends (its RKEY_RSP), and
        // a userspace target refuses that flag: it cannot re-key either.
        SendOp::SendInline { .. } | SendOp::LocalInv { .. } => return Err(PostError::Unsupported),
    };
    let (sge, num) = sges(resolver, list, access)?;
    out.sge = sge;
    out.num_sge = num;
    Ok(out)
}

/// One receive work request in the C layer's form.
///
/// # Errors
/// As [`ResolveSge::resolve`] (receive buffers need local write).
pub fn recv(resolver: &impl ResolveSge, wr: &RecvWr) -> Result<BiRecv, PostError> {
    let (sge, num) = sges(resolver, wr.sgl.as_slice(), AccessFlags::LOCAL_WRITE)?;
    Ok(BiRecv {
        wr_id: wr.wr_id.0,
        num_sge: num,
        pad: [0; 7],
        sge,
    })
}

/// The completion status the C layer reports, in verbs' terms.
pub fn status(code: u8) -> WcStatus {
    match code {
        0 => WcStatus::Success,
        1 => WcStatus::LocLenErr,
        2 => WcStatus::LocQpOpErr,
        3 => WcStatus::LocProtErr,
        4 => WcStatus::LocAccessErr,
        5 => WcStatus::WrFlushErr,
        6 => WcStatus::BadRespErr,
        7 => WcStatus::RemInvReqErr,
        8 => WcStatus::RemAccessErr,
        9 => WcStatus::RemOpErr,
        10 => WcStatus::RetryExcErr,
        11 => WcStatus::RnrRetryExcErr,
        _ => WcStatus::GeneralErr,
    }
}

/// The completion opcode the C layer reports; `None` for an opcode Brick
/// never posts (atomics, binds), reported as a send.
pub fn opcode(code: u8) -> WcOpcode {
    match code {
        1 => WcOpcode::RdmaWrite,
        2 => WcOpcode::RdmaRead,
        3 => WcOpcode::LocalInv,
        4 => WcOpcode::Recv,
        5 => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    }
}

/// One completion of connection `conn`.
pub fn completion(wc: &BiWc, conn: ConnId) -> WorkCompletion {
    WorkCompletion {
        wr_id: WrId(wc.wr_id),
        conn,
        opcode: opcode(wc.opcode),
        status: status(wc.status),
        byte_len: wc.byte_len,
        imm: (wc.flags & ffi::WC_IMM != 0).then_some(wc.imm),
        invalidated_rkey: (wc.flags & ffi::WC_INV != 0).then_some(Rkey(wc.imm)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs::{Lkey, Sgl};

    /// Regions of 4 KiB at 0x10000 * lkey, read-only for odd keys.
    struct Regions;

    impl ResolveSge for Regions {
        fn resolve(&self, sge: &Sge, access: AccessFlags) -> Result<BiSge, PostError> {
            if sge.lkey.0 == 0 {
                return Err(PostError::InvalidKey);
            }
            if u64::from(sge.offset) + u64::from(sge.len) > 4096 {
                return Err(PostError::OutOfBounds);
            }
            if sge.lkey.0 % 2 == 1 && access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(PostError::AccessDenied);
            }
            Ok(BiSge {
                addr: 0x10000 * u64::from(sge.lkey.0) + u64::from(sge.offset),
                length: sge.len,
                lkey: sge.lkey.0 + 100,
            })
        }
    }

    fn wr(op: SendOp) -> SendWr {
        SendWr {
            wr_id: WrId(9),
            signaled: true,
            op,
        }
    }

    #[test]
    fn rdma_write_with_imm_carries_address_key_and_immediate() {
        let sgl =
            Sgl::try_from_slice(&[Sge::new(Lkey(2), 16, 512), Sge::new(Lkey(4), 0, 32)]).unwrap();
        let out = send(
            &Regions,
            &wr(SendOp::RdmaWrite {
                sgl,
                remote_addr: 0xdead_0000,
                rkey: Rkey(77),
                imm: Some(0x8000_0001),
            }),
        )
        .unwrap();
        assert_eq!(out.opcode, ffi::OP_RDMA_WRITE_WITH_IMM);
        assert_eq!(
            (out.remote_addr, out.rkey, out.imm),
            (0xdead_0000, 77, 0x8000_0001)
        );
        assert_eq!((out.wr_id, out.signaled, out.num_sge), (9, 1, 2));
        assert_eq!(
            (out.sge[0].addr, out.sge[0].length, out.sge[0].lkey),
            (0x20010, 512, 102)
        );
        assert_eq!(out.sge[1].addr, 0x40000);
    }

    #[test]
    fn sends_invalidate_and_reads_map_to_their_opcodes() {
        let plain = send(
            &Regions,
            &wr(SendOp::Send {
                sgl: Sgl::new(),
                imm: None,
            }),
        )
        .unwrap();
        assert_eq!((plain.opcode, plain.num_sge), (ffi::OP_SEND, 0));
        let inv = send(
            &Regions,
            &wr(SendOp::SendWithInv {
                sgl: Sgl::new(),
                invalidate: Rkey(5),
            }),
        )
        .unwrap();
        assert_eq!((inv.opcode, inv.rkey), (ffi::OP_SEND_WITH_INV, 5));
        let read = send(
            &Regions,
            &wr(SendOp::RdmaRead {
                sgl: Sgl::single(Sge::new(Lkey(3), 0, 8)),
                remote_addr: 1,
                rkey: Rkey(2),
            }),
        );
        assert_eq!(
            read.unwrap_err(),
            PostError::AccessDenied,
            "RDMA READ lands in memory: local write needed"
        );
        assert_eq!(
            send(&Regions, &wr(SendOp::LocalInv { rkey: Rkey(1) })).unwrap_err(),
            PostError::Unsupported
        );
        let inline = SendOp::SendInline {
            data: verbs::Inline::try_from_slice(&[1; 8]).unwrap(),
            imm: None,
        };
        assert_eq!(
            send(&Regions, &wr(inline)).unwrap_err(),
            PostError::Unsupported
        );
    }

    #[test]
    fn bad_entries_are_refused_before_anything_reaches_the_device() {
        let out_of_bounds = RecvWr {
            wr_id: WrId(1),
            sgl: Sgl::single(Sge::new(Lkey(2), 4000, 200)),
        };
        assert_eq!(
            recv(&Regions, &out_of_bounds).unwrap_err(),
            PostError::OutOfBounds
        );
        let read_only = RecvWr {
            wr_id: WrId(1),
            sgl: Sgl::single(Sge::new(Lkey(1), 0, 10)),
        };
        assert_eq!(
            recv(&Regions, &read_only).unwrap_err(),
            PostError::AccessDenied
        );
        let ok = recv(
            &Regions,
            &RecvWr {
                wr_id: WrId(4),
                sgl: Sgl::single(Sge::new(Lkey(2), 0, 4096)),
            },
        )
        .unwrap();
        assert_eq!((ok.wr_id, ok.num_sge, ok.sge[0].length), (4, 1, 4096));
    }

    #[test]
    fn completions_carry_immediate_or_invalidated_key() {
        let wc = BiWc {
            wr_id: 3,
            byte_len: 4096,
            imm: 0x1234,
            flags: ffi::WC_IMM,
            opcode: 5,
            status: 0,
            ..BiWc::default()
        };
        let c = completion(&wc, ConnId(8));
        assert_eq!(
            (c.opcode, c.status, c.imm, c.invalidated_rkey),
            (
                WcOpcode::RecvRdmaWithImm,
                WcStatus::Success,
                Some(0x1234),
                None
            )
        );
        let inv = completion(
            &BiWc {
                flags: ffi::WC_INV,
                imm: 66,
                opcode: 4,
                status: 5,
                ..BiWc::default()
            },
            ConnId(1),
        );
        assert_eq!(
            (inv.status, inv.imm, inv.invalidated_rkey),
            (WcStatus::WrFlushErr, None, Some(Rkey(66)))
        );
        assert_eq!(status(200), WcStatus::GeneralErr);
    }
}
