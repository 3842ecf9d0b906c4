//! The C layer's functions and structures (`shim/brick_ibv.h`; keep the
//! two in step). Every structure is Brick's own and padding-free, so these
//! `#[repr(C)]` mirrors match it field for field; the sizes are asserted
//! below. libibverbs' and librdmacm's own structures stay opaque.

#![allow(missing_docs)]

use core::ffi::{c_char, c_int, c_void};

pub const MAX_SGE: usize = 4;
pub const POST_MAX: usize = 16;
pub const POLL_MAX: usize = 64;
pub const PRIVATE_DATA_MAX: usize = 196;

pub const ACCESS_LOCAL_WRITE: u8 = 1;
pub const ACCESS_REMOTE_WRITE: u8 = 2;
pub const ACCESS_REMOTE_READ: u8 = 4;

pub const OP_SEND: u8 = 0;
pub const OP_SEND_WITH_IMM: u8 = 1;
pub const OP_SEND_WITH_INV: u8 = 2;
pub const OP_RDMA_WRITE: u8 = 3;
pub const OP_RDMA_WRITE_WITH_IMM: u8 = 4;
pub const OP_RDMA_READ: u8 = 5;
pub const OP_LOCAL_INV: u8 = 6;

pub const WC_IMM: u8 = 1;
pub const WC_INV: u8 = 2;

pub const EV_ADDR_RESOLVED: u8 = 0;
pub const EV_ROUTE_RESOLVED: u8 = 1;
pub const EV_CONNECT_REQUEST: u8 = 2;
pub const EV_ESTABLISHED: u8 = 3;
pub const EV_REJECTED: u8 = 4;
pub const EV_DISCONNECTED: u8 = 5;
pub const EV_TIMEWAIT_EXIT: u8 = 6;
pub const EV_UNREACHABLE: u8 = 7;
pub const EV_DEVICE_REMOVAL: u8 = 8;

/// Opaque librdmacm / libibverbs objects.
#[repr(C)]
pub struct Channel {
    _private: [u8; 0],
}
#[repr(C)]
pub struct CmId {
    _private: [u8; 0],
}
#[repr(C)]
pub struct Context {
    _private: [u8; 0],
}
#[repr(C)]
pub struct Pd {
    _private: [u8; 0],
}
#[repr(C)]
pub struct Cq {
    _private: [u8; 0],
}
#[repr(C)]
pub struct CompChannel {
    _private: [u8; 0],
}
#[repr(C)]
pub struct Mr {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct BiSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct BiSend {
    pub wr_id: u64,
    pub remote_addr: u64,
    pub rkey: u32,
    pub imm: u32,
    pub opcode: u8,
    pub signaled: u8,
    pub num_sge: u8,
    pub pad: [u8; 5],
    pub sge: [BiSge; MAX_SGE],
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct BiRecv {
    pub wr_id: u64,
    pub num_sge: u8,
    pub pad: [u8; 7],
    pub sge: [BiSge; MAX_SGE],
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct BiWc {
    pub wr_id: u64,
    pub byte_len: u32,
    pub qp_num: u32,
    pub imm: u32,
    pub raw_status: u32,
    pub status: u8,
    pub opcode: u8,
    pub flags: u8,
    pub pad: [u8; 5],
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct BiLimits {
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_qp_rd_atom: u32,
    pub max_cq: u32,
}

#[repr(C)]
pub struct BiConnParam {
    pub private_data: *const u8,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub pad: [u8; 3],
}

#[repr(C)]
pub struct BiEvent {
    pub id: *mut CmId,
    pub listen_id: *mut CmId,
    pub status: i32,
    pub raw_event: i32,
    pub local_ip: u32,
    pub remote_ip: u32,
    pub local_port: u16,
    pub remote_port: u16,
    pub event: u8,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub private_data: [u8; PRIVATE_DATA_MAX],
}

impl BiEvent {
    pub const fn zeroed() -> Self {
        Self {
            id: core::ptr::null_mut(),
            listen_id: core::ptr::null_mut(),
            status: 0,
            raw_event: 0,
            local_ip: 0,
            remote_ip: 0,
            local_port: 0,
            remote_port: 0,
            event: 0,
            private_data_len: 0,
            responder_resources: 0,
            initiator_depth: 0,
            private_data: [0; PRIVATE_DATA_MAX],
        }
    }
}

const _: () = {
    assert!(core::mem::size_of::<BiSge>() == 16);
    assert!(core::mem::size_of::<BiSend>() == 32 + 16 * MAX_SGE);
    assert!(core::mem::size_of::<BiRecv>() == 16 + 16 * MAX_SGE);
    assert!(core::mem::size_of::<BiWc>() == 32);
    assert!(core::mem::size_of::<BiLimits>() == 28);
    assert!(core::mem::size_of::<BiConnParam>() == 16);
    assert!(core::mem::size_of::<BiEvent>() == 240);
};

extern "C" {
    pub fn bi_channel(err: *mut c_int) -> *mut Channel;
    pub fn bi_channel_destroy(ch: *mut Channel);
    pub fn bi_channel_fd(ch: *mut Channel) -> c_int;
    pub fn bi_listen(
        ch: *mut Channel,
        ip_be: u32,
        port: u16,
        backlog: c_int,
        out: *mut *mut CmId,
    ) -> c_int;
    pub fn bi_bind(ch: *mut Channel, ip_be: u32, out: *mut *mut CmId) -> c_int;
    pub fn bi_id_context(id: *mut CmId) -> *mut Context;
    pub fn bi_id_port(id: *mut CmId) -> u8;
    pub fn bi_device_name(ctx: *mut Context) -> *const c_char;
    pub fn bi_device_limits(ctx: *mut Context, out: *mut BiLimits) -> c_int;
    pub fn bi_alloc_pd(ctx: *mut Context) -> *mut Pd;
    pub fn bi_dealloc_pd(pd: *mut Pd) -> c_int;
    pub fn bi_comp_channel(ctx: *mut Context) -> *mut CompChannel;
    pub fn bi_comp_fd(ch: *mut CompChannel) -> c_int;
    pub fn bi_destroy_comp_channel(ch: *mut CompChannel) -> c_int;
    pub fn bi_create_cq(ctx: *mut Context, entries: c_int, ch: *mut CompChannel) -> *mut Cq;
    pub fn bi_arm_cq(cq: *mut Cq) -> c_int;
    pub fn bi_drain_comp_events(ch: *mut CompChannel) -> c_int;
    pub fn bi_destroy_cq(cq: *mut Cq) -> c_int;
    pub fn bi_reg_mr(
        pd: *mut Pd,
        addr: *mut c_void,
        len: usize,
        access: u8,
        lkey: *mut u32,
        rkey: *mut u32,
    ) -> *mut Mr;
    pub fn bi_dereg_mr(mr: *mut Mr) -> c_int;
    pub fn bi_create_qp(
        id: *mut CmId,
        pd: *mut Pd,
        cq: *mut Cq,
        send_depth: u32,
        recv_depth: u32,
        max_sge: u32,
        qp_num: *mut u32,
    ) -> c_int;
    pub fn bi_accept(id: *mut CmId, param: *const BiConnParam) -> c_int;
    pub fn bi_connect(id: *mut CmId, param: *const BiConnParam) -> c_int;
    pub fn bi_reject(id: *mut CmId, data: *const u8, len: u8) -> c_int;
    pub fn bi_disconnect(id: *mut CmId) -> c_int;
    pub fn bi_destroy(id: *mut CmId) -> c_int;
    pub fn bi_resolve(
        ch: *mut Channel,
        src_be: u32,
        dst_be: u32,
        port: u16,
        timeout_ms: c_int,
        out: *mut *mut CmId,
    ) -> c_int;
    pub fn bi_resolve_route(id: *mut CmId, timeout_ms: c_int) -> c_int;
    pub fn bi_get_event(ch: *mut Channel, out: *mut BiEvent) -> c_int;
    pub fn bi_post_send(qp_id: *mut CmId, wrs: *const BiSend, n: c_int) -> c_int;
    pub fn bi_post_recv(qp_id: *mut CmId, wrs: *const BiRecv, n: c_int) -> c_int;
    pub fn bi_poll_cq(cq: *mut Cq, out: *mut BiWc, n: c_int) -> c_int;
    pub fn bi_wc_status_str(status: c_int) -> *const c_char;
    pub fn bi_event_str(event: c_int) -> *const c_char;
}
