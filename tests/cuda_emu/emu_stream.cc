// Streams and events of the emulated runtime (emu_runtime.h says what is
// emulated).
//
// Streams: a queue of work items (std::function) per stream. An item is run
// inside a device_scope; a fault in one (the kernel emulator counts them)
// becomes the error the next wait returns. Events are (stream, item count)
// pairs: complete once the stream has run that many. A stream that captures
// gives its items to the capture instead (emu_graph.cc).

#include "emu_runtime_internal.h"

using namespace kvf_emu::detail;

namespace kvf_emu
{
namespace detail
{

CUstream_st *resolve(cudaStream_t s)
{
    if (!s)
        return &rt().legacy_stream;
    return rt().streams.count(s) ? s : nullptr;
}

// Runs one item as the device: device memory open, a fault in it kept for
// the next wait unless reported (an item run when it is given: its
// launcher reports the fault, as the kernel tests expect).
void run_item(const std::function<void()> &op, bool reported)
{
    device_scope scope;
    unsigned long long f0 = faults();
    op();
    if (faults() != f0 && !reported)
        rt().async_error = cudaErrorLaunchFailure;
}

// Runs s's queued items until it has run upto of them.
void flush(CUstream_st *s, unsigned long long upto)
{
    if (s->done >= upto || s->queue.empty())
        return;
    device_scope scope; // once for the whole run
    while (s->done < upto && !s->queue.empty()) {
        std::function<void()> op = std::move(s->queue.front());
        s->queue.pop_front();
        run_item(op, false);
        s->done++;
    }
}

// Runs the queued work of every stream (the device synchronizes), or that
// of the blocking ones (what the legacy stream waits for).
void flush_all(bool blocking_only)
{
    for (cudaStream_t s : rt().streams)
        if (!blocking_only || !(s->flags & cudaStreamNonBlocking))
            flush(s, s->given);
    if (!blocking_only)
        flush(&rt().legacy_stream, rt().legacy_stream.given);
}

// The legacy stream's work so far, and that of the blocking streams it
// waits for: what a synchronous call waits for.
void flush_legacy()
{
    flush_all(true);
    flush(&rt().legacy_stream, rt().legacy_stream.given);
}

cudaError_t take_async_error()
{
    cudaError_t e = rt().async_error;
    rt().async_error = cudaSuccess;
    return e;
}

// Work for stream s. counter: the stat counted when it runs.
cudaError_t give(cudaStream_t stream, std::function<void()> op, const char *what,
                 unsigned long long *counter)
{
    runtime &r = rt();
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("%s on stream %p, which is not a live stream", what, (void *)stream);
        return cudaErrorInvalidResourceHandle;
    }
    std::function<void()> item = [op = std::move(op), counter] {
        if (counter)
            (*counter)++;
        op();
    };
    if (s->cap) {
        if (s->cap->invalidated)
            return cudaErrorStreamCaptureInvalidated;
        s->cap->nodes->push_back(std::move(item));
        s->cap->members[s].items++;
        return cudaSuccess;
    }
    if (s->legacy) {
        // The legacy stream waits for the blocking streams (their earlier
        // work runs first, here at once); one that is capturing cannot be
        // waited for.
        for (auto &kv : r.captures)
            for (auto &m : kv.second->members)
                if (!(m.first->flags & cudaStreamNonBlocking)) {
                    invalidate(kv.second, what, cudaErrorStreamCaptureImplicit);
                    return cudaErrorStreamCaptureImplicit;
                }
        flush_all(true);
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        flush(&r.legacy_stream, r.legacy_stream.given); // and they wait for it
    }
    s->given++;
    if (r.mode == stream_mode::immediate) {
        run_item(item, s->legacy);
        s->done++;
    } else {
        s->queue.push_back(std::move(item));
        r.st.deferred++;
    }
    return cudaSuccess;
}

} // namespace detail

// ---- controls ----------------------------------------------------------------

void set_stream_mode(stream_mode m)
{
    flush_all(false);
    rt().mode = m;
}

stream_mode get_stream_mode()
{
    return rt().mode;
}

cudaError_t submit(cudaStream_t stream, std::function<void()> op, const char *what)
{
    // Kernels are counted where they run (stats.grids).
    return give(stream, std::move(op), what, nullptr);
}

} // namespace kvf_emu

// ---- streams -----------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    if (!stream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return fail(cudaErrorInvalidValue);
    if (no_device())
        return fail(cudaErrorNoDevice);
    cudaStream_t s = new CUstream_st(flags, false);
    rt().streams.insert(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!stream || !rt().streams.count(stream)) {
        misuse("cudaStreamDestroy(%p): not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (stream->cap) {
        invalidate(stream->cap, "cudaStreamDestroy of a capturing stream",
                   cudaErrorStreamCaptureUnsupported);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    flush(stream, stream->given); // its work finishes first
    rt().streams.erase(stream);
    delete stream;
    return cudaSuccess;
}

static cudaError_t stream_wait_all(cudaStream_t stream, const char *what)
{
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("%s(%p): not a live stream", what, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (s->cap) {
        invalidate(s->cap, what, cudaErrorStreamCaptureUnsupported);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (s->legacy)
        flush_legacy();
    else
        flush(s, s->given);
    cudaError_t err = take_async_error();
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    return stream_wait_all(stream, "cudaStreamSynchronize");
}

// Without timing, a stream's work may as well be done when asked about.
cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    return stream_wait_all(stream, "cudaStreamQuery");
}

static bool live_event(cudaEvent_t e, const char *what)
{
    if (e && rt().events.count(e))
        return true;
    misuse("%s(%p): not a live event", what, (void *)e);
    return false;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("cudaStreamWaitEvent(%p): not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (!live_event(event, "cudaStreamWaitEvent"))
        return fail(cudaErrorInvalidResourceHandle);
    if (flags != 0)
        return fail(cudaErrorInvalidValue);
    if (!event->stream)
        return cudaSuccess; // never recorded: nothing to wait for
    capture *ec = event->cap_id ? open_capture(event->cap_id) : nullptr;
    if (s->cap) {
        if (ec != s->cap) {
            invalidate(s->cap, "cudaStreamWaitEvent in a capture on an event recorded outside it",
                       cudaErrorStreamCaptureIsolation);
            return fail(cudaErrorStreamCaptureIsolation);
        }
        // Inside the capture: the nodes replay in capture order, which
        // keeps the dependency; the recording stream's items up to the
        // event are joined.
        if (event->stream != s) {
            member &m = s->cap->members[event->stream];
            m.joined = std::max(m.joined, event->cap_pos);
        }
        return cudaSuccess;
    }
    if (ec) {
        // A fork: s records into the event's capture from now on.
        if (s->legacy) {
            invalidate(ec, "the legacy stream waiting for a capture",
                       cudaErrorStreamCaptureImplicit);
            return fail(cudaErrorStreamCaptureImplicit);
        }
        s->cap = ec;
        ec->members[s];
        return cudaSuccess;
    }
    CUstream_st *src = event->stream;
    unsigned long long pos = event->pos;
    if (s->legacy) {
        flush(src, pos);
        return cudaSuccess;
    }
    return give(
        s, [src, pos] { flush(src, pos); }, "cudaStreamWaitEvent", nullptr);
}

// ---- events ------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (!event || (flags & ~0x7u))
        return fail(cudaErrorInvalidValue);
    if (no_device())
        return fail(cudaErrorNoDevice);
    cudaEvent_t e = new CUevent_st{flags};
    rt().events.insert(e);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    if (!live_event(event, "cudaEventDestroy"))
        return fail(cudaErrorInvalidResourceHandle);
    rt().events.erase(event);
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (!live_event(event, "cudaEventRecord"))
        return fail(cudaErrorInvalidResourceHandle);
    CUstream_st *s = resolve(stream);
    if (!s) {
        misuse("cudaEventRecord on stream %p: not a live stream", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    event->stream = s;
    if (s->cap) {
        if (s->cap->invalidated)
            return fail(cudaErrorStreamCaptureInvalidated);
        event->cap_id = s->cap->id;
        event->cap_pos = s->cap->members[s].items;
        event->pos = 0;
    } else {
        event->cap_id = 0;
        event->pos = s->given;
    }
    return cudaSuccess;
}

static cudaError_t event_wait(cudaEvent_t event, const char *what)
{
    if (!live_event(event, what))
        return fail(cudaErrorInvalidResourceHandle);
    if (event->cap_id && open_capture(event->cap_id)) {
        misuse("%s of an event recorded in a capture still open", what);
        return fail(cudaErrorCapturedEvent);
    }
    if (event->stream && !event->cap_id)
        flush(event->stream, event->pos);
    cudaError_t err = take_async_error();
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    return event_wait(event, "cudaEventSynchronize");
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    return event_wait(event, "cudaEventQuery");
}
