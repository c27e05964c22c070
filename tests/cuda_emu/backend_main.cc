// test_cuda_backend_emu: tests/unit/test_cuda_backend.c, the GPU test of
// the CUDA backend, run on the CPU emulator (emu.h, emu_runtime.h). The
// file is built unchanged but for its main(), renamed kvf_test_main() on
// the compiler's command line; this main() runs it and then requires what
// only the emulator can see:
//  - that it ran at all: a skip (77) here means the emulated device was not
//    found, a build mistake;
//  - no kernel or memory fault (each was printed when it happened);
//  - CUDA graphs were captured and replayed (a capture that fails falls
//    back to launched kernels with a warning, which the tests cannot tell);
//  - nothing leaked: every device and pinned allocation, stream, event,
//    graph and cuBLAS handle the tests created was destroyed.
// It checks the KV tiers' RAM slab on a node's backend
// (kvf_backend_host_alloc_hook, as kvf-prefill and kvf-decode give it): on
// the CUDA backend it is one pinned allocation, freed with the tiers, and a
// block put from the pool's host mirror comes back through it into another
// block, and its queued upload (kvf_kvpool_upload_queued) is on the device
// once the backend's stream ran; on the CPU backend it is plain memory.
// Then, with deferred streams (emu_runtime.h), it checks what a GPU test
// cannot reach: the backend's error paths, and when its layer hooks run. A
// session (create, pool, prefills, decodes from graphs, growing buffers,
// layer hooks, a forward with K/V copied to the host) is run once per
// device or pinned allocation it makes, that allocation failing. Creating
// fails cleanly; a forward that fails succeeds when repeated and gives the
// results of a session without failures, bit for bit; each layer hook
// finds its layer's K/V in place; nothing leaks.
//
// KVF_EMU_STREAMS=deferred in the environment runs every stream's work
// only when the host waits for it (emu_runtime.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

#include <cuda_runtime.h>

#include "kvf/backend.h"
#include "kvf/engine.h"
#include "kvf/kv_tier.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
extern "C" {
#include "support.h"
}

extern "C" int kvf_test_main(void);

namespace
{

int g_problems; // found in a session, each printed

double seconds_since(const struct timespec &t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
}

// A random Qwen2-like model (q/k/v biases, tied embeddings, support.h's
// small geometry) with 4 query heads over 2 kv heads. Owned by the caller.
kvf_model_t *small_model()
{
    kvf_model_config_t c = kvf_test_model_config(4, 2, true);
    char dir[] = "/tmp/kvf_emu_model_XXXXXX";
    if (!mkdtemp(dir))
        return nullptr;
    kvf_model_t *m = nullptr;
    if (kvf_model_write_random(dir, &c, KVF_DTYPE_F32, 11) != KVF_OK ||
        kvf_model_load(dir, &m) != KVF_OK)
        m = nullptr;
    kvf_test_remove_model(dir);
    return m;
}

// What a layer hook sees: when on_layer_done(l) runs, layer l's K/V of the
// batch must be in the pool (the device pool; with kv_to_host, its host
// mirror). The hook reads layer l of the block the forward writes (through
// the runtime for the device pool, as other host code would) and the
// session compares that with the block after the forward: in deferred mode
// (emu_runtime.h) a hook run too early reads older contents.
struct layer_watch {
    kvf_kvpool_t *pool;
    uint32_t block;
    bool host; // read the host mirror
    int layers_seen;
    bool out_of_order;
    std::vector<unsigned char> seen; // (layers, slice bytes) as each hook found them
};

void read_layer(const layer_watch *w, int layer, unsigned char *dst)
{
    const size_t slice = kvf_kvpool_slice_bytes(w->pool);
    const size_t off =
        (size_t)w->block * kvf_kv_block_bytes(kvf_kvpool_geometry(w->pool)) + (size_t)layer * slice;
    if (w->host)
        memcpy(dst, (const unsigned char *)kvf_kvpool_base(w->pool) + off, slice);
    else if (cudaMemcpy(dst, (const unsigned char *)kvf_kvpool_device_base(w->pool) + off, slice,
                        cudaMemcpyDeviceToHost) != cudaSuccess)
        memset(dst, 0x5a, slice);
}

void on_layer(void *arg, int layer)
{
    layer_watch *w = (layer_watch *)arg;
    w->out_of_order |= layer != w->layers_seen;
    w->layers_seen++;
    const size_t slice = kvf_kvpool_slice_bytes(w->pool);
    w->seen.resize((size_t)(layer + 1) * slice);
    read_layer(w, layer, w->seen.data() + (size_t)layer * slice);
}

// After the forward: the hooks ran in order, once per layer, and each saw
// its layer as it is now. Prints and counts a problem otherwise.
int layers_complete(const layer_watch *w, int n_layers, const char *what)
{
    const size_t slice = kvf_kvpool_slice_bytes(w->pool);
    std::vector<unsigned char> now(slice);
    int bad = w->out_of_order || w->layers_seen != n_layers;
    for (int l = 0; l < n_layers && !bad; l++) {
        read_layer(w, l, now.data());
        bad = memcmp(now.data(), w->seen.data() + (size_t)l * slice, slice) != 0;
    }
    if (bad)
        fprintf(stderr, "%s: the layer hooks ran out of order or before their K/V was there\n",
                what);
    return bad;
}

// One session on a fresh backend; the logits and greedy ids of every
// forward, then the host mirror's K/V, are appended to out. Sequence a: a
// prefill of 60 (every row's logits) and two decodes (a graph); then b's
// prefill of 70 grows the activations, which hold 64 rows, and nothing
// else (the graph must go), a's decodes again (a new graph), and a decode
// of b with its K/V to the host. Three forwards have layer hooks (a
// prefill, a replayed decode, the one to the host), each checked with a
// layer_watch. A forward that fails is repeated once (an injected failure
// happens once): its second status counts. Returns the first status that
// is not KVF_OK.
kvf_status_t session(kvf_model_t *model, std::vector<float> *out)
{
    kvf_backend_t be;
    memset(&be, 0, sizeof(be));
    kvf_kvpool_t *pool = nullptr;
    kvf_engine_t *engine = nullptr;
    kvf_cuda_config_t cc = kvf_cuda_config_default();
    kvf_status_t st = kvf_backend_cuda_create(&cc, model, &be);
    kvf_kv_geometry_t g = kvf_engine_kv_geometry(model, 16, KVF_KV_F32);
    if (st == KVF_OK)
        st = kvf_backend_cuda_kvpool_create(&be, &g, 16, true, &pool);
    if (st == KVF_OK)
        st = kvf_engine_create(model, &be, pool, &engine);
    const int V = model->cfg.vocab;
    std::vector<uint32_t> ids(128);
    for (size_t i = 0; i < ids.size(); i++)
        ids[i] = (uint32_t)(i * 37 + 5) % (uint32_t)V;
    kvf_block_table_t bt[2];
    kvf_block_table_init(&bt[0]);
    kvf_block_table_init(&bt[1]);
    std::vector<float> logits((size_t)60 * V);
    // hooks: 0 none, 1 on_layer_done (K/V in the device pool), 2 with the
    // K/V copied to the host mirror.
    struct step {
        int seq, start, count, hooks;
    };
    const step steps[] = {{0, 0, 60, 0}, {0, 60, 1, 0}, {0, 61, 1, 0}, {1, 0, 70, 1},
                          {0, 62, 1, 1}, {0, 63, 1, 0}, {1, 70, 1, 2}};
    const int n_steps = (int)(sizeof(steps) / sizeof(steps[0]));
    for (int i = 0; i < n_steps && st == KVF_OK; i++) {
        const step &sp = steps[i];
        uint32_t greedy = 0;
        st = kvf_block_table_reserve(&bt[sp.seq], pool, (uint32_t)(sp.start + sp.count));
        if (st != KVF_OK)
            break;
        kvf_engine_seq_t q;
        memset(&q, 0, sizeof(q));
        q.tokens = &ids[(size_t)sp.start];
        q.n_tokens = (uint32_t)sp.count;
        q.start_pos = (uint32_t)sp.start;
        q.block_ids = bt[sp.seq].blocks;
        q.n_blocks = bt[sp.seq].n_blocks;
        q.all_logits = i == 0;
        q.logits = logits.data();
        q.greedy_token = &greedy;
        const int last = sp.start + sp.count - 1;
        layer_watch watch = {pool, bt[sp.seq].blocks[last / 16], sp.hooks == 2, 0, false, {}};
        kvf_engine_hooks_t hooks = {on_layer, &watch, sp.hooks == 2};
        const kvf_engine_hooks_t *h = sp.hooks ? &hooks : nullptr;
        st = kvf_engine_forward(engine, &q, 1, h);
        if (st != KVF_OK) {
            watch.layers_seen = 0;
            watch.out_of_order = false;
            st = kvf_engine_forward(engine, &q, 1, h);
        }
        if (st != KVF_OK)
            break;
        if (sp.hooks && layers_complete(&watch, model->cfg.n_layers, "error paths: session"))
            g_problems++;
        size_t rows = i == 0 ? (size_t)sp.count : 1;
        out->insert(out->end(), logits.begin(), logits.begin() + (long)(rows * (size_t)V));
        out->push_back((float)greedy);
    }
    if (st == KVF_OK) { // the mirror: b's last block, as the last forward copied it
        const float *mirror = (const float *)kvf_kvpool_base(pool);
        const size_t floats = kvf_kv_block_bytes(&g) / sizeof(float);
        const uint32_t last = bt[1].blocks[bt[1].n_blocks - 1];
        out->insert(out->end(), mirror + last * floats, mirror + (last + 1) * floats);
    }
    for (kvf_block_table_t &t : bt) {
        if (pool)
            kvf_block_table_release(&t, pool);
        kvf_block_table_fini(&t);
    }
    kvf_engine_destroy(engine);
    kvf_kvpool_destroy(pool);
    kvf_backend_destroy(&be);
    return st;
}

// The error paths; returns the number of problems (each printed).
int check_allocation_failures()
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kvf_model_t *model = small_model();
    if (!model) {
        fprintf(stderr, "test_cuda_backend_emu: cannot make the model\n");
        return 1;
    }
    // Deferred streams (emu_runtime.h): a hook or a copy that does not wait
    // for what it needs reads old contents.
    const kvf_emu::stream_mode mode = kvf_emu::get_stream_mode();
    kvf_emu::set_stream_mode(kvf_emu::stream_mode::deferred);
    int problems = 0;
    g_problems = 0;
    std::vector<float> want;
    kvf_emu::runtime_stats s0 = kvf_emu::get_runtime_stats();
    size_t allocations = s0.device_allocations; // live ones, none expected
    kvf_status_t st = session(model, &want);
    if (st != KVF_OK) {
        fprintf(stderr, "error paths: the session without failures failed: %s\n",
                kvf_status_str(st));
        kvf_model_destroy(model);
        kvf_emu::set_stream_mode(mode);
        return 1;
    }
    kvf_log_level_t level = kvf_log_level;
    int runs = 0, failed_creates = 0, repeated = 0;
    for (long i = 0;; i++) {
        unsigned long long failed = kvf_emu::get_runtime_stats().failed_allocations;
        kvf_emu::fail_allocation_after(i);
        kvf_log_set_level(KVF_LOG_OFF); // each failure is logged: expected
        std::vector<float> got;
        st = session(model, &got);
        kvf_log_set_level(level);
        kvf_emu::fail_allocation_after(-1);
        if (kvf_emu::get_runtime_stats().failed_allocations == failed)
            break; // the session made fewer than i + 1 allocations: all tried
        runs++;
        if (st == KVF_OK) {
            repeated++;
            if (got.size() != want.size() ||
                memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) {
                fprintf(stderr,
                        "error paths: allocation %ld failed in a forward; repeated, "
                        "it gave other results\n",
                        i);
                problems++;
            }
        } else if (st != KVF_ERR_NOMEM && st != KVF_ERR_DEVICE) {
            fprintf(stderr, "error paths: allocation %ld failed: session returned %s\n", i,
                    kvf_status_str(st));
            problems++;
        } else {
            failed_creates++;
        }
        kvf_emu::runtime_stats s = kvf_emu::get_runtime_stats();
        if (s.device_allocations != allocations || s.pinned_allocations != 0 || s.streams ||
            s.events || s.graphs || s.graph_execs || s.blas_handles) {
            fprintf(stderr,
                    "error paths: allocation %ld failed: resources left after the "
                    "session:\n",
                    i);
            kvf_emu::report_leaks(stderr);
            problems++;
            break;
        }
    }
    problems += g_problems;
    printf("error paths (deferred streams): %d sessions, one allocation failing in each: %d "
           "failed to start, %d "
           "repeated a forward and matched: %s, %.1f s\n",
           runs, failed_creates, repeated, problems ? "FAIL" : "PASS", seconds_since(t0));
    if (runs < 10) {
        fprintf(stderr, "error paths: only %d allocations seen\n", runs);
        problems++;
    }
    kvf_model_destroy(model);
    kvf_emu::set_stream_mode(mode);
    return problems;
}

// One backend's tiers (see the top): true when the slab was pinned as
// want_pinned says and a block made the round trip.
bool tier_slab_on(kvf_model_t *model, bool cuda, bool want_pinned)
{
    kvf_backend_t be;
    memset(&be, 0, sizeof(be));
    kvf_kvpool_t *pool = nullptr;
    kvf_kv_geometry_t g = kvf_engine_kv_geometry(model, 16, KVF_KV_F32);
    kvf_cuda_config_t cc = kvf_cuda_config_default();
    kvf_status_t st = cuda ? kvf_backend_cuda_create(&cc, model, &be)
                           : kvf_backend_cpu_create(1, &be);
    if (st == KVF_OK)
        st = cuda ? kvf_backend_cuda_kvpool_create(&be, &g, 4, true, &pool)
                  : kvf_kvpool_create(&g, 4, &pool);
    bool ok = st == KVF_OK;
    size_t bb = kvf_kv_block_bytes(&g);
    kvf_kv_tiers_config_t tc = {};
    tc.host_bytes = 2 * bb;
    tc.block_bytes = bb;
    tc.block_tokens = 16;
    tc.host_alloc = kvf_backend_host_alloc_hook;
    tc.host_free = kvf_backend_host_free_hook;
    tc.host_arg = &be;
    kvf_emu::runtime_stats before = kvf_emu::get_runtime_stats();
    kvf_kv_tiers_t *t = nullptr;
    ok = ok && kvf_kv_tiers_create(&tc, &t, nullptr, 0) == KVF_OK;
    kvf_emu::runtime_stats during = kvf_emu::get_runtime_stats();
    size_t pinned = want_pinned ? 1 : 0;
    if (ok && (during.pinned_allocations != before.pinned_allocations + pinned ||
               during.pinned_bytes != before.pinned_bytes + pinned * 2 * bb)) {
        fprintf(stderr, "test_cuda_backend_emu: the %s tier slab is %s pinned memory\n",
                cuda ? "cuda" : "cpu", want_pinned ? "not" : "in");
        ok = false;
    }
    uint8_t *base = ok ? (uint8_t *)kvf_kvpool_base(pool) : nullptr;
    std::vector<uint32_t> tokens(16, 7);
    if (ok) {
        for (size_t i = 0; i < bb; i++)
            base[i] = (uint8_t)(i * 13 + 1);
        kvf_kv_fetch_done_t d = {};
        uint32_t dst = 1;
        ok = kvf_kv_tiers_put(t, 42, tokens.data(), base) == KVF_OK &&
             kvf_kv_tiers_fetch(t, 42, tokens.data(), base + bb, 9) == KVF_OK &&
             kvf_kv_tiers_poll(t, &d, 1) == 1 && d.status == KVF_OK &&
             memcmp(base, base + bb, bb) == 0 && kvf_kvpool_upload_queued(pool, &dst, 1) == KVF_OK;
        if (!ok)
            fprintf(stderr, "test_cuda_backend_emu: a block did not come back from the %s "
                            "tier slab\n", cuda ? "cuda" : "cpu");
    }
    // the queued upload (node_tiers.c's) is on the device once the backend
    // ran its stream
    if (ok && cuda) {
        std::vector<uint8_t> back(bb);
        ok = be.ops->synchronize(be.ctx) == KVF_OK &&
             cudaMemcpy(back.data(), (uint8_t *)kvf_kvpool_device_base(pool) + bb, bb,
                        cudaMemcpyDeviceToHost) == cudaSuccess &&
             memcmp(back.data(), base, bb) == 0;
        if (!ok)
            fprintf(stderr, "test_cuda_backend_emu: the queued upload of a block from the tier "
                            "slab is not on the device\n");
    }
    kvf_kv_tiers_destroy(t);
    if (kvf_emu::get_runtime_stats().pinned_allocations != before.pinned_allocations) {
        fprintf(stderr, "test_cuda_backend_emu: the tier slab was not freed\n");
        ok = false;
    }
    kvf_kvpool_destroy(pool);
    kvf_backend_destroy(&be);
    return ok;
}

int check_tier_slab()
{
    kvf_model_t *model = small_model();
    if (!model) {
        fprintf(stderr, "test_cuda_backend_emu: cannot write the test model\n");
        return 1;
    }
    int problems = !tier_slab_on(model, true, true) + !tier_slab_on(model, false, false);
    kvf_model_destroy(model);
    return problems;
}

} // namespace

int main(void)
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    printf("test_cuda_backend_emu: test_cuda_backend on the CUDA emulator, streams %s\n",
           kvf_emu::get_stream_mode() == kvf_emu::stream_mode::deferred ? "deferred" : "immediate");
    int rc = kvf_test_main();
    kvf_emu::stats es = kvf_emu::get_stats();
    kvf_emu::runtime_stats rs = kvf_emu::get_runtime_stats();
    printf("emulated: %llu kernels (%llu CTAs, %.1fM fiber switches), %llu GEMMs, %llu copies, "
           "%llu graphs captured, %llu replayed, %llu items deferred, %.1f s\n",
           rs.kernels, es.ctas, (double)es.switches / 1e6, rs.gemms, rs.copies, rs.captures,
           rs.replays, rs.deferred, seconds_since(t0));
    if (rc == 77) {
        fprintf(stderr, "test_cuda_backend_emu: the test skipped: the emulated GPU was not seen "
                        "(is kvf_engine_emu built with KVF_HAVE_CUDA?)\n");
        return 1;
    }
    if (rs.captures == 0 || rs.replays == 0) {
        fprintf(stderr, "test_cuda_backend_emu: no CUDA graph was captured and replayed\n");
        rc = rc ? rc : 1;
    }
    // After a failed test cmocka has jumped past its cleanup: leaks are
    // expected then, and not the news; nor are later failures.
    if (rc != 0)
        return rc;
    if (kvf_emu::report_leaks(stderr) != 0) {
        fprintf(stderr, "test_cuda_backend_emu: CUDA resources leaked (listed above)\n");
        return 1;
    }
    if (check_allocation_failures() != 0 || check_tier_slab() != 0)
        rc = 1;
    if (kvf_emu::faults() != 0) {
        fprintf(stderr, "test_cuda_backend_emu: %llu emulator faults (printed above)\n",
                kvf_emu::faults());
        rc = 1;
    }
    return rc;
}
