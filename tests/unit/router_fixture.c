/* See router_fixture.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "../../transport/xfer_internal.h"
#include "metrics.h"
#include "router_fixture.h"

int rfx_setup(void **state, unsigned queue_timeout_ms, unsigned request_timeout_ms,
              void (*tweak)(kvf_router_config_t *cfg))
{
    static fixture_t fx;
    memset(&fx, 0, sizeof(fx));
    snprintf(fx.urls[0], sizeof(fx.urls[0]), "ipc:///tmp/kvf-test-router-%d-in", (int)getpid());
    snprintf(fx.urls[1], sizeof(fx.urls[1]), "ipc:///tmp/kvf-test-router-%d-cl", (int)getpid());
    for (int i = 0; i < RFX_NODES; i++)
        snprintf(fx.urls[2 + i], sizeof(fx.urls[2 + i]), "ipc:///tmp/kvf-test-router-%d-node%d",
                 (int)getpid(), i);
    kvf_router_config_t rc = {
        .listen_url = fx.urls[0],
        .client_url = fx.urls[1],
        .model_dir = RFX_MODEL,
        .heartbeat_ms = 50,
        .dead_after_missed = 3,
        .max_queue = 4,
        .queue_timeout_ms = queue_timeout_ms,
        .request_timeout_ms = request_timeout_ms,
        .max_attempts = 5,
        .default_max_tokens = 8,
    };
    if (tweak)
        tweak(&rc);
    if (kvf_router_create(&rc, &fx.r) != KVF_OK)
        return -1;
    for (int i = 0; i < RFX_NODES; i++)
        if (kvf_inbox_create(fx.urls[2 + i], 0, &fx.node_inbox[i]) != KVF_OK)
            return -1;
    *state = &fx;
    return 0;
}

int rfx_teardown(void **state)
{
    fixture_t *fx = *state;
    kvf_router_destroy(fx->r);
    for (int i = 0; i < RFX_NODES; i++)
        kvf_inbox_destroy(fx->node_inbox[i]);
    return 0;
}

void rfx_xfer_desc(const Kvf__KvGeometry *g, uint8_t *desc, size_t *len_p)
{
    size_t len = KVF_XFER_DESC_HEADER + 4 + 4; /* a 4-byte body */
    memset(desc, 0, len);
    xfer_put_u32(desc + 0, KVF_XFER_DESC_MAGIC);
    xfer_put_u16(desc + 4, KVF_XFER_DESC_VERSION);
    xfer_put_u16(desc + 6, 0);
    xfer_put_u32(desc + 8, KVF_XFER_DESC_HEADER);
    xfer_put_u32(desc + 12, 4);
    kvf_xfer_geometry_t xg = {g->block_size, g->n_layers, g->n_kv_heads, g->head_dim,
                              (uint32_t)g->dtype, g->layout};
    xfer_put_u64(desc + 16, 4096);
    xfer_put_u64(desc + 24, 64 * kvf_xfer_block_bytes(&xg));
    xfer_put_u32(desc + 32, xg.block_size);
    xfer_put_u32(desc + 36, xg.n_layers);
    xfer_put_u32(desc + 40, xg.n_kv_heads);
    xfer_put_u32(desc + 44, xg.head_dim);
    xfer_put_u32(desc + 48, xg.dtype);
    xfer_put_u32(desc + 52, xg.layout);
    xfer_put_u32(desc + len - 4, kvf_crc32c(0, desc, len - 4));
    *len_p = len;
}

void rfx_register_pool(fixture_t *fx, Kvf__Role role, const char *id, const char *url,
                       uint32_t block_size, Kvf__KvDtype dtype)
{
    rfx_register_node(fx, role, id, url, block_size, dtype, false);
}

void rfx_register_node(fixture_t *fx, Kvf__Role role, const char *id, const char *url,
                       uint32_t block_size, Kvf__KvDtype dtype, bool prefill_local)
{
    const kvf_model_config_t *m = kvf_router_model(fx->r);
    Kvf__KvGeometry g = KVF__KV_GEOMETRY__INIT;
    g.block_size = block_size;
    g.dtype = dtype;
    g.layout = 1;
    g.n_layers = (uint32_t)m->n_layers;
    g.n_kv_heads = (uint32_t)m->n_kv_heads;
    g.head_dim = (uint32_t)m->head_dim;
    uint8_t desc[128];
    size_t desc_len = 0;
    rfx_xfer_desc(&g, desc, &desc_len);
    Kvf__Register reg = KVF__REGISTER__INIT;
    reg.node_id = (char *)id;
    reg.role = role;
    reg.inbox_url = (char *)url;
    reg.model_fingerprint = "fp";
    reg.geometry = &g;
    reg.capacity_blocks = 64;
    reg.xfer_desc.data = desc;
    reg.xfer_desc.len = desc_len;
    reg.prefill_local = prefill_local;
    kvf_router_node_t *n = rfx_node_named(fx, id);
    ProtobufCBinaryData token = {0, NULL};
    if (n && fx->present_token)
        token = (ProtobufCBinaryData){sizeof(n->token), n->token};
    kvf_router__on_register(fx->r, &reg, token);
}

void rfx_register(fixture_t *fx, Kvf__Role role, const char *id, const char *url)
{
    rfx_register_pool(fx, role, id, url, 16, KVF__KV_DTYPE__KV_DTYPE_F32);
}

void rfx_register_decode(fixture_t *fx, const char *id, const char *url)
{
    rfx_register(fx, KVF__ROLE__ROLE_DECODE, id, url);
}

kvf_router_node_t *rfx_node_named(fixture_t *fx, const char *id)
{
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        if (fx->r->nodes.slots[i].used && !strcmp(fx->r->nodes.slots[i].id, id))
            return &fx->r->nodes.slots[i];
    return NULL;
}

kvf_envelope_t *rfx_node_recv(fixture_t *fx, int node, int body_case, int wait_ms)
{
    uint64_t give_up = kvf_clock_ns() + (uint64_t)wait_ms * 1000000ull;
    while (kvf_clock_ns() < give_up) {
        kvf_envelope_t *env = NULL;
        if (kvf_inbox_recv(fx->node_inbox[node], 50, &env) != KVF_OK)
            continue;
        if ((int)env->body_case == body_case)
            return env;
        kvf_envelope_free(env);
    }
    return NULL;
}

void rfx_run_until(fixture_t *fx, bool (*done)(fixture_t *, void *), void *arg)
{
    uint64_t give_up = kvf_clock_ns() + 10000000000ull;
    while (!done(fx, arg) && kvf_clock_ns() < give_up)
        assert_int_not_equal(kvf_evloop_wait(fx->r->loop, 1000), KVF_ERR_IO);
}

unsigned long long rfx_metric(fixture_t *fx, const char *line)
{
    kvf_router_snapshot_t snap;
    assert_int_equal(kvf_router_snapshot(fx->r, &snap), KVF_OK);
    char *text;
    size_t len;
    assert_int_equal(kvf_metrics_render(kvf_router_metrics(fx->r), &snap, &text, &len), KVF_OK);
    kvf_router_snapshot_fini(&snap);
    const char *p = strstr(text, line);
    if (!p)
        fail_msg("no %s in:\n%s", line, text);
    unsigned long long v = strtoull(p + strlen(line), NULL, 10);
    free(text);
    return v;
}
