/* Control-plane schema: every message type round-trips through the wire
 * frame with every field checked, and malformed frames are refused.
 *
 * Messages are filled through protobuf-c's descriptors, so a field added to
 * proto/kvferry.proto is covered without touching this file: each field gets
 * a distinct non-default value, and the decoded copy is compared field by
 * field against the original. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvf/crc32c.h"
#include "kvf/msg.h"

/* Everything a filled message points to, freed by arena_free(). */
typedef struct {
    void *ptrs[4096];
    size_t n;
} arena_t;

static void *arena_alloc(arena_t *a, size_t size)
{
    assert_true(a->n < 4096);
    void *p = calloc(1, size ? size : 1);
    assert_non_null(p);
    a->ptrs[a->n++] = p;
    return p;
}

static void arena_free(arena_t *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->ptrs[i]);
    a->n = 0;
}

static size_t scalar_size(ProtobufCType type)
{
    switch (type) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    default: return 4;
    }
}

static void fill_message(arena_t *a, ProtobufCMessage *msg, unsigned seed, int depth);

/* Writes a distinct, non-default value derived from seed into slot. */
static void fill_value(arena_t *a, const ProtobufCFieldDescriptor *f, void *slot, unsigned seed,
                       int depth)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
        *(int32_t *)slot = -(int32_t)(seed % 1000) - 1;
        break;
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
        *(uint32_t *)slot = 0x80000000u + seed;
        break;
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
        *(int64_t *)slot = -(int64_t)seed * 1000003 - 1;
        break;
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
        *(uint64_t *)slot = 0x8000000000000000ull + seed * 7919u;
        break;
    case PROTOBUF_C_TYPE_FLOAT: *(float *)slot = 0.25f + (float)seed; break;
    case PROTOBUF_C_TYPE_DOUBLE: *(double *)slot = 0.5 + seed; break;
    case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)slot = 1; break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *e = f->descriptor;
        *(int *)slot = e->values[e->n_values - 1 - seed % (e->n_values - 1)].value;
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *s = arena_alloc(a, 48);
        snprintf(s, 48, "%s-%u-\xc3\xa9", f->name, seed);
        *(char **)slot = s;
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = slot;
        b->len = 5 + seed % 17;
        b->data = arena_alloc(a, b->len);
        for (size_t i = 0; i < b->len; i++)
            b->data[i] = (uint8_t)(seed * 31 + i * 7);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessageDescriptor *d = f->descriptor;
        ProtobufCMessage *sub = arena_alloc(a, d->sizeof_message);
        d->message_init(sub);
        fill_message(a, sub, seed * 3 + 1, depth + 1);
        *(ProtobufCMessage **)slot = sub;
        break;
    }
    }
}

/* Fills every field of msg; of a oneof only the member picked by the
 * caller (already set) is kept. Repeated fields get 3 elements. */
static void fill_message(arena_t *a, ProtobufCMessage *msg, unsigned seed, int depth)
{
    assert_true(depth < 8);
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        uint8_t *base = (uint8_t *)msg;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = 3, sz = scalar_size(f->type);
            void *arr = arena_alloc(a, n * sz);
            for (size_t k = 0; k < n; k++)
                fill_value(a, f, (uint8_t *)arr + k * sz, seed + i * 11 + (unsigned)k, depth);
            *(size_t *)(base + f->quantifier_offset) = n;
            *(void **)(base + f->offset) = arr;
        } else {
            fill_value(a, f, base + f->offset, seed + i * 11, depth);
            if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset)
                *(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
        }
    }
}

static void check_value(const ProtobufCFieldDescriptor *f, const void *x, const void *y);

static void check_message(const ProtobufCMessage *x, const ProtobufCMessage *y)
{
    assert_non_null(x);
    assert_non_null(y);
    assert_ptr_equal(x->descriptor, y->descriptor);
    const ProtobufCMessageDescriptor *d = x->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const uint8_t *bx = (const uint8_t *)x, *by = (const uint8_t *)y;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t cx = *(const uint32_t *)(bx + f->quantifier_offset);
            uint32_t cy = *(const uint32_t *)(by + f->quantifier_offset);
            assert_int_equal(cx, cy);
            if (cx == f->id)
                check_value(f, bx + f->offset, by + f->offset);
            continue;
        }
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t nx = *(const size_t *)(bx + f->quantifier_offset);
            size_t ny = *(const size_t *)(by + f->quantifier_offset);
            assert_int_equal(nx, ny);
            assert_true(nx > 0);
            size_t sz = scalar_size(f->type);
            const uint8_t *ax = *(void *const *)(bx + f->offset);
            const uint8_t *ay = *(void *const *)(by + f->offset);
            for (size_t k = 0; k < nx; k++)
                check_value(f, ax + k * sz, ay + k * sz);
        } else {
            check_value(f, bx + f->offset, by + f->offset);
        }
    }
}

static void check_value(const ProtobufCFieldDescriptor *f, const void *x, const void *y)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING:
        assert_non_null(*(char *const *)x);
        assert_true(**(char *const *)x != '\0');
        assert_string_equal(*(char *const *)x, *(char *const *)y);
        break;
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *bx = x, *by = y;
        assert_true(bx->len > 0);
        assert_int_equal(bx->len, by->len);
        assert_memory_equal(bx->data, by->data, bx->len);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE:
        check_message(*(ProtobufCMessage *const *)x, *(ProtobufCMessage *const *)y);
        break;
    default: {
        size_t sz = scalar_size(f->type);
        /* Filled values are never the proto3 default (0). */
        static const uint8_t zero[8];
        assert_memory_not_equal(x, zero, sz);
        assert_memory_equal(x, y, sz);
    }
    }
}

/* Builds an Envelope with body case `field` fully filled. */
static void make_envelope(arena_t *a, kvf_envelope_t *env, const ProtobufCFieldDescriptor *field,
                          unsigned seed)
{
    kvf_envelope_init(env, "test-sender");
    /* The stamp a keyed sender sets (kvf/auth.h); without a key encoding
     * keeps what the envelope holds, so the round trip checks it too. */
    env->auth_nonce = 0x0123456789abcdefull + seed;
    env->auth_seq = seed;
    env->auth_to = "tcp://127.0.0.1:5555";
    /* The registration token (docs/PROTOCOL.md, "Identity"). */
    static uint8_t token[16] = "registration-tk";
    token[0] = (uint8_t)seed;
    env->reg_token = (ProtobufCBinaryData){sizeof(token), token};
    uint8_t *base = (uint8_t *)env;
    *(uint32_t *)(base + field->quantifier_offset) = field->id;
    fill_value(a, field, base + field->offset, seed, 0);
}

static void test_every_body_round_trips(void **state)
{
    (void)state;
    const ProtobufCMessageDescriptor *d = &kvf__envelope__descriptor;
    unsigned bodies = 0;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        arena_t *a = calloc(1, sizeof(*a));
        assert_non_null(a);
        kvf_envelope_t env;
        make_envelope(a, &env, f, 100 + i);
        uint8_t *frame;
        size_t len;
        assert_int_equal(kvf_envelope_encode(&env, &frame, &len), KVF_OK);
        kvf_envelope_t *out = NULL;
        assert_int_equal(kvf_envelope_decode(frame, len, 0, &out), KVF_OK);
        assert_int_equal(out->version, KVF_PROTO_VERSION);
        assert_string_equal(out->sender, "test-sender");
        assert_int_equal(out->sent_unix_ns, env.sent_unix_ns);
        assert_int_equal(out->body_case, f->id);
        assert_string_not_equal(kvf_envelope_body_name(out), "none");
        check_message(&env.base, &out->base);
        kvf_envelope_free(out);
        free(frame);
        arena_free(a);
        free(a);
        bodies++;
    }
    /* Register .. GenerateChunk: every body named in docs/PROTOCOL.md and more. */
    assert_true(bodies >= 16);
}

/* A valid frame to mutate. */
static void valid_frame(arena_t *a, uint8_t **frame_p, size_t *len_p)
{
    kvf_envelope_t env;
    make_envelope(a, &env, protobuf_c_message_descriptor_get_field_by_name(
                               &kvf__envelope__descriptor, "prefill_request"),
                  7);
    assert_int_equal(kvf_envelope_encode(&env, frame_p, len_p), KVF_OK);
}

static void test_empty_and_truncated(void **state)
{
    (void)state;
    arena_t *a = calloc(1, sizeof(*a));
    uint8_t *frame;
    size_t len;
    valid_frame(a, &frame, &len);
    kvf_envelope_t *out = NULL;
    assert_int_equal(kvf_envelope_decode(frame, 0, 0, &out), KVF_ERR_FORMAT);
    for (size_t n = 1; n < len; n++) {
        kvf_status_t st = kvf_envelope_decode(frame, n, 0, &out);
        assert_true(st == KVF_ERR_FORMAT);
    }
    assert_null(out);
    free(frame);
    arena_free(a);
    free(a);
}

static void test_bit_flips(void **state)
{
    (void)state;
    arena_t *a = calloc(1, sizeof(*a));
    uint8_t *frame;
    size_t len;
    valid_frame(a, &frame, &len);
    kvf_envelope_t *out = NULL;
    for (size_t bit = 0; bit < len * 8; bit++) {
        frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        kvf_status_t st = kvf_envelope_decode(frame, len, 0, &out);
        assert_true(st == KVF_ERR_FORMAT);
        frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    assert_null(out);
    assert_int_equal(kvf_envelope_decode(frame, len, 0, &out), KVF_OK);
    kvf_envelope_free(out);
    free(frame);
    arena_free(a);
    free(a);
}

/* Wraps an arbitrary payload in a frame with a correct checksum, so the
 * protobuf decoder and the envelope checks see it. */
static uint8_t *frame_payload(const uint8_t *payload, size_t n, size_t *len_p)
{
    uint8_t *f = malloc(KVF_MSG_FRAME_HEADER + n + 1);
    assert_non_null(f);
    memcpy(f, "KVF\x01", 4);
    uint32_t crc = kvf_crc32c(0, payload, n);
    for (int i = 0; i < 4; i++)
        f[4 + i] = (uint8_t)(crc >> (8 * i));
    memcpy(f + KVF_MSG_FRAME_HEADER, payload, n);
    *len_p = KVF_MSG_FRAME_HEADER + n;
    return f;
}

static void test_garbage_with_valid_checksum(void **state)
{
    (void)state;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    uint8_t payload[256];
    int decoded = 0;
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = 1 + (size_t)(x % sizeof(payload));
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            payload[i] = (uint8_t)x;
        }
        size_t len;
        uint8_t *f = frame_payload(payload, n, &len);
        kvf_envelope_t *out = NULL;
        kvf_status_t st = kvf_envelope_decode(f, len, 0, &out);
        if (st == KVF_OK) {
            /* Random bytes rarely form a valid envelope; if they do, it
             * carries a known body and the right version. */
            assert_int_equal(out->version, KVF_PROTO_VERSION);
            assert_int_not_equal(out->body_case, KVF__ENVELOPE__BODY__NOT_SET);
            kvf_envelope_free(out);
            decoded++;
        } else {
            assert_true(st == KVF_ERR_FORMAT || st == KVF_ERR_VERSION);
        }
        free(f);
    }
    assert_true(decoded < 100);
}

static void test_unknown_body_and_version(void **state)
{
    (void)state;
    /* version = KVF_PROTO_VERSION, then field 99 (length-delimited, 2
     * bytes): a body from a newer schema this build does not know. */
    const uint8_t unknown[] = {0x08, (uint8_t)KVF_PROTO_VERSION, 0x9a, 0x06, 0x02, 0x08, 0x01};
    size_t len;
    uint8_t *f = frame_payload(unknown, sizeof(unknown), &len);
    kvf_envelope_t *out = NULL;
    assert_int_equal(kvf_envelope_decode(f, len, 0, &out), KVF_ERR_FORMAT);
    free(f);

    /* A heartbeat from the next protocol version. */
    kvf_envelope_t env;
    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    kvf_envelope_init(&env, "n1");
    env.version = KVF_PROTO_VERSION + 1;
    env.body_case = KVF__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    uint8_t *frame;
    assert_int_equal(kvf_envelope_encode(&env, &frame, &len), KVF_OK);
    assert_int_equal(kvf_envelope_decode(frame, len, 0, &out), KVF_ERR_VERSION);
    free(frame);

    /* No body at all. */
    kvf_envelope_init(&env, "n1");
    assert_int_equal(kvf_envelope_encode(&env, &frame, &len), KVF_OK);
    assert_int_equal(kvf_envelope_decode(frame, len, 0, &out), KVF_ERR_FORMAT);
    free(frame);
    assert_null(out);
}

static void test_oversized(void **state)
{
    (void)state;
    Kvf__PrefillRequest pr = KVF__PREFILL_REQUEST__INIT;
    size_t n = 300000;
    uint32_t *ids = malloc(n * sizeof(*ids));
    assert_non_null(ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = (uint32_t)(i * 2654435761u);
    pr.token_ids = ids;
    pr.n_token_ids = n;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_PREFILL_REQUEST;
    env.prefill_request = &pr;
    uint8_t *frame;
    size_t len;
    assert_int_equal(kvf_envelope_encode(&env, &frame, &len), KVF_OK);
    kvf_envelope_t *out = NULL;
    assert_int_equal(kvf_envelope_decode(frame, len, len - 1, &out), KVF_ERR_TOO_BIG);
    assert_null(out);
    assert_int_equal(kvf_envelope_decode(frame, len, len, &out), KVF_OK);
    assert_int_equal(out->prefill_request->n_token_ids, n);
    assert_memory_equal(out->prefill_request->token_ids, ids, n * sizeof(*ids));
    kvf_envelope_free(out);
    free(frame);
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_body_round_trips),
        cmocka_unit_test(test_empty_and_truncated),
        cmocka_unit_test(test_bit_flips),
        cmocka_unit_test(test_garbage_with_valid_checksum),
        cmocka_unit_test(test_unknown_body_and_version),
        cmocka_unit_test(test_oversized),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
