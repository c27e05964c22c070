/* The control plane's authentication (kvf/auth.h) and the tagged frame of
 * kvf/msg.h: sign and verify, a forged or foreign tag, untagged frames,
 * replays, the time window, frames out of order within the replay window
 * and older than it, the replay table's bound, destinations, concurrent
 * signing, and the key file's checks (mode 0600, regular file, size). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvf/auth.h"
#include "kvf/crc32c.h"
#include "kvf/msg.h"

#define SEC_NS 1000000000ull
#define DEST   "tcp://127.0.0.1:5555"

static const uint8_t key_a[32] = "kvferry unit test cluster key A";
static const uint8_t key_b[32] = "kvferry unit test cluster key B";

static int setup(void **state)
{
    (void)state;
    kvf_auth_reset();
    assert_int_equal(kvf_auth_set_key(key_a, sizeof(key_a)), KVF_OK);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvf_auth_clear_key();
    kvf_auth_reset();
    return 0;
}

static uint64_t refused(kvf_auth_reason_t r)
{
    kvf_auth_counters_t c;
    kvf_auth_counters(&c);
    return c.refused[r];
}

static uint64_t refused_total(void)
{
    uint64_t n = 0;
    for (int r = 0; r < KVF_AUTH_N_REASONS; r++)
        n += refused((kvf_auth_reason_t)r);
    return n;
}

/* A Cancel for req_id, framed for DEST on stream (NULL: the process's). */
static uint8_t *cancel_frame(uint64_t req_id, kvf_auth_stream_t *stream, size_t *len_p)
{
    Kvf__Cancel c = KVF__CANCEL__INIT;
    c.req_id = req_id;
    c.epoch = 1;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "test-auth");
    env.body_case = KVF__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    uint8_t *frame = NULL;
    assert_int_equal(kvf_envelope_encode_to(&env, DEST, stream, &frame, len_p), KVF_OK);
    return frame;
}

/* Decodes frame at DEST and the wall clock; the status. */
static kvf_status_t take(const uint8_t *frame, size_t len)
{
    kvf_envelope_t *env = NULL;
    kvf_status_t st = kvf_envelope_decode_at(frame, len, 0, DEST, 0, &env);
    if (st == KVF_OK) {
        assert_int_equal(env->body_case, KVF__ENVELOPE__BODY_CANCEL);
        kvf_envelope_free(env);
    } else {
        assert_null(env);
    }
    return st;
}

static void test_sign_verify(void **state)
{
    (void)state;
    size_t len;
    uint8_t *frame = cancel_frame(42, NULL, &len);
    assert_memory_equal(frame, "KVF\x02", 4);
    kvf_envelope_t *env = NULL;
    assert_int_equal(kvf_envelope_decode_at(frame, len, 0, DEST, 0, &env), KVF_OK);
    assert_int_equal(env->cancel->req_id, 42);
    assert_true(env->auth_seq >= 1);
    assert_string_equal(env->auth_to, DEST);
    assert_int_equal(env->auth_nonce, kvf_auth_process_stream()->nonce);
    kvf_envelope_free(env);
    assert_int_equal(refused_total(), 0);
    /* The same bytes under the tag, verified directly. */
    assert_int_equal(kvf_auth_verify(frame + KVF_MSG_FRAME_HEADER_TAGGED,
                                     len - KVF_MSG_FRAME_HEADER_TAGGED,
                                     frame + KVF_MSG_FRAME_HEADER),
                     KVF_OK);
    free(frame);
}

static void test_forged_tag(void **state)
{
    (void)state;
    size_t len;
    uint8_t *frame = cancel_frame(7, NULL, &len);
    /* A tag of other bytes. */
    frame[KVF_MSG_FRAME_HEADER + 5] ^= 0x01;
    assert_int_equal(take(frame, len), KVF_ERR_AUTH);
    assert_int_equal(refused(KVF_AUTH_BAD_TAG), 1);
    frame[KVF_MSG_FRAME_HEADER + 5] ^= 0x01;
    /* An altered payload with its CRC made to match: the tag refuses it. */
    uint8_t *payload = frame + KVF_MSG_FRAME_HEADER_TAGGED;
    size_t payload_len = len - KVF_MSG_FRAME_HEADER_TAGGED;
    payload[payload_len - 1] ^= 0x01;
    uint32_t crc = kvf_crc32c(0, payload, payload_len);
    for (int i = 0; i < 4; i++)
        frame[4 + i] = (uint8_t)(crc >> (8 * i));
    assert_int_equal(take(frame, len), KVF_ERR_AUTH);
    assert_int_equal(refused(KVF_AUTH_BAD_TAG), 2);
    free(frame);
    assert_int_equal(kvf_auth_set_key(key_b, sizeof(key_b)), KVF_OK);
    frame = cancel_frame(8, NULL, &len);
    assert_int_equal(kvf_auth_set_key(key_a, sizeof(key_a)), KVF_OK);
    assert_int_equal(take(frame, len), KVF_ERR_AUTH);
    assert_int_equal(refused(KVF_AUTH_BAD_TAG), 3);
    free(frame);
    assert_int_equal(refused_total(), 3);
}

static void test_untagged(void **state)
{
    (void)state;
    kvf_auth_clear_key();
    size_t len;
    uint8_t *frame = cancel_frame(9, NULL, &len);
    assert_memory_equal(frame, "KVF\x01", 4);
    /* Unkeyed receivers take it as today. */
    assert_int_equal(take(frame, len), KVF_OK);
    assert_int_equal(kvf_auth_set_key(key_a, sizeof(key_a)), KVF_OK);
    assert_int_equal(take(frame, len), KVF_ERR_AUTH);
    assert_int_equal(refused(KVF_AUTH_UNTAGGED), 1);
    free(frame);
}

static void test_unkeyed_takes_tagged(void **state)
{
    (void)state;
    size_t len;
    uint8_t *frame = cancel_frame(10, NULL, &len);
    kvf_auth_clear_key();
    assert_int_equal(take(frame, len), KVF_OK);
    assert_int_equal(take(frame, len), KVF_OK); /* no replay table without a key */
    /* Its CRC is still checked. */
    frame[len - 1] ^= 0x40;
    assert_int_equal(take(frame, len), KVF_ERR_FORMAT);
    free(frame);
    assert_int_equal(refused_total(), 0);
}

static void test_replay(void **state)
{
    (void)state;
    size_t len;
    uint8_t *frame = cancel_frame(11, NULL, &len);
    assert_int_equal(take(frame, len), KVF_OK);
    assert_int_equal(take(frame, len), KVF_ERR_AUTH);
    assert_int_equal(take(frame, len), KVF_ERR_AUTH);
    assert_int_equal(refused(KVF_AUTH_REPLAY), 2);
    /* The next frame of the stream is new. */
    size_t len2;
    uint8_t *next = cancel_frame(11, NULL, &len2);
    assert_int_equal(take(next, len2), KVF_OK);
    free(next);
    free(frame);
    assert_int_equal(refused_total(), 2);
}

static void test_time_window(void **state)
{
    (void)state;
    size_t len;
    uint8_t *frame = cancel_frame(12, NULL, &len);
    uint64_t now = kvf_auth_now_unix_ns();
    uint64_t skew = (uint64_t)KVF_AUTH_SKEW_MS * 1000000ull;
    kvf_envelope_t *env = NULL;
    /* The receiver's clock far ahead of the sender's, then far behind. */
    assert_int_equal(kvf_envelope_decode_at(frame, len, 0, DEST, now + skew + SEC_NS, &env),
                     KVF_ERR_AUTH);
    assert_int_equal(kvf_envelope_decode_at(frame, len, 0, DEST, now - skew - SEC_NS, &env),
                     KVF_ERR_AUTH);
    assert_int_equal(refused(KVF_AUTH_STALE), 2);
    /* Inside the window (a refused frame was not recorded as seen). */
    assert_int_equal(kvf_envelope_decode_at(frame, len, 0, DEST, now + skew - SEC_NS, &env),
                     KVF_OK);
    kvf_envelope_free(env);
    free(frame);
}

/* check_fresh on one stream at time now. */
static kvf_status_t fresh(uint64_t nonce, uint64_t seq, uint64_t sent, uint64_t now)
{
    kvf_auth_stamp_t s = {.nonce = nonce, .seq = seq, .sent_unix_ns = sent, .sender = "t"};
    return kvf_auth_check_fresh(&s, now);
}

static void test_out_of_order(void **state)
{
    (void)state;
    uint64_t t = 1700000000ull * SEC_NS, n = 0x5eed;
    /* Out of order within the window: each taken once. */
    static const uint64_t order[] = {5, 3, 4, 1, 2, 9, 6};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
        assert_int_equal(fresh(n, order[i], t, t), KVF_OK);
    assert_int_equal(fresh(n, 3, t, t), KVF_ERR_AUTH);
    assert_int_equal(fresh(n, 9, t, t), KVF_ERR_AUTH);
    assert_int_equal(fresh(n, 7, t, t), KVF_OK);
    assert_int_equal(fresh(n, 0, t, t), KVF_ERR_AUTH); /* senders start at 1 */
    /* A jump: what falls out of the window is refused, what is inside and
     * unseen is taken. */
    uint64_t top = 9 + 2 * KVF_AUTH_WINDOW;
    assert_int_equal(fresh(n, top, t, t), KVF_OK);
    assert_int_equal(fresh(n, 8, t, t), KVF_ERR_AUTH);
    assert_int_equal(fresh(n, top - KVF_AUTH_WINDOW, t, t), KVF_ERR_AUTH);
    assert_int_equal(fresh(n, top - KVF_AUTH_WINDOW + 1, t, t), KVF_OK);
    assert_int_equal(fresh(n, top - KVF_AUTH_WINDOW + 1, t, t), KVF_ERR_AUTH);
    assert_int_equal(fresh(n, top - 1, t, t), KVF_OK);
    /* A step forward clears the slots it passes over: top+1 shares its
     * slot with top-W+1, taken above, and is still new. */
    assert_int_equal(fresh(n, top + 2, t, t), KVF_OK);
    assert_int_equal(fresh(n, top + 1, t, t), KVF_OK);
    /* Another stream's numbers are its own. */
    assert_int_equal(fresh(n + 1, 3, t, t), KVF_OK);
    assert_int_equal(refused(KVF_AUTH_REPLAY), 6);
    assert_int_equal(kvf_auth_replay_streams(), 2);
}

static void test_table_bound(void **state)
{
    (void)state;
    uint64_t t = 1700000000ull * SEC_NS;
    uint64_t skew = (uint64_t)KVF_AUTH_SKEW_MS * 1000000ull;
    /* Full of live streams, one sent a little earlier than the others. */
    assert_int_equal(fresh(1, 1, t - SEC_NS, t), KVF_OK);
    for (uint64_t s = 2; s <= KVF_AUTH_MAX_STREAMS; s++)
        assert_int_equal(fresh(s, 1, t, t), KVF_OK);
    assert_int_equal(kvf_auth_replay_streams(), KVF_AUTH_MAX_STREAMS);
    /* One more: the least recently active (stream 1) is evicted, and its
     * frame replayed is still refused. */
    assert_int_equal(fresh(KVF_AUTH_MAX_STREAMS + 1, 1, t, t), KVF_OK);
    assert_int_equal(kvf_auth_replay_streams(), KVF_AUTH_MAX_STREAMS);
    assert_int_equal(fresh(1, 1, t - SEC_NS, t), KVF_ERR_AUTH);
    assert_int_equal(fresh(1, 2, t - SEC_NS, t), KVF_ERR_AUTH);
    assert_int_equal(refused(KVF_AUTH_REPLAY), 2);
    /* Its later frames are taken. */
    assert_int_equal(fresh(1, 3, t + SEC_NS, t + SEC_NS), KVF_OK);
    /* Past the time window every stream has expired: a new one empties
     * the table of them. */
    uint64_t later = t + skew + 2 * SEC_NS;
    assert_int_equal(fresh(0xabc00000000ull, 1, later, later), KVF_OK);
    assert_int_equal(kvf_auth_replay_streams(), 1);
}

static void test_destination(void **state)
{
    (void)state;
    assert_true(kvf_auth_dest_matches("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"));
    assert_true(kvf_auth_dest_matches("tcp://routerhost:5555", "tcp://0.0.0.0:5555"));
    assert_true(kvf_auth_dest_matches("tcp://[::1]:5555", "tcp://*:5555"));
    assert_false(kvf_auth_dest_matches("tcp://127.0.0.1:5556", "tcp://127.0.0.1:5555"));
    assert_true(kvf_auth_dest_matches("ipc:///tmp/a", "ipc:///tmp/a"));
    assert_false(kvf_auth_dest_matches("ipc:///tmp/a", "ipc:///tmp/b"));
    assert_false(kvf_auth_dest_matches("ipc:///tmp/a:5555", "tcp://127.0.0.1:5555"));
    assert_true(kvf_auth_dest_matches("", ""));
    assert_false(kvf_auth_dest_matches(DEST, ""));
    assert_false(kvf_auth_dest_matches("", DEST));
    /* A frame for another inbox is refused and not recorded: the right one
     * still takes it. */
    size_t len;
    uint8_t *frame = cancel_frame(13, NULL, &len);
    kvf_envelope_t *env = NULL;
    assert_int_equal(kvf_envelope_decode_at(frame, len, 0, "tcp://127.0.0.1:6000", 0, &env),
                     KVF_ERR_AUTH);
    assert_int_equal(kvf_envelope_decode_at(frame, len, 0, "", 0, &env), KVF_ERR_AUTH);
    assert_int_equal(refused(KVF_AUTH_MISDIRECTED), 2);
    assert_int_equal(take(frame, len), KVF_OK);
    free(frame);
}

/* ---- concurrent signing ----------------------------------------------------- */

#define N_THREADS  4
#define PER_THREAD 200 /* all of them fit the replay window */

typedef struct {
    kvf_auth_stream_t *stream;
    uint8_t *frames[PER_THREAD];
    size_t lens[PER_THREAD];
} signer_t;

static void *sign_many(void *arg)
{
    signer_t *s = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        Kvf__Cancel c = KVF__CANCEL__INIT;
        c.req_id = (uint64_t)i;
        kvf_envelope_t env;
        kvf_envelope_init(&env, "signer");
        env.body_case = KVF__ENVELOPE__BODY_CANCEL;
        env.cancel = &c;
        if (kvf_envelope_encode_to(&env, DEST, s->stream, &s->frames[i], &s->lens[i]) != KVF_OK)
            s->frames[i] = NULL;
    }
    return NULL;
}

static void test_concurrent_signing(void **state)
{
    (void)state;
    kvf_auth_stream_t stream;
    assert_int_equal(kvf_auth_stream_init(&stream), KVF_OK);
    signer_t signers[N_THREADS];
    pthread_t threads[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        signers[t].stream = &stream;
        assert_int_equal(pthread_create(&threads[t], NULL, sign_many, &signers[t]), 0);
    }
    for (int t = 0; t < N_THREADS; t++)
        pthread_join(threads[t], NULL);
    /* Every frame has its own sequence number: all are taken, once. */
    for (int t = 0; t < N_THREADS; t++) {
        for (int i = 0; i < PER_THREAD; i++) {
            assert_non_null(signers[t].frames[i]);
            assert_int_equal(take(signers[t].frames[i], signers[t].lens[i]), KVF_OK);
        }
    }
    assert_int_equal(take(signers[0].frames[0], signers[0].lens[0]), KVF_ERR_AUTH);
    assert_int_equal(atomic_load(&stream.seq), N_THREADS * PER_THREAD);
    for (int t = 0; t < N_THREADS; t++)
        for (int i = 0; i < PER_THREAD; i++)
            free(signers[t].frames[i]);
}

/* ---- the key file -------------------------------------------------------- */

static char dir[64];

static void path_in_dir(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", dir, name);
}

/* Writes n bytes (a pattern) to dir/name with mode. */
static void write_file(const char *name, size_t n, mode_t mode, char *path, size_t path_len)
{
    path_in_dir(path, path_len, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)(i * 31 + 7);
        assert_int_equal(write(fd, &b, 1), 1);
    }
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_key_file(void **state)
{
    (void)state;
    kvf_auth_clear_key();
    snprintf(dir, sizeof(dir), "/tmp/kvf-test-auth-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char good[128], loose[128], group[128], readonly[128], shortk[128], big[128], missing[128];
    char fifo[128], link[128], made[128];
    write_file("good", 32, 0600, good, sizeof(good));
    write_file("loose", 32, 0644, loose, sizeof(loose));
    write_file("group", 64, 0660, group, sizeof(group));
    write_file("readonly", 100, 0400, readonly, sizeof(readonly));
    write_file("short", 31, 0600, shortk, sizeof(shortk));
    write_file("big", KVF_AUTH_KEY_MAX_BYTES + 1, 0600, big, sizeof(big));
    path_in_dir(missing, sizeof(missing), "missing");
    path_in_dir(fifo, sizeof(fifo), "fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    path_in_dir(link, sizeof(link), "link");
    assert_int_equal(symlink(good, link), 0);

    assert_int_equal(kvf_auth_load_key_file(loose), KVF_ERR_INVAL);
    assert_int_equal(kvf_auth_load_key_file(group), KVF_ERR_INVAL);
    assert_int_equal(kvf_auth_load_key_file(shortk), KVF_ERR_INVAL);
    assert_int_equal(kvf_auth_load_key_file(big), KVF_ERR_TOO_BIG);
    assert_int_equal(kvf_auth_load_key_file(missing), KVF_ERR_NOT_FOUND);
    assert_int_equal(kvf_auth_load_key_file(dir), KVF_ERR_INVAL);  /* a directory */
    assert_int_equal(kvf_auth_load_key_file(fifo), KVF_ERR_INVAL); /* and does not block */
    assert_false(kvf_auth_enabled());
    assert_int_equal(kvf_auth_setup(loose), KVF_ERR_INVAL);
    assert_false(kvf_auth_enabled());

    assert_int_equal(kvf_auth_load_key_file(readonly), KVF_OK);
    assert_true(kvf_auth_enabled());
    assert_int_equal(kvf_auth_load_key_file(link), KVF_OK);
    /* The file's bytes are the key: a frame signed with them verifies
     * under the same bytes set directly. */
    size_t len;
    uint8_t *frame = cancel_frame(14, NULL, &len);
    uint8_t same[32];
    for (size_t i = 0; i < sizeof(same); i++)
        same[i] = (uint8_t)(i * 31 + 7);
    assert_int_equal(kvf_auth_set_key(same, sizeof(same)), KVF_OK);
    assert_int_equal(take(frame, len), KVF_OK);
    free(frame);

    /* kvf keygen's writer: a new 0600 file of 32 bytes, never over one. */
    path_in_dir(made, sizeof(made), "made");
    assert_int_equal(kvf_auth_write_key_file(made), KVF_OK);
    struct stat sb;
    assert_int_equal(stat(made, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    assert_int_equal(sb.st_size, 32);
    assert_int_equal(kvf_auth_write_key_file(made), KVF_ERR_IO);
    assert_int_equal(kvf_auth_setup(made), KVF_OK);

    const char *all[] = {good, loose, group, readonly, shortk, big, fifo, link, made};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        unlink(all[i]);
    assert_int_equal(rmdir(dir), 0);
}

static void test_set_key_sizes(void **state)
{
    (void)state;
    uint8_t k[KVF_AUTH_KEY_MAX_BYTES + 1];
    memset(k, 3, sizeof(k));
    assert_int_equal(kvf_auth_set_key(k, KVF_AUTH_KEY_MIN_BYTES - 1), KVF_ERR_INVAL);
    assert_int_equal(kvf_auth_set_key(k, KVF_AUTH_KEY_MAX_BYTES + 1), KVF_ERR_INVAL);
    assert_int_equal(kvf_auth_set_key(NULL, 32), KVF_ERR_INVAL);
    assert_int_equal(kvf_auth_set_key(k, KVF_AUTH_KEY_MAX_BYTES), KVF_OK);
    /* A key longer than SHA-256's block still signs and verifies. */
    size_t len;
    uint8_t *frame = cancel_frame(15, NULL, &len);
    assert_int_equal(take(frame, len), KVF_OK);
    free(frame);
    char text[160];
    kvf_auth_counters_format(text, sizeof(text));
    assert_string_equal(text, "auth refused: untagged 0 bad_tag 0 replay 0 stale 0 misdirected 0");
    kvf_auth_clear_key();
    kvf_auth_counters_format(text, sizeof(text));
    assert_string_equal(text, "auth off");
}

/* --require-key: refused without a key, taken with one; and which
 * control-plane URLs only this host can reach (the router warns about the
 * others when it has no key). */
static void test_require_key(void **state)
{
    (void)state;
    assert_int_equal(kvf_auth_require(true), KVF_OK); /* setup set a key */
    kvf_auth_clear_key();
    assert_int_equal(kvf_auth_require(false), KVF_OK);
    assert_int_equal(kvf_auth_require(true), KVF_ERR_AUTH);

    static const char *const local[] = {"tcp://127.0.0.1:5555",  "tcp://127.8.9.10:1",
                                        "tcp://localhost:5555",  "tcp://[::1]:5555",
                                        "ipc:///tmp/kvf-router", "inproc://router"};
    static const char *const open_urls[] = {"tcp://0.0.0.0:5555",
                                            "tcp://*:5555",
                                            "tcp://10.0.0.7:5555",
                                            "tcp://router:5555",
                                            "tcp://[::]:5555",
                                            "tcp://128.0.0.1:1",
                                            "tcp://127.0.0.1.example.org:1",
                                            "tcp://1270.0.0.1:1",
                                            "tcp://127.0.0.256:1",
                                            "ws://127.0.0.1:1",
                                            NULL};
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
        if (!kvf_net_url_is_local(local[i]))
            fail_msg("%s: not taken as local", local[i]);
    for (size_t i = 0; i < sizeof(open_urls) / sizeof(open_urls[0]); i++)
        if (kvf_net_url_is_local(open_urls[i]))
            fail_msg("%s: taken as local", open_urls[i] ? open_urls[i] : "NULL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sign_verify, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forged_tag, setup, teardown),
        cmocka_unit_test_setup_teardown(test_untagged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unkeyed_takes_tagged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_time_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_table_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destination, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_signing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_key_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_require_key, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
