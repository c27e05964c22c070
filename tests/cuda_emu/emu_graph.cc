// Stream capture and graphs of the emulated runtime (emu_runtime.h says
// what is emulated, and which calls a capture forbids).
//
// A capture is a list of items appended to instead of running them, shared
// by the streams forked into it, with per-stream counts to tell whether
// each fork joined back. A graph holds the list; its replay is one item of
// the stream it is launched on, running the captured items in capture
// order.

#include "emu_runtime_internal.h"

using namespace kvf_emu::detail;

namespace kvf_emu
{
namespace detail
{

capture *open_capture(unsigned long long id)
{
    auto it = rt().captures.find(id);
    return it == rt().captures.end() ? nullptr : it->second;
}

void invalidate(capture *c, const char *why, cudaError_t err)
{
    if (!c->invalidated)
        misuse("%s: the stream capture is invalidated (%s)", why, cudaGetErrorName(err));
    c->invalidated = true;
}

// An unsafe call (emu_runtime.h) made now fails, invalidating the captures
// that forbid it: those of this thread not begun in relaxed mode, and the
// global-mode ones of any thread.
bool unsafe_during_capture(const char *what)
{
    bool refused = false;
    for (auto &kv : rt().captures) {
        capture *c = kv.second;
        if (c->mode == cudaStreamCaptureModeRelaxed)
            continue;
        if (pthread_equal(c->thread, pthread_self()) || c->mode == cudaStreamCaptureModeGlobal) {
            invalidate(c, what, cudaErrorStreamCaptureUnsupported);
            refused = true;
        }
    }
    return refused;
}

} // namespace detail
} // namespace kvf_emu

// ---- graphs ------------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode)
{
    runtime &r = rt();
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("cudaStreamBeginCapture(%p): not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (s->legacy) {
        misuse("cudaStreamBeginCapture of the legacy stream");
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue);
    if (s->cap) {
        misuse("cudaStreamBeginCapture of a stream already capturing");
        return fail(cudaErrorIllegalState);
    }
    capture *c = new capture;
    c->id = r.next_capture++;
    c->origin = s;
    c->mode = mode;
    c->thread = pthread_self();
    c->members[s];
    r.captures[c->id] = c;
    s->cap = c;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    runtime &r = rt();
    if (!graph)
        return fail(cudaErrorInvalidValue);
    *graph = nullptr;
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("cudaStreamEndCapture(%p): not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    capture *c = s->cap;
    if (!c) {
        misuse("cudaStreamEndCapture of a stream that is not capturing");
        return fail(cudaErrorIllegalState);
    }
    if (c->origin != s) {
        invalidate(c, "cudaStreamEndCapture on a forked stream", cudaErrorStreamCaptureUnmatched);
        return fail(cudaErrorStreamCaptureUnmatched);
    }
    if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->thread, pthread_self())) {
        misuse("cudaStreamEndCapture from another thread than the one that began it");
        return fail(cudaErrorStreamCaptureWrongThread);
    }
    cudaError_t err = c->invalidated ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
    for (auto &m : c->members) {
        m.first->cap = nullptr;
        if (err == cudaSuccess && m.first != s && m.second.items > m.second.joined) {
            misuse("cudaStreamEndCapture: a forked stream has %llu captured items, %llu of "
                   "them joined back",
                   m.second.items, m.second.joined);
            err = cudaErrorStreamCaptureUnjoined;
        }
    }
    std::shared_ptr<node_list> nodes = c->nodes;
    r.captures.erase(c->id);
    delete c;
    if (err != cudaSuccess)
        return fail(err);
    cudaGraph_t g = new CUgraph_st{nodes};
    r.graphs.insert(g);
    r.st.captures++;
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status)
{
    CUstream_st *s = resolve(stream);
    if (!s || !status)
        return fail(s ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle);
    *status = !s->cap               ? cudaStreamCaptureStatusNone
              : s->cap->invalidated ? cudaStreamCaptureStatusInvalidated
                                    : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    if (!exec || flags != 0)
        return fail(cudaErrorInvalidValue);
    if (!graph || !rt().graphs.count(graph)) {
        misuse("cudaGraphInstantiate(%p): not a live graph", (void *)graph);
        return fail(cudaErrorInvalidValue);
    }
    // The nodes are never changed once captured: sharing them is a copy.
    cudaGraphExec_t x = new CUgraphExec_st{graph->nodes};
    rt().execs.insert(x);
    *exec = x;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    if (!exec || !rt().execs.count(exec)) {
        misuse("cudaGraphLaunch(%p): not a live executable graph", (void *)exec);
        return fail(cudaErrorInvalidValue);
    }
    std::shared_ptr<const node_list> nodes = exec->nodes;
    cudaError_t err = give(
        stream,
        [nodes] {
            for (const auto &op : *nodes)
                op();
        },
        "cudaGraphLaunch", &rt().st.replays);
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    if (!graph || !rt().graphs.count(graph)) {
        misuse("cudaGraphDestroy(%p): not a live graph", (void *)graph);
        return fail(cudaErrorInvalidValue);
    }
    rt().graphs.erase(graph);
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    if (!exec || !rt().execs.count(exec)) {
        misuse("cudaGraphExecDestroy(%p): not a live executable graph", (void *)exec);
        return fail(cudaErrorInvalidValue);
    }
    rt().execs.erase(exec);
    delete exec; // a replay still queued holds the nodes
    return cudaSuccess;
}
