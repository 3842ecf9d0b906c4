/*
 * Flat structures and codes shared by brick_ibv.c and the Rust provider
 * (verbs-ibv/src/ffi.rs mirrors this file; keep the two in step). Every
 * structure here is Brick's own, with fixed-width fields in an order that
 * leaves no padding, so `#[repr(C)]` in Rust lays it out identically.
 */
#ifndef BRICK_IBV_H
#define BRICK_IBV_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stddef.h>
#include <stdint.h>

#define BI_MAX_SGE 4
#define BI_POST_MAX 16
#define BI_POLL_MAX 64
#define BI_PRIVATE_DATA_MAX 196

#define BI_ACCESS_LOCAL_WRITE 1
#define BI_ACCESS_REMOTE_WRITE 2
#define BI_ACCESS_REMOTE_READ 4

#define BI_OP_SEND 0
#define BI_OP_SEND_WITH_IMM 1
#define BI_OP_SEND_WITH_INV 2
#define BI_OP_RDMA_WRITE 3
#define BI_OP_RDMA_WRITE_WITH_IMM 4
#define BI_OP_RDMA_READ 5
#define BI_OP_LOCAL_INV 6

#define BI_WC_IMM 1
#define BI_WC_INV 2

#define BI_WC_SUCCESS 0
#define BI_WC_LOC_LEN_ERR 1
#define BI_WC_LOC_QP_OP_ERR 2
#define BI_WC_LOC_PROT_ERR 3
#define BI_WC_LOC_ACCESS_ERR 4
#define BI_WC_WR_FLUSH_ERR 5
#define BI_WC_BAD_RESP_ERR 6
#define BI_WC_REM_INV_REQ_ERR 7
#define BI_WC_REM_ACCESS_ERR 8
#define BI_WC_REM_OP_ERR 9
#define BI_WC_RETRY_EXC_ERR 10
#define BI_WC_RNR_RETRY_EXC_ERR 11
#define BI_WC_GENERAL_ERR 12

#define BI_WC_OP_SEND 0
#define BI_WC_OP_RDMA_WRITE 1
#define BI_WC_OP_RDMA_READ 2
#define BI_WC_OP_LOCAL_INV 3
#define BI_WC_OP_RECV 4
#define BI_WC_OP_RECV_RDMA_WITH_IMM 5
#define BI_WC_OP_OTHER 6

#define BI_EV_ADDR_RESOLVED 0
#define BI_EV_ROUTE_RESOLVED 1
#define BI_EV_CONNECT_REQUEST 2
#define BI_EV_ESTABLISHED 3
#define BI_EV_REJECTED 4
#define BI_EV_DISCONNECTED 5
#define BI_EV_TIMEWAIT_EXIT 6
#define BI_EV_UNREACHABLE 7
#define BI_EV_DEVICE_REMOVAL 8
#define BI_EV_OTHER 9

struct bi_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct bi_send {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint32_t rkey; /* remote key, or the key to invalidate */
	uint32_t imm;  /* host order */
	uint8_t opcode;
	uint8_t signaled;
	uint8_t num_sge;
	uint8_t pad[5];
	struct bi_sge sge[BI_MAX_SGE];
};

struct bi_recv {
	uint64_t wr_id;
	uint8_t num_sge;
	uint8_t pad[7];
	struct bi_sge sge[BI_MAX_SGE];
};

struct bi_wc {
	uint64_t wr_id;
	uint32_t byte_len;
	uint32_t qp_num;
	uint32_t imm; /* host order; the invalidated rkey with BI_WC_INV */
	uint32_t raw_status;
	uint8_t status;
	uint8_t opcode;
	uint8_t flags;
	uint8_t pad[5];
};

struct bi_limits {
	uint32_t max_qp;
	uint32_t max_qp_wr;
	uint32_t max_sge;
	uint32_t max_cqe;
	uint32_t max_mr;
	uint32_t max_qp_rd_atom;
	uint32_t max_cq;
};

struct bi_conn_param {
	const uint8_t *private_data;
	uint8_t private_data_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
	uint8_t pad[3];
};

struct bi_event {
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	int32_t status;
	int32_t raw_event;
	uint32_t local_ip;  /* network order */
	uint32_t remote_ip; /* network order */
	uint16_t local_port;
	uint16_t remote_port;
	uint8_t event;
	uint8_t private_data_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t private_data[BI_PRIVATE_DATA_MAX];
};

#endif
