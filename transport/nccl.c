/* NCCL backend (KVF_HAVE_NCCL builds). */
#include "xfer_internal.h"

#ifdef KVF_HAVE_NCCL
#include "kvf/log.h"

static kvf_status_t nccl_open(kvf_xfer_t *x)
{
    (void)x;
    kvf_log_error("xfer/nccl: not implemented yet");
    return KVF_ERR_UNSUPPORTED;
}

const kvf_xfer_ops_t kvf_xfer_nccl_ops = {
    .name = "nccl",
    .open = nccl_open,
};
#endif
