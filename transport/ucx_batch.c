/* UCX backend: batches. One-sided: the puts, an endpoint flush (every put
 * is then complete in the peer's memory), then the completion message.
 * Two-sided: each slice as an eager active message, the completion after
 * the last one on the same endpoint. Reads: one get per range, the batch
 * ending when the last completes. */
#include "ucx_internal.h"

#include "kvf/clock.h"
#include "kvf/log.h"

#include <stdlib.h>

static void fin_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    kvf_xfer_batch_t *b = user_data;
    b->backend_busy--;
    ucp_request_free(request);
    if (status == UCS_OK)
        kvf_xfer__peer_progressed(b->peer);
    if (status == UCS_OK)
        kvf_xfer__batch_end(b, KVF_OK);
    else
        kvf_xfer__peer_fail(b->peer, KVF_ERR_PEER);
}

static void fin_send(kvf_xfer_batch_t *b)
{
    ucx_peer_t *up = b->peer->be;
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = fin_sent_cb,
        .user_data = b,
        .flags = UCP_AM_SEND_FLAG_EAGER,
    };
    void *req = ucp_am_send_nbx(up->ep, KVF_UCX_AM_FIN, NULL, 0, b->fin, b->fin_len, &param);
    if (req == NULL) {
        kvf_xfer__batch_end(b, KVF_OK);
    } else if (UCS_PTR_IS_ERR(req)) {
        kvf_log_error("xfer/ucx: sending the completion message failed: %s",
                      ucs_status_string(UCS_PTR_STATUS(req)));
        kvf_xfer__peer_fail(b->peer, KVF_ERR_PEER);
    } else {
        b->backend_busy++;
    }
}

static void flush_cb(void *request, ucs_status_t status, void *user_data)
{
    kvf_xfer_batch_t *b = user_data;
    b->backend_busy--;
    ucp_request_free(request);
    if (b->status != KVF_ERR_AGAIN)
        return;
    if (status != UCS_OK) {
        kvf_xfer__peer_fail(b->peer, KVF_ERR_PEER);
        return;
    }
    kvf_xfer__peer_progressed(b->peer);
    fin_send(b);
}

/* A put completed: the connection moves (its batch's flush follows). */
static void put_done_cb(void *request, ucs_status_t status, void *user_data)
{
    kvf_xfer_batch_t *b = user_data;
    b->backend_busy--;
    ucp_request_free(request);
    if (status == UCS_OK)
        kvf_xfer__peer_progressed(b->peer);
}

/* Two-sided batches: the slices' message headers (they must live until
 * each send completes) and how many sends are still out. */
typedef struct {
    uint8_t *headers; /* (n_ranges, KVF_UCX_DATA_HDR) */
    size_t pending;
} ucx_batch_t;

static void data_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    kvf_xfer_batch_t *b = user_data;
    ucx_batch_t *ub = b->be;
    b->backend_busy--;
    ucp_request_free(request);
    if (status != UCS_OK) {
        kvf_xfer__peer_fail(b->peer, KVF_ERR_PEER);
        return;
    }
    kvf_xfer__peer_progressed(b->peer);
    /* The completion follows the slices on the same endpoint, so the
     * receiver handles it after them. */
    if (--ub->pending == 0 && b->status == KVF_ERR_AGAIN)
        fin_send(b);
}

static kvf_status_t post_two_sided(kvf_xfer_batch_t *b)
{
    kvf_xfer_peer_t *p = b->peer;
    ucx_peer_t *up = p->be;
    ucx_batch_t *ub = calloc(1, sizeof(*ub));
    if (!ub)
        return KVF_ERR_NOMEM;
    ub->headers = malloc(b->n_ranges ? b->n_ranges * KVF_UCX_DATA_HDR : 1);
    if (!ub->headers) {
        free(ub);
        return KVF_ERR_NOMEM;
    }
    b->be = ub;
    const uint8_t *pool = p->xfer->pool;
    for (size_t i = 0; i < b->n_ranges; i++) {
        const kvf_xfer_slice_t *s = &b->ranges[i];
        uint8_t *h = ub->headers + i * KVF_UCX_DATA_HDR;
        xfer_put_u64(h, b->req_id);
        xfer_put_u64(h + 8, b->epoch);
        xfer_put_u64(h + 16, s->remote_off);
        xfer_put_u64(h + 24, s->len);
        /* Eager only: a rendezvous would have the receiver answer the
         * sender, the exchange two-sided mode exists to avoid. */
        ucp_request_param_t param = {
            .op_attr_mask =
                UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
            .cb.send = data_sent_cb,
            .user_data = b,
            .flags = UCP_AM_SEND_FLAG_EAGER,
        };
        void *req = ucp_am_send_nbx(up->ep, KVF_UCX_AM_DATA, h, KVF_UCX_DATA_HDR,
                                    pool + s->local_off, s->len, &param);
        if (UCS_PTR_IS_ERR(req)) {
            kvf_log_error("xfer/ucx: sending a %llu-byte slice failed: %s",
                          (unsigned long long)s->len, ucs_status_string(UCS_PTR_STATUS(req)));
            kvf_xfer__peer_fail(p, KVF_ERR_PEER);
            return p->status;
        }
        if (req) {
            b->backend_busy++;
            ub->pending++;
        }
    }
    if (!ub->pending)
        fin_send(b);
    return KVF_OK;
}

void kvf_ucx__batch_free(kvf_xfer_batch_t *b)
{
    ucx_batch_t *ub = b->be;
    if (ub) {
        free(ub->headers);
        free(ub);
    }
    b->be = NULL;
}

kvf_status_t kvf_ucx__post(kvf_xfer_batch_t *b)
{
    kvf_xfer_peer_t *p = b->peer;
    if (p->two_sided)
        return post_two_sided(b);
    ucx_peer_t *up = p->be;
    ucx_xfer_t *u = p->xfer->be;
    const uint8_t *pool = p->xfer->pool;
    ucp_request_param_t put = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA,
        .memory_type = u->mem_type,
        .cb.send = put_done_cb,
        .user_data = b,
    };
    for (size_t i = 0; i < b->n_ranges; i++) {
        const kvf_xfer_slice_t *s = &b->ranges[i];
        void *req = ucp_put_nbx(up->ep, pool + s->local_off, s->len, p->remote_base + s->remote_off,
                                up->rkey, &put);
        if (UCS_PTR_IS_ERR(req)) {
            kvf_log_error("xfer/ucx: put of %llu bytes failed: %s", (unsigned long long)s->len,
                          ucs_status_string(UCS_PTR_STATUS(req)));
            kvf_xfer__peer_fail(p, KVF_ERR_PEER);
            return p->status;
        }
        if (req)
            b->backend_busy++; /* put_done_cb */
        else
            kvf_xfer__peer_progressed(p);
    }
    /* The flush completes once every put issued on the endpoint so far is
     * complete in the peer's memory; only then may the completion go. */
    ucp_request_param_t fl = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = flush_cb,
        .user_data = b,
    };
    void *req = ucp_ep_flush_nbx(up->ep, &fl);
    if (req == NULL) {
        fin_send(b);
    } else if (UCS_PTR_IS_ERR(req)) {
        kvf_log_error("xfer/ucx: flush failed: %s", ucs_status_string(UCS_PTR_STATUS(req)));
        kvf_xfer__peer_fail(p, KVF_ERR_PEER);
        return p->status;
    } else {
        b->backend_busy++;
    }
    return KVF_OK;
}

/* ---- reads ---- */

/* Every get of b completed: OK only within its lease. */
static void get_end(kvf_xfer_batch_t *b)
{
    bool late = b->not_after_ns && kvf_clock_ns() >= b->not_after_ns;
    kvf_xfer__batch_end(b, late ? KVF_ERR_TIMEOUT : KVF_OK);
}

static void get_done_cb(void *request, ucs_status_t status, void *user_data)
{
    kvf_xfer_batch_t *b = user_data;
    b->backend_busy--;
    ucp_request_free(request);
    if (status != UCS_OK) {
        kvf_xfer__peer_fail(b->peer, KVF_ERR_PEER);
        return;
    }
    kvf_xfer__peer_progressed(b->peer);
    if (!b->backend_busy)
        get_end(b);
}

kvf_status_t kvf_ucx__get(kvf_xfer_batch_t *b)
{
    kvf_xfer_peer_t *p = b->peer;
    ucx_peer_t *up = p->be;
    ucx_xfer_t *u = p->xfer->be;
    uint8_t *pool = p->xfer->pool;
    ucp_request_param_t get = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA,
        .memory_type = u->mem_type,
        .cb.send = get_done_cb,
        .user_data = b,
    };
    for (size_t i = 0; i < b->n_ranges; i++) {
        const kvf_xfer_slice_t *s = &b->ranges[i];
        void *req = ucp_get_nbx(up->ep, pool + s->local_off, s->len, p->remote_base + s->remote_off,
                                up->rkey, &get);
        if (UCS_PTR_IS_ERR(req)) {
            kvf_log_error("xfer/ucx: get of %llu bytes failed: %s", (unsigned long long)s->len,
                          ucs_status_string(UCS_PTR_STATUS(req)));
            kvf_xfer__peer_fail(p, KVF_ERR_PEER);
            return p->status;
        }
        if (req)
            b->backend_busy++; /* get_done_cb */
        else
            kvf_xfer__peer_progressed(p);
    }
    if (!b->backend_busy)
        get_end(b);
    return KVF_OK;
}
