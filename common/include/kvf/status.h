/* Status codes shared by every kvferry module.
 *
 * Functions that can fail return kvf_status_t: KVF_OK (0) or a negative
 * KVF_ERR_* value. Errors of third-party libraries (UCX, NCCL, CUDA,
 * nanomsg, protobuf-c, libc) are converted to these codes in one place per
 * library and never cross a module boundary in their own types. */
#ifndef KVF_STATUS_H
#define KVF_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVF_OK = 0,
    KVF_ERR_NOMEM = -1,      /* allocation failed */
    KVF_ERR_INVAL = -2,      /* bad argument or malformed input */
    KVF_ERR_IO = -3,         /* file or socket I/O failed */
    KVF_ERR_NOT_FOUND = -4,  /* file, tensor, key or id does not exist */
    KVF_ERR_FORMAT = -5,     /* a file or message does not parse */
    KVF_ERR_UNSUPPORTED = -6,/* valid but not supported by this build */
    KVF_ERR_TIMEOUT = -7,    /* a deadline passed */
    KVF_ERR_AGAIN = -8,      /* nothing ready now; try again later */
    KVF_ERR_TOO_BIG = -9,    /* input above a size limit */
    KVF_ERR_VERSION = -10,   /* protocol or format version mismatch */
    KVF_ERR_MISMATCH = -11,  /* peers disagree (model, geometry, dtype) */
    KVF_ERR_NO_SPACE = -12,  /* no free KV blocks or queue slots */
    KVF_ERR_CANCELLED = -13, /* the request or transfer was cancelled */
    KVF_ERR_PEER = -14,      /* a peer died, refused or misbehaved */
    KVF_ERR_STALE = -15,     /* request id / epoch no longer live */
    KVF_ERR_TRANSPORT = -16, /* the transfer layer failed */
    KVF_ERR_DEVICE = -17,    /* a GPU call failed or no GPU is present */
    KVF_ERR_CLOSED = -18,    /* the socket, endpoint or node shut down */
    KVF_ERR_INTERNAL = -19,  /* a bug: an invariant did not hold */
    KVF_ERR_AUTH = -20,      /* a control message failed authentication (kvf/auth.h) */
    KVF_ERR_CORRUPT = -21,   /* stored data failed its checksum or identity check */
} kvf_status_t;

/* A static, lowercase description of status; never NULL. */
const char *kvf_status_str(kvf_status_t status);

/* Converts a positive errno value to the closest status. */
kvf_status_t kvf_status_from_errno(int err);

#ifdef __cplusplus
}
#endif

#endif
