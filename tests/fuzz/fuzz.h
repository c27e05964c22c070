/* Shared by the fuzz harnesses (tests/fuzz/fuzz_<name>.c): the entry point
 * libFuzzer (or replay_main.c) calls, and a per-process scratch directory
 * for the decoders that read files. */
#ifndef KVF_FUZZ_H
#define KVF_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes size bytes to <dir>/name, dir being /tmp/kvf-fuzz-<pid> (made on
 * first use), and returns dir; NULL when the file cannot be written. */
const char *kvf_fuzz_write(const char *name, const uint8_t *data, size_t size);

/* Quiets the decoders' logging (once per process). */
void kvf_fuzz_quiet(void);

#endif
