/* Fuzzes kvf_envelope_decode and the check a receiver applies to the
 * Sampling of a decoded body (kvf_sampling_msg_check). Each input is tried
 * as it is and, re-framed with a valid magic and CRC, to reach the
 * protobuf decoder past the frame check; then the same with a cluster key
 * (kvf/auth.h) through the verifying decoder: as it is (the tag check), and
 * re-framed as a tagged frame with a valid tag, twice (the time,
 * destination and replay checks; the second is a replay when the first
 * passed). The keyed receiver's clock is FUZZ_NOW_NS and its inbox
 * FUZZ_DEST, so the seed cancel_tagged (signed with fuzz_key, sent at
 * FUZZ_NOW_NS for FUZZ_DEST) passes every check; the replay table is
 * emptied for each input, so an input's outcome does not depend on the
 * ones before it. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kvf/auth.h"
#include "kvf/crc32c.h"
#include "kvf/msg.h"
#include "kvf/sampling_msg.h"

/* 31 characters and the NUL: 32 bytes, the key of the tagged seed. */
static const uint8_t fuzz_key[32] = "kvferry fuzz_envelope test key.";
#define FUZZ_NOW_NS 1700000000000000000ull
#define FUZZ_DEST   "tcp://127.0.0.1:5555"

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

static void decode_keyed(const uint8_t *frame, size_t len)
{
    kvf_envelope_t *env = NULL;
    if (kvf_envelope_decode_at(frame, len, 0, FUZZ_DEST, FUZZ_NOW_NS, &env) == KVF_OK) {
        check_body(env);
        kvf_envelope_free(env);
    }
}

/* data behind a header with a valid CRC (and, tagged, a valid tag): a
 * malloc'd frame of *len_p bytes, or NULL. */
static uint8_t *reframe(const uint8_t *data, size_t size, bool tagged, size_t *len_p)
{
    size_t header = tagged ? KVF_MSG_FRAME_HEADER_TAGGED : KVF_MSG_FRAME_HEADER;
    uint8_t *frame = malloc(header + size);
    if (!frame)
        return NULL;
    uint32_t crc = kvf_crc32c(0, data, size);
    memcpy(frame, tagged ? "KVF\2" : "KVF\1", 4);
    for (int i = 0; i < 4; i++)
        frame[4 + i] = (uint8_t)(crc >> (8 * i));
    if (tagged)
        kvf_auth_sign(data, size, frame + KVF_MSG_FRAME_HEADER);
    if (size)
        memcpy(frame + header, data, size);
    *len_p = header + size;
    return frame;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_fuzz_quiet();
    size_t len;
    kvf_auth_clear_key();
    decode_one(data, size);
    uint8_t *frame = reframe(data, size, false, &len);
    if (frame)
        decode_one(frame, len);
    free(frame);

    kvf_auth_reset();
    if (kvf_auth_set_key(fuzz_key, sizeof(fuzz_key)) != KVF_OK)
        return 0;
    decode_keyed(data, size);
    frame = reframe(data, size, true, &len);
    kvf_auth_reset(); /* the copy is not a replay of the input itself */
    if (frame) {
        decode_keyed(frame, len);
        decode_keyed(frame, len);
    }
    free(frame);
    kvf_auth_clear_key();
    return 0;
}
