/*
 * The small C layer between Brick's verbs provider and libibverbs/librdmacm.
 *
 * libibverbs' data-path calls (ibv_post_send, ibv_post_recv, ibv_poll_cq)
 * are inline functions that go through the provider's ops table, and the
 * structures they take have layouts only the installed headers define. This
 * file compiles against those headers, so Rust never lays out a libibverbs
 * structure itself: it passes the flat, fixed structures declared in
 * brick_ibv.h and receives the same back. Nothing here allocates or blocks;
 * the event channel is non-blocking.
 */
#include "brick_ibv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>

static int errno_or(int fallback) { return errno ? -errno : -fallback; }

struct rdma_event_channel *bi_channel(int *err) {
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch) {
		*err = errno_or(ENODEV);
		return NULL;
	}
	int flags = fcntl(ch->fd, F_GETFL);
	if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		*err = errno_or(EINVAL);
		rdma_destroy_event_channel(ch);
		return NULL;
	}
	*err = 0;
	return ch;
}

void bi_channel_destroy(struct rdma_event_channel *ch) { rdma_destroy_event_channel(ch); }

int bi_channel_fd(struct rdma_event_channel *ch) { return ch->fd; }

static void fill_sin(struct sockaddr_in *sin, uint32_t ip_be, uint16_t port) {
	memset(sin, 0, sizeof(*sin));
	sin->sin_family = AF_INET;
	sin->sin_addr.s_addr = ip_be;
	sin->sin_port = htons(port);
}

int bi_listen(struct rdma_event_channel *ch, uint32_t ip_be, uint16_t port, int backlog,
	      struct rdma_cm_id **out) {
	struct rdma_cm_id *id;
	struct sockaddr_in sin;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		return errno_or(ENOMEM);
	fill_sin(&sin, ip_be, port);
	if (rdma_bind_addr(id, (struct sockaddr *)&sin) || rdma_listen(id, backlog)) {
		int err = errno_or(EADDRINUSE);
		rdma_destroy_id(id);
		return err;
	}
	*out = id;
	return 0;
}

int bi_bind(struct rdma_event_channel *ch, uint32_t ip_be, struct rdma_cm_id **out) {
	struct rdma_cm_id *id;
	struct sockaddr_in sin;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		return errno_or(ENOMEM);
	fill_sin(&sin, ip_be, 0);
	if (rdma_bind_addr(id, (struct sockaddr *)&sin)) {
		int err = errno_or(EADDRNOTAVAIL);
		rdma_destroy_id(id);
		return err;
	}
	*out = id;
	return 0;
}

struct ibv_context *bi_id_context(struct rdma_cm_id *id) { return id->verbs; }

uint8_t bi_id_port(struct rdma_cm_id *id) { return id->port_num; }

const char *bi_device_name(struct ibv_context *ctx) { return ibv_get_device_name(ctx->device); }

int bi_device_limits(struct ibv_context *ctx, struct bi_limits *out) {
	struct ibv_device_attr attr;
	int err = ibv_query_device(ctx, &attr);
	if (err)
		return -err;
	out->max_qp = (uint32_t)attr.max_qp;
	out->max_qp_wr = (uint32_t)attr.max_qp_wr;
	out->max_sge = (uint32_t)attr.max_sge;
	out->max_cqe = (uint32_t)attr.max_cqe;
	out->max_mr = (uint32_t)attr.max_mr;
	out->max_qp_rd_atom = (uint32_t)attr.max_qp_rd_atom;
	out->max_cq = (uint32_t)attr.max_cq;
	return 0;
}

struct ibv_pd *bi_alloc_pd(struct ibv_context *ctx) { return ibv_alloc_pd(ctx); }

int bi_dealloc_pd(struct ibv_pd *pd) { return -ibv_dealloc_pd(pd); }

struct ibv_comp_channel *bi_comp_channel(struct ibv_context *ctx) {
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	if (!ch)
		return NULL;
	int flags = fcntl(ch->fd, F_GETFL);
	if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		ibv_destroy_comp_channel(ch);
		return NULL;
	}
	return ch;
}

int bi_comp_fd(struct ibv_comp_channel *ch) { return ch->fd; }

int bi_destroy_comp_channel(struct ibv_comp_channel *ch) { return -ibv_destroy_comp_channel(ch); }

struct ibv_cq *bi_create_cq(struct ibv_context *ctx, int entries, struct ibv_comp_channel *ch) {
	return ibv_create_cq(ctx, entries, NULL, ch, 0);
}

int bi_arm_cq(struct ibv_cq *cq) { return -ibv_req_notify_cq(cq, 0); }

int bi_drain_comp_events(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *context;
	int n = 0;
	while (ibv_get_cq_event(ch, &cq, &context) == 0) {
		ibv_ack_cq_events(cq, 1);
		n++;
	}
	return n;
}

int bi_destroy_cq(struct ibv_cq *cq) { return -ibv_destroy_cq(cq); }

static int access_bits(uint8_t access) {
	int flags = 0;
	if (access & BI_ACCESS_LOCAL_WRITE)
		flags |= IBV_ACCESS_LOCAL_WRITE;
	if (access & BI_ACCESS_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	if (access & BI_ACCESS_REMOTE_READ)
		flags |= IBV_ACCESS_REMOTE_READ;
	return flags;
}

struct ibv_mr *bi_reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint8_t access,
			 uint32_t *lkey, uint32_t *rkey) {
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access_bits(access));
	if (mr) {
		*lkey = mr->lkey;
		*rkey = mr->rkey;
	}
	return mr;
}

int bi_dereg_mr(struct ibv_mr *mr) { return -ibv_dereg_mr(mr); }

int bi_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq, uint32_t send_depth,
		 uint32_t recv_depth, uint32_t max_sge, uint32_t *qp_num) {
	struct ibv_qp_init_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.cap.max_send_wr = send_depth;
	attr.cap.max_recv_wr = recv_depth;
	attr.cap.max_send_sge = max_sge;
	attr.cap.max_recv_sge = max_sge;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	if (rdma_create_qp(id, pd, &attr))
		return errno_or(ENOMEM);
	*qp_num = id->qp->qp_num;
	return 0;
}

static void fill_param(struct rdma_conn_param *p, const struct bi_conn_param *c) {
	memset(p, 0, sizeof(*p));
	p->private_data = c->private_data;
	p->private_data_len = c->private_data_len;
	p->responder_resources = c->responder_resources;
	p->initiator_depth = c->initiator_depth;
	p->retry_count = c->retry_count;
	p->rnr_retry_count = c->rnr_retry_count;
}

int bi_accept(struct rdma_cm_id *id, const struct bi_conn_param *c) {
	struct rdma_conn_param p;
	fill_param(&p, c);
	return rdma_accept(id, &p) ? errno_or(EINVAL) : 0;
}

int bi_connect(struct rdma_cm_id *id, const struct bi_conn_param *c) {
	struct rdma_conn_param p;
	fill_param(&p, c);
	return rdma_connect(id, &p) ? errno_or(EINVAL) : 0;
}

int bi_reject(struct rdma_cm_id *id, const uint8_t *data, uint8_t len) {
	return rdma_reject(id, data, len) ? errno_or(EINVAL) : 0;
}

int bi_disconnect(struct rdma_cm_id *id) { return rdma_disconnect(id) ? errno_or(EINVAL) : 0; }

int bi_destroy(struct rdma_cm_id *id) {
	if (id->qp)
		rdma_destroy_qp(id);
	return rdma_destroy_id(id) ? errno_or(EINVAL) : 0;
}

int bi_resolve(struct rdma_event_channel *ch, uint32_t src_be, uint32_t dst_be, uint16_t port,
	       int timeout_ms, struct rdma_cm_id **out) {
	struct rdma_cm_id *id;
	struct sockaddr_in src, dst;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		return errno_or(ENOMEM);
	fill_sin(&src, src_be, 0);
	fill_sin(&dst, dst_be, port);
	if (rdma_resolve_addr(id, src_be ? (struct sockaddr *)&src : NULL, (struct sockaddr *)&dst,
			      timeout_ms)) {
		int err = errno_or(EHOSTUNREACH);
		rdma_destroy_id(id);
		return err;
	}
	*out = id;
	return 0;
}

int bi_resolve_route(struct rdma_cm_id *id, int timeout_ms) {
	return rdma_resolve_route(id, timeout_ms) ? errno_or(EHOSTUNREACH) : 0;
}

static void copy_addr(struct sockaddr *sa, uint32_t *ip, uint16_t *port) {
	if (sa && sa->sa_family == AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)sa;
		*ip = sin->sin_addr.s_addr;
		*port = ntohs(sin->sin_port);
	} else {
		*ip = 0;
		*port = 0;
	}
}

static uint8_t event_code(enum rdma_cm_event_type e) {
	switch (e) {
	case RDMA_CM_EVENT_ADDR_RESOLVED: return BI_EV_ADDR_RESOLVED;
	case RDMA_CM_EVENT_ROUTE_RESOLVED: return BI_EV_ROUTE_RESOLVED;
	case RDMA_CM_EVENT_CONNECT_REQUEST: return BI_EV_CONNECT_REQUEST;
	case RDMA_CM_EVENT_ESTABLISHED: return BI_EV_ESTABLISHED;
	case RDMA_CM_EVENT_REJECTED: return BI_EV_REJECTED;
	case RDMA_CM_EVENT_DISCONNECTED: return BI_EV_DISCONNECTED;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT: return BI_EV_TIMEWAIT_EXIT;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE: return BI_EV_UNREACHABLE;
	case RDMA_CM_EVENT_DEVICE_REMOVAL: return BI_EV_DEVICE_REMOVAL;
	default: return BI_EV_OTHER;
	}
}

int bi_get_event(struct rdma_event_channel *ch, struct bi_event *out) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return errno_or(EIO);
	}
	memset(out, 0, sizeof(*out));
	out->event = event_code(ev->event);
	out->raw_event = ev->event;
	out->status = ev->status;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	const struct rdma_conn_param *p = &ev->param.conn;
	if (p->private_data && p->private_data_len) {
		uint8_t len = p->private_data_len > BI_PRIVATE_DATA_MAX ? BI_PRIVATE_DATA_MAX
									: p->private_data_len;
		memcpy(out->private_data, p->private_data, len);
		out->private_data_len = len;
	}
	out->responder_resources = p->responder_resources;
	out->initiator_depth = p->initiator_depth;
	copy_addr(rdma_get_local_addr(ev->id), &out->local_ip, &out->local_port);
	copy_addr(rdma_get_peer_addr(ev->id), &out->remote_ip, &out->remote_port);
	rdma_ack_cm_event(ev);
	return 1;
}

static enum ibv_wr_opcode wr_opcode(uint8_t op) {
	switch (op) {
	case BI_OP_SEND_WITH_IMM:
		return IBV_WR_SEND_WITH_IMM;
	case BI_OP_SEND_WITH_INV:
		return IBV_WR_SEND_WITH_INV;
	case BI_OP_RDMA_WRITE:
		return IBV_WR_RDMA_WRITE;
	case BI_OP_RDMA_WRITE_WITH_IMM:
		return IBV_WR_RDMA_WRITE_WITH_IMM;
	case BI_OP_RDMA_READ:
		return IBV_WR_RDMA_READ;
	case BI_OP_LOCAL_INV:
		return IBV_WR_LOCAL_INV;
	default:
		return IBV_WR_SEND;
	}
}

int bi_post_send(struct rdma_cm_id *id, const struct bi_send *wrs, int n) {
	struct ibv_send_wr wr[BI_POST_MAX];
	struct ibv_sge sge[BI_POST_MAX][BI_MAX_SGE];
	struct ibv_send_wr *bad = NULL;
	if (n <= 0 || n > BI_POST_MAX)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		const struct bi_send *s = &wrs[i];
		memset(&wr[i], 0, sizeof(wr[i]));
		if (s->num_sge > BI_MAX_SGE)
			return -EINVAL;
		for (int j = 0; j < s->num_sge; j++) {
			sge[i][j].addr = s->sge[j].addr;
			sge[i][j].length = s->sge[j].length;
			sge[i][j].lkey = s->sge[j].lkey;
		}
		wr[i].wr_id = s->wr_id;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		wr[i].sg_list = s->num_sge ? sge[i] : NULL;
		wr[i].num_sge = s->num_sge;
		wr[i].opcode = wr_opcode(s->opcode);
		wr[i].send_flags = s->signaled ? IBV_SEND_SIGNALED : 0;
		switch (s->opcode) {
		case BI_OP_SEND_WITH_IMM:
		case BI_OP_RDMA_WRITE_WITH_IMM:
			wr[i].imm_data = htonl(s->imm);
			break;
		case BI_OP_SEND_WITH_INV:
		case BI_OP_LOCAL_INV:
			wr[i].invalidate_rkey = s->rkey;
			break;
		default:
			break;
		}
		if (s->opcode == BI_OP_RDMA_WRITE || s->opcode == BI_OP_RDMA_WRITE_WITH_IMM ||
		    s->opcode == BI_OP_RDMA_READ) {
			wr[i].wr.rdma.remote_addr = s->remote_addr;
			wr[i].wr.rdma.rkey = s->rkey;
		}
	}
	if (!id->qp)
		return -ENOTCONN;
	return -ibv_post_send(id->qp, wr, &bad);
}

int bi_post_recv(struct rdma_cm_id *id, const struct bi_recv *wrs, int n) {
	struct ibv_recv_wr wr[BI_POST_MAX];
	struct ibv_sge sge[BI_POST_MAX][BI_MAX_SGE];
	struct ibv_recv_wr *bad = NULL;
	if (n <= 0 || n > BI_POST_MAX)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		const struct bi_recv *r = &wrs[i];
		memset(&wr[i], 0, sizeof(wr[i]));
		if (r->num_sge > BI_MAX_SGE)
			return -EINVAL;
		for (int j = 0; j < r->num_sge; j++) {
			sge[i][j].addr = r->sge[j].addr;
			sge[i][j].length = r->sge[j].length;
			sge[i][j].lkey = r->sge[j].lkey;
		}
		wr[i].wr_id = r->wr_id;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		wr[i].sg_list = r->num_sge ? sge[i] : NULL;
		wr[i].num_sge = r->num_sge;
	}
	if (!id->qp)
		return -ENOTCONN;
	return -ibv_post_recv(id->qp, wr, &bad);
}

static uint8_t wc_status(enum ibv_wc_status st) {
	switch (st) {
	case IBV_WC_SUCCESS: return BI_WC_SUCCESS;
	case IBV_WC_LOC_LEN_ERR: return BI_WC_LOC_LEN_ERR;
	case IBV_WC_LOC_QP_OP_ERR: return BI_WC_LOC_QP_OP_ERR;
	case IBV_WC_LOC_PROT_ERR: return BI_WC_LOC_PROT_ERR;
	case IBV_WC_LOC_ACCESS_ERR: return BI_WC_LOC_ACCESS_ERR;
	case IBV_WC_WR_FLUSH_ERR: return BI_WC_WR_FLUSH_ERR;
	case IBV_WC_BAD_RESP_ERR: return BI_WC_BAD_RESP_ERR;
	case IBV_WC_REM_INV_REQ_ERR: return BI_WC_REM_INV_REQ_ERR;
	case IBV_WC_REM_ACCESS_ERR: return BI_WC_REM_ACCESS_ERR;
	case IBV_WC_REM_OP_ERR: return BI_WC_REM_OP_ERR;
	case IBV_WC_RETRY_EXC_ERR: return BI_WC_RETRY_EXC_ERR;
	case IBV_WC_RNR_RETRY_EXC_ERR: return BI_WC_RNR_RETRY_EXC_ERR;
	default: return BI_WC_GENERAL_ERR;
	}
}

static uint8_t wc_opcode(enum ibv_wc_opcode op) {
	switch (op) {
	case IBV_WC_SEND: return BI_WC_OP_SEND;
	case IBV_WC_RDMA_WRITE: return BI_WC_OP_RDMA_WRITE;
	case IBV_WC_RDMA_READ: return BI_WC_OP_RDMA_READ;
	case IBV_WC_LOCAL_INV: return BI_WC_OP_LOCAL_INV;
	case IBV_WC_RECV: return BI_WC_OP_RECV;
	case IBV_WC_RECV_RDMA_WITH_IMM: return BI_WC_OP_RECV_RDMA_WITH_IMM;
	default: return BI_WC_OP_OTHER;
	}
}

int bi_poll_cq(struct ibv_cq *cq, struct bi_wc *out, int n) {
	struct ibv_wc wc[BI_POLL_MAX];
	if (n > BI_POLL_MAX)
		n = BI_POLL_MAX;
	int got = ibv_poll_cq(cq, n, wc);
	if (got < 0)
		return got;
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc_status(wc[i].status);
		out[i].raw_status = wc[i].status;
		out[i].opcode = wc_opcode(wc[i].opcode);
		out[i].byte_len = wc[i].byte_len;
		out[i].qp_num = wc[i].qp_num;
		out[i].flags = 0;
		out[i].imm = 0;
		if (wc[i].wc_flags & IBV_WC_WITH_IMM) {
			out[i].flags |= BI_WC_IMM;
			out[i].imm = ntohl(wc[i].imm_data);
		} else if (wc[i].wc_flags & IBV_WC_WITH_INV) {
			out[i].flags |= BI_WC_INV;
			out[i].imm = wc[i].invalidated_rkey;
		}
	}
	return got;
}

const char *bi_wc_status_str(int status) { return ibv_wc_status_str((enum ibv_wc_status)status); }

const char *bi_event_str(int event) { return rdma_event_str((enum rdma_cm_event_type)event); }
