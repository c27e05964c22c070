/* Fuzzes kvf_envelope_decode and the check a receiver applies to the
 * Sampling of a decoded body (kvf_sampling_msg_check). Each input is tried
 * as it is and, re-framed with a valid magic and CRC, to reach the
 * protobuf decoder past the frame check. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kvf/crc32c.h"
#include "kvf/msg.h"
#include "kvf/sampling_msg.h"

static void check_body(const kvf_envelope_t *env)
{
    const Kvf__Sampling *s = NULL;
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_PREFILL_REQUEST:
        s = env->prefill_request->sampling;
        break;
    case KVF__ENVELOPE__BODY_KV_READY:
        s = env->kv_ready->sampling;
        break;
    case KVF__ENVELOPE__BODY_GENERATE_REQUEST:
        s = env->generate_request->sampling;
        break;
    default:
        break;
    }
    (void)kvf_envelope_body_name(env);
    if (s) {
        char why[128];
        (void)kvf_sampling_msg_check(s, 32000, why, sizeof(why));
    }
}

static void decode_one(const uint8_t *frame, size_t len)
{
    kvf_envelope_t *env = NULL;
    if (kvf_envelope_decode(frame, len, 0, &env) == KVF_OK) {
        check_body(env);
        kvf_envelope_free(env);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_fuzz_quiet();
    decode_one(data, size);
    uint8_t *frame = malloc(KVF_MSG_FRAME_HEADER + size);
    if (!frame)
        return 0;
    uint32_t crc = kvf_crc32c(0, data, size);
    memcpy(frame, "KVF\1", 4);
    for (int i = 0; i < 4; i++)
        frame[4 + i] = (uint8_t)(crc >> (8 * i));
    if (size)
        memcpy(frame + KVF_MSG_FRAME_HEADER, data, size);
    decode_one(frame, KVF_MSG_FRAME_HEADER + size);
    free(frame);
    return 0;
}
