// Copies and memsets of the emulated runtime: each checks that its device
// ranges lie inside one allocation and that its direction matches the
// pointers, then runs now or goes to its stream as CUDA's API
// synchronization behavior says (copy_2d).

#include "emu_runtime_internal.h"

#include <string.h>

using namespace kvf_emu::detail;

namespace
{

// Pageable host memory: neither device nor pinned.
bool pageable(const void *p)
{
    return find(p) == nullptr;
}

// Checks a copy's pointers against its direction; returns false (having
// said why) on a mismatch. dst_bytes / src_bytes: the extents touched;
// *dst_dev_p / *src_dev_p: which sides are device memory.
bool check_copy(void *dst, size_t dst_bytes, const void *src, size_t src_bytes, cudaMemcpyKind kind,
                const char *what, bool *dst_dev_p, bool *src_dev_p)
{
    bool dst_dev, src_dev;
    switch (kind) {
    case cudaMemcpyHostToHost:
        dst_dev = src_dev = false;
        break;
    case cudaMemcpyHostToDevice:
        dst_dev = true;
        src_dev = false;
        break;
    case cudaMemcpyDeviceToHost:
        dst_dev = false;
        src_dev = true;
        break;
    case cudaMemcpyDeviceToDevice:
        dst_dev = src_dev = true;
        break;
    case cudaMemcpyDefault: {
        const allocation *d = find(dst), *s = find(src);
        dst_dev = d && d->device;
        src_dev = s && s->device;
        break;
    }
    default:
        misuse("%s: copy kind %d", what, (int)kind);
        return false;
    }
    char buf[128];
    snprintf(buf, sizeof buf, "%s destination", what);
    if (!(dst_dev ? check_device(dst, dst_bytes, buf) : check_host(dst, dst_bytes, buf)))
        return false;
    snprintf(buf, sizeof buf, "%s source", what);
    if (!(src_dev ? check_device(src, src_bytes, buf) : check_host(src, src_bytes, buf)))
        return false;
    *dst_dev_p = dst_dev;
    *src_dev_p = src_dev;
    return true;
}

// One copy of height rows of width bytes on stream (sync: cudaMemcpy, on
// the legacy stream), done when CUDA's API synchronization behavior says:
//  - into host memory, and between host memories: by the return (a copy
//    from the device into pinned memory on a stream excepted: queued);
//  - into device memory: from pinned memory, by the return for cudaMemcpy,
//    queued on a stream; from pageable memory, the source is read (staged)
//    at the call and the device write queued, as with the driver's staging
//    buffer;
//  - device to device: queued (cudaMemcpy's on the legacy stream).
// A stream that captures records it, pointers and all.
cudaError_t copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool sync,
                    const char *what)
{
    runtime &r = rt();
    CUstream_st *st = resolve(stream);
    if (!st) {
        misuse("%s on stream %p, which is not a live stream", what, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (width > dpitch || width > spitch) {
        misuse("%s: width %zu above a pitch (%zu, %zu)", what, width, dpitch, spitch);
        return fail(cudaErrorInvalidPitchValue);
    }
    if (width == 0 || height == 0)
        return cudaSuccess;
    if (!dst || !src) {
        misuse("%s: a null pointer", what);
        return fail(cudaErrorInvalidValue);
    }
    bool dst_dev = false, src_dev = false;
    if (!check_copy(dst, dpitch * (height - 1) + width, src, spitch * (height - 1) + width, kind,
                    what, &dst_dev, &src_dev))
        return fail(kind > cudaMemcpyDefault ? cudaErrorInvalidMemcpyDirection
                                             : cudaErrorInvalidValue);
    if (sync) {
        if (unsafe_during_capture(what))
            return fail(cudaErrorStreamCaptureUnsupported);
        st = &r.legacy_stream;
        stream = nullptr;
    }
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    const bool src_pageable = !src_dev && pageable(src);
    const bool now = !st->cap && ((!dst_dev && (sync || !src_dev || pageable(dst))) ||
                                  (dst_dev && !src_dev && sync && !src_pageable));
    std::function<void()> op;
    if (!now && !st->cap && dst_dev && src_pageable) {
        auto staged = std::make_shared<std::vector<unsigned char>>(width * height);
        for (size_t row = 0; row < height; row++)
            memcpy(staged->data() + row * width, s + row * spitch, width);
        op = [=] {
            for (size_t row = 0; row < height; row++)
                memcpy(d + row * dpitch, staged->data() + row * width, width);
        };
    } else {
        op = [=] {
            for (size_t row = 0; row < height; row++)
                memmove(d + row * dpitch, s + row * spitch, width);
        };
    }
    if (!now) {
        cudaError_t err = give(stream, std::move(op), what, &r.st.copies);
        return err != cudaSuccess ? fail(err) : cudaSuccess;
    }
    // Done by the return: after the stream's earlier work, as its item.
    if (st->legacy)
        flush_legacy();
    else
        flush(st, st->given);
    st->given++;
    run_item(
        [&] {
            r.st.copies++;
            op();
        },
        true);
    st->done++;
    return cudaSuccess;
}

} // namespace

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    return copy_2d(dst, bytes, src, bytes, bytes, 1, kind, nullptr, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    return copy_2d(dst, bytes, src, bytes, bytes, 1, kind, stream, false, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy_2d(dst, dpitch, src, spitch, width, height, kind, stream, false,
                   "cudaMemcpy2DAsync");
}

static cudaError_t memset_on(void *p, int value, size_t bytes, cudaStream_t stream, bool sync,
                             const char *what)
{
    if (!resolve(stream)) {
        misuse("%s on stream %p, which is not a live stream", what, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (bytes == 0)
        return cudaSuccess;
    if (!check_device(p, bytes, what))
        return fail(cudaErrorInvalidValue);
    if (sync && unsafe_during_capture(what))
        return fail(cudaErrorStreamCaptureUnsupported);
    cudaError_t err = give(
        sync ? nullptr : stream, [=] { memset(p, value, bytes); }, what, &rt().st.copies);
    return err != cudaSuccess ? fail(err) : cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    return memset_on(p, value, bytes, nullptr, true, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream)
{
    return memset_on(p, value, bytes, stream, false, "cudaMemsetAsync");
}
