// What the files of the emulated runtime share (emu_runtime.cc lists them):
// the objects behind the CUDA handles, the runtime's state and the helpers
// that more than one of them calls. Not for code run on the emulator: that
// sees emu_runtime.h only.
#ifndef KVF_CUDA_EMU_RUNTIME_INTERNAL_H
#define KVF_CUDA_EMU_RUNTIME_INTERNAL_H

// The C++ library first: emu.h defines __noinline__, which its headers use.
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>

#include "emu_runtime.h"

namespace kvf_emu
{
namespace detail
{

typedef std::vector<std::function<void()>> node_list;
struct capture;

} // namespace detail
} // namespace kvf_emu

struct CUstream_st {
    CUstream_st(unsigned f, bool l) : flags(f), legacy(l)
    {
    }
    unsigned flags;
    bool legacy;
    std::deque<std::function<void()>> queue; // deferred work, oldest first
    unsigned long long given = 0;            // items given outside captures
    unsigned long long done = 0;             // items run
    kvf_emu::detail::capture *cap = nullptr; // the capture this stream records into
};

struct CUevent_st {
    unsigned flags;
    cudaStream_t stream = nullptr; // where last recorded; nullptr: never
    unsigned long long pos = 0;    // stream->given at the record (outside a capture)
    unsigned long long cap_id = 0; // recorded in this capture (0: outside any)
    unsigned long long cap_pos = 0;
};

struct CUgraph_st {
    std::shared_ptr<const kvf_emu::detail::node_list> nodes;
};

struct CUgraphExec_st {
    std::shared_ptr<const kvf_emu::detail::node_list> nodes;
};

namespace kvf_emu
{
namespace detail
{

constexpr size_t k_total_device_bytes = (size_t)16 << 30;
constexpr size_t k_device_align = 256;

struct member {
    unsigned long long items = 0;  // items this stream recorded into the capture
    unsigned long long joined = 0; // of them, those another member waited for
};

struct capture {
    unsigned long long id;
    cudaStream_t origin;
    cudaStreamCaptureMode mode;
    pthread_t thread;
    bool invalidated = false;
    std::shared_ptr<node_list> nodes = std::make_shared<node_list>();
    std::map<cudaStream_t, member> members; // the origin and the forks
};

struct allocation {
    size_t bytes;
    bool device;        // else pinned host memory
    unsigned char *map; // device: the mapping (guard, data, guard)
    size_t map_bytes;
    unsigned char *data; // device: the data pages
    size_t data_bytes;
};

struct runtime {
    std::map<uintptr_t, allocation> allocs; // by address
    size_t device_bytes = 0, pinned_bytes = 0, n_device = 0, n_pinned = 0;
    CUstream_st legacy_stream{0, true}; // nullptr
    std::set<cudaStream_t> streams;     // created, live
    std::set<cudaEvent_t> events;
    std::set<cudaGraph_t> graphs;
    std::set<cudaGraphExec_t> execs;
    std::map<unsigned long long, capture *> captures; // open, by id
    unsigned long long next_capture = 1;
    stream_mode mode = stream_mode::immediate;
    int device_count = 1, device = 0;
    long fail_after = -1;
    cudaError_t async_error = cudaSuccess; // from queued or replayed work
    int scope_depth = 0;
    std::vector<std::pair<uintptr_t, size_t>> freed; // device mappings, reserved and closed
    struct sigaction prev_segv = {};
    size_t page = 4096;
    size_t blas_handles = 0;
    runtime_stats st = {};

    runtime(); // the stream mode from KVF_EMU_STREAMS
};

// The one runtime; never destroyed: queued work and leaks outlive the
// static destructors.
runtime &rt();

// Says on stderr how a call was misused.
void misuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Every failing call leaves its error for cudaGetLastError, as the runtime
// does: returns err.
cudaError_t fail(cudaError_t err);
bool no_device();

// ---- device memory (emu_memory.cc) --------------------------------------------

// Opens (PROT_READ | PROT_WRITE) or closes (PROT_NONE) every device
// allocation to the host.
void protect_device(int prot);

// Device memory is open to the host while one of these lives: while device
// work runs.
struct device_scope {
    device_scope()
    {
        if (rt().scope_depth++ == 0)
            protect_device(PROT_READ | PROT_WRITE);
    }
    ~device_scope()
    {
        if (--rt().scope_depth == 0)
            protect_device(PROT_NONE);
    }
    device_scope(const device_scope &) = delete;
    device_scope &operator=(const device_scope &) = delete;
};

// The allocation p points into ([start, start + bytes]; the end too, for
// empty ranges), or nullptr.
const allocation *find(const void *p, uintptr_t *start_p = nullptr);
// What p is, in words: device memory, pinned host memory, freed device
// memory or pageable host memory.
const char *host_or_device(const void *p);
// [p, p + bytes) inside one device allocation; else says why (what: the
// call and operand) and returns false.
bool check_device(const void *p, size_t bytes, const char *what);
// [p, p + bytes) is host memory: anything but device memory.
bool check_host(const void *p, size_t bytes, const char *what);

// ---- captures (emu_graph.cc) ------------------------------------------------------

// The open capture of that id, or nullptr.
capture *open_capture(unsigned long long id);
// Marks c invalidated, saying why the first time.
void invalidate(capture *c, const char *why, cudaError_t err);
// An unsafe call (emu_runtime.h) made now fails, invalidating the captures
// that forbid it: true when it must fail.
bool unsafe_during_capture(const char *what);

// ---- streams (emu_stream.cc) --------------------------------------------------------

// The stream behind a handle (nullptr: the legacy stream); nullptr when it
// is not a live stream.
CUstream_st *resolve(cudaStream_t s);
// Runs one item as the device: device memory open, a fault in it kept for
// the next wait unless reported.
void run_item(const std::function<void()> &op, bool reported);
// Runs s's queued items until it has run upto of them.
void flush(CUstream_st *s, unsigned long long upto);
// Runs the queued work of every stream (the device synchronizes), or that
// of the blocking ones (what the legacy stream waits for).
void flush_all(bool blocking_only);
// The legacy stream's work so far, and that of the blocking streams it
// waits for: what a synchronous call waits for.
void flush_legacy();
// The error queued or replayed work left (a kernel fault), cleared.
cudaError_t take_async_error();
// Work for stream: run, queued or captured as the stream dictates. counter:
// the stat counted when it runs; what names it in messages.
cudaError_t give(cudaStream_t stream, std::function<void()> op, const char *what,
                 unsigned long long *counter);

} // namespace detail
} // namespace kvf_emu

#endif
