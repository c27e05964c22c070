#include "kvf/status.h"

#include <errno.h>

const char *kvf_status_str(kvf_status_t status)
{
    switch (status) {
    case KVF_OK: return "ok";
    case KVF_ERR_NOMEM: return "out of memory";
    case KVF_ERR_INVAL: return "invalid argument";
    case KVF_ERR_IO: return "i/o error";
    case KVF_ERR_NOT_FOUND: return "not found";
    case KVF_ERR_FORMAT: return "malformed data";
    case KVF_ERR_UNSUPPORTED: return "not supported";
    case KVF_ERR_TIMEOUT: return "timed out";
    case KVF_ERR_AGAIN: return "try again";
    case KVF_ERR_TOO_BIG: return "too big";
    case KVF_ERR_VERSION: return "version mismatch";
    case KVF_ERR_MISMATCH: return "configuration mismatch";
    case KVF_ERR_NO_SPACE: return "no space";
    case KVF_ERR_CANCELLED: return "cancelled";
    case KVF_ERR_PEER: return "peer failure";
    case KVF_ERR_STALE: return "stale request or epoch";
    case KVF_ERR_TRANSPORT: return "transport error";
    case KVF_ERR_DEVICE: return "device error";
    case KVF_ERR_CLOSED: return "closed";
    case KVF_ERR_INTERNAL: return "internal error";
    case KVF_ERR_AUTH: return "not authenticated";
    case KVF_ERR_CORRUPT: return "corrupt data";
    }
    return "unknown status";
}

kvf_status_t kvf_status_from_errno(int err)
{
    switch (err) {
    case 0: return KVF_OK;
    case ENOMEM: return KVF_ERR_NOMEM;
    case EINVAL: return KVF_ERR_INVAL;
    case ENOENT: return KVF_ERR_NOT_FOUND;
    case ETIMEDOUT: return KVF_ERR_TIMEOUT;
    case EAGAIN: return KVF_ERR_AGAIN;
    case EMSGSIZE: case EFBIG: return KVF_ERR_TOO_BIG;
    case ENOTSUP: return KVF_ERR_UNSUPPORTED;
    case ECONNREFUSED: case ECONNRESET: case EPIPE: return KVF_ERR_PEER;
    case EBADF: return KVF_ERR_CLOSED;
    case ECANCELED: return KVF_ERR_CANCELLED;
    default: return KVF_ERR_IO;
    }
}
