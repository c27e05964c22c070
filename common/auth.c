/* The cluster key, signing streams, the replay table and the refusal
 * counters. See kvf/auth.h for the rules; docs/PROTOCOL.md for the frame. */
#include "kvf/auth.h"
#include "kvf/clock.h"
#include "kvf/hashmap.h"
#include "kvf/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SKEW_NS                ((uint64_t)KVF_AUTH_SKEW_MS * 1000000ull)
#define WINDOW_WORDS           (KVF_AUTH_WINDOW / 64u)
#define REFUSE_LOG_INTERVAL_NS 1000000000ull

_Static_assert(KVF_AUTH_WINDOW % 64u == 0, "the window is a whole number of 64-bit words");
_Static_assert(KVF_AUTH_TAG_BYTES == crypto_auth_hmacsha256_BYTES, "tag size");

static const char *const reason_names[KVF_AUTH_N_REASONS] = {
    "untagged", "bad_tag", "replay", "stale", "misdirected",
};

const char *kvf_auth_reason_name(kvf_auth_reason_t reason)
{
    return (unsigned)reason < KVF_AUTH_N_REASONS ? reason_names[reason] : "unknown";
}

/* ---- the key --------------------------------------------------------------- */

/* The HMAC state after the key (its inner and outer pads): copied for each
 * tag, so the key is processed once. Written only by set/clear, which the
 * process calls before its sockets run (kvf/auth.h). */
static crypto_auth_hmacsha256_state key_state;
static atomic_bool key_set;

static bool sodium_ready(void)
{
    /* sodium_init is thread-safe and returns 1 when already initialised. */
    return sodium_init() >= 0;
}

kvf_status_t kvf_auth_set_key(const uint8_t *key, size_t len)
{
    if (!key || len < KVF_AUTH_KEY_MIN_BYTES || len > KVF_AUTH_KEY_MAX_BYTES)
        return KVF_ERR_INVAL;
    if (!sodium_ready()) {
        kvf_log_error("libsodium cannot start");
        return KVF_ERR_INTERNAL;
    }
    crypto_auth_hmacsha256_init(&key_state, key, len);
    atomic_store(&key_set, true);
    return KVF_OK;
}

void kvf_auth_clear_key(void)
{
    atomic_store(&key_set, false);
    sodium_memzero(&key_state, sizeof(key_state));
}

bool kvf_auth_enabled(void)
{
    return atomic_load(&key_set);
}

/* Opens path and checks it is a regular file only its owner may use. */
static kvf_status_t key_file_open(const char *path, int *fd_p)
{
    /* O_NONBLOCK: a FIFO at path must not block the open; it is refused
     * below like any file that is not regular. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        kvf_log_error("cluster key file %s: %s", path, strerror(err));
        return err == ENOENT ? KVF_ERR_NOT_FOUND : kvf_status_from_errno(err);
    }
    struct stat sb;
    kvf_status_t st = KVF_OK;
    if (fstat(fd, &sb) < 0) {
        kvf_log_error("cluster key file %s: fstat: %s", path, strerror(errno));
        st = KVF_ERR_IO;
    } else if (!S_ISREG(sb.st_mode)) {
        kvf_log_error("cluster key file %s: not a regular file", path);
        st = KVF_ERR_INVAL;
    } else if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
        kvf_log_error("cluster key file %s: mode %03o lets group or others use it: chmod 600", path,
                      (unsigned)(sb.st_mode & 0777));
        st = KVF_ERR_INVAL;
    } else if ((uint64_t)sb.st_size > KVF_AUTH_KEY_MAX_BYTES) {
        kvf_log_error("cluster key file %s: %lld bytes, at most %u allowed", path,
                      (long long)sb.st_size, KVF_AUTH_KEY_MAX_BYTES);
        st = KVF_ERR_TOO_BIG;
    }
    if (st != KVF_OK) {
        close(fd);
        return st;
    }
    *fd_p = fd;
    return KVF_OK;
}

/* Reads up to cap bytes of fd into buf; *n_p is what was read. */
static kvf_status_t read_all(int fd, uint8_t *buf, size_t cap, size_t *n_p)
{
    size_t n = 0;
    while (n < cap) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return kvf_status_from_errno(errno);
        if (r == 0)
            break;
        n += (size_t)r;
    }
    *n_p = n;
    return KVF_OK;
}

kvf_status_t kvf_auth_load_key_file(const char *path)
{
    int fd = -1;
    kvf_status_t st = key_file_open(path, &fd);
    if (st != KVF_OK)
        return st;
    /* One byte more than allowed: a file that grew since fstat is seen. */
    uint8_t key[KVF_AUTH_KEY_MAX_BYTES + 1];
    size_t n = 0;
    st = read_all(fd, key, sizeof(key), &n);
    close(fd);
    if (st != KVF_OK)
        kvf_log_error("cluster key file %s: read: %s", path, kvf_status_str(st));
    else if (n < KVF_AUTH_KEY_MIN_BYTES)
        kvf_log_error("cluster key file %s: %zu bytes, at least %u needed (head -c 32 "
                      "/dev/urandom > FILE)",
                      path, n, KVF_AUTH_KEY_MIN_BYTES);
    else if (n > KVF_AUTH_KEY_MAX_BYTES)
        kvf_log_error("cluster key file %s: more than %u bytes", path, KVF_AUTH_KEY_MAX_BYTES);
    if (st == KVF_OK)
        st = n < KVF_AUTH_KEY_MIN_BYTES   ? KVF_ERR_INVAL
             : n > KVF_AUTH_KEY_MAX_BYTES ? KVF_ERR_TOO_BIG
                                          : kvf_auth_set_key(key, n);
    sodium_memzero(key, sizeof(key));
    return st;
}

kvf_status_t kvf_auth_write_key_file(const char *path)
{
    if (!sodium_ready())
        return KVF_ERR_INTERNAL;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        kvf_log_error("cluster key file %s: %s", path, strerror(errno));
        return KVF_ERR_IO;
    }
    uint8_t key[KVF_AUTH_KEY_MIN_BYTES];
    randombytes_buf(key, sizeof(key));
    size_t n = 0;
    while (n < sizeof(key)) {
        ssize_t w = write(fd, key + n, sizeof(key) - n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        n += (size_t)w;
    }
    sodium_memzero(key, sizeof(key));
    bool ok = n == sizeof(key) && fsync(fd) == 0;
    if (close(fd) != 0)
        ok = false;
    if (!ok) {
        kvf_log_error("cluster key file %s: write failed: %s", path, strerror(errno));
        unlink(path);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_auth_setup(const char *key_file)
{
    static atomic_bool warned;
    if (!key_file || !*key_file)
        key_file = getenv(KVF_AUTH_KEY_ENV);
    if (key_file && *key_file) {
        kvf_status_t st = kvf_auth_load_key_file(key_file);
        if (st == KVF_OK)
            kvf_log_info("control plane authenticated with the cluster key of %s", key_file);
        return st;
    }
    if (!atomic_exchange(&warned, true))
        kvf_log_warn("control plane not authenticated: no --cluster-key-file");
    return KVF_OK;
}

kvf_status_t kvf_auth_require(bool required)
{
    if (!required || kvf_auth_enabled())
        return KVF_OK;
    kvf_log_error(
        "--require-key: no cluster key; give --cluster-key-file PATH or $" KVF_AUTH_KEY_ENV
        " (make one with kvf keygen PATH), the same file to every process");
    return KVF_ERR_AUTH;
}

/* ---- sending --------------------------------------------------------------- */

kvf_status_t kvf_auth_stream_init(kvf_auth_stream_t *stream)
{
    if (!sodium_ready())
        return KVF_ERR_INTERNAL;
    randombytes_buf(&stream->nonce, sizeof(stream->nonce));
    atomic_init(&stream->seq, 0);
    return KVF_OK;
}

static kvf_auth_stream_t process_stream;
static bool process_stream_ok;
static pthread_once_t process_stream_once = PTHREAD_ONCE_INIT;

static void process_stream_init(void)
{
    process_stream_ok = kvf_auth_stream_init(&process_stream) == KVF_OK;
}

kvf_auth_stream_t *kvf_auth_process_stream(void)
{
    pthread_once(&process_stream_once, process_stream_init);
    return process_stream_ok ? &process_stream : NULL;
}

uint64_t kvf_auth_stream_next(kvf_auth_stream_t *stream)
{
    return atomic_fetch_add(&stream->seq, 1) + 1;
}

uint64_t kvf_auth_now_unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void kvf_auth_sign(const uint8_t *msg, size_t len, uint8_t tag[KVF_AUTH_TAG_BYTES])
{
    KVF_ASSERT(kvf_auth_enabled());
    crypto_auth_hmacsha256_state st = key_state;
    crypto_auth_hmacsha256_update(&st, msg, len);
    crypto_auth_hmacsha256_final(&st, tag);
    sodium_memzero(&st, sizeof(st));
}

/* ---- counters and refusals -------------------------------------------------- */

static _Atomic uint64_t refused[KVF_AUTH_N_REASONS];
static _Atomic uint64_t refuse_logged_ns[KVF_AUTH_N_REASONS];

kvf_status_t kvf_auth_refuse(kvf_auth_reason_t reason, const char *sender)
{
    KVF_ASSERT((unsigned)reason < KVF_AUTH_N_REASONS);
    uint64_t n = atomic_fetch_add(&refused[reason], 1) + 1;
    /* A peer without the key can send as fast as it likes: one line a
     * second per reason, with the count, is what the log gets. */
    uint64_t now = kvf_clock_ns(), last = atomic_load(&refuse_logged_ns[reason]);
    if ((last == 0 || now - last >= REFUSE_LOG_INTERVAL_NS) &&
        atomic_compare_exchange_strong(&refuse_logged_ns[reason], &last, now))
        kvf_log_warn("control message refused (%s%s%s): %llu refused for this reason so far",
                     reason_names[reason], sender ? ", sender " : "", sender ? sender : "",
                     (unsigned long long)n);
    return KVF_ERR_AUTH;
}

void kvf_auth_counters(kvf_auth_counters_t *out)
{
    for (int r = 0; r < KVF_AUTH_N_REASONS; r++)
        out->refused[r] = atomic_load(&refused[r]);
}

void kvf_auth_counters_format(char *buf, size_t len)
{
    if (!len)
        return;
    if (!kvf_auth_enabled()) {
        snprintf(buf, len, "auth off");
        return;
    }
    kvf_auth_counters_t c;
    kvf_auth_counters(&c);
    snprintf(buf, len,
             "auth refused: untagged %llu bad_tag %llu replay %llu stale %llu "
             "misdirected %llu",
             (unsigned long long)c.refused[KVF_AUTH_UNTAGGED],
             (unsigned long long)c.refused[KVF_AUTH_BAD_TAG],
             (unsigned long long)c.refused[KVF_AUTH_REPLAY],
             (unsigned long long)c.refused[KVF_AUTH_STALE],
             (unsigned long long)c.refused[KVF_AUTH_MISDIRECTED]);
}

/* ---- receiving ------------------------------------------------------------- */

kvf_status_t kvf_auth_verify(const uint8_t *msg, size_t len, const uint8_t tag[KVF_AUTH_TAG_BYTES])
{
    uint8_t want[KVF_AUTH_TAG_BYTES];
    kvf_auth_sign(msg, len, want);
    int diff = crypto_verify_32(want, tag);
    sodium_memzero(want, sizeof(want));
    return diff == 0 ? KVF_OK : kvf_auth_refuse(KVF_AUTH_BAD_TAG, NULL);
}

/* The port of a tcp:// URL (the text after its last ':'), or NULL. */
static const char *tcp_port(const char *url)
{
    if (strncmp(url, "tcp://", 6) != 0)
        return NULL;
    const char *colon = strrchr(url + 6, ':');
    return colon && colon[1] ? colon + 1 : NULL;
}

bool kvf_auth_dest_matches(const char *to, const char *local)
{
    if (!to || !local)
        return false;
    if (!strcmp(to, local))
        return true;
    const char *a = tcp_port(to), *b = tcp_port(local);
    return a && b && !strcmp(a, b);
}

/* ---- the replay table ------------------------------------------------------ */

/* What a receiver remembers of one stream. */
typedef struct {
    uint64_t nonce;              /* the key */
    uint64_t max_seq;            /* the highest sequence number accepted */
    uint64_t newest_sent_ns;     /* the latest sent_unix_ns accepted */
    uint64_t floor_ns;           /* frames sent at or before this are refused (eviction) */
    uint64_t seen[WINDOW_WORDS]; /* bit s % KVF_AUTH_WINDOW: s accepted, for s in
                                  * (max_seq - KVF_AUTH_WINDOW, max_seq] */
    UT_hash_handle hh;
} seen_stream_t;

static struct {
    pthread_mutex_t lock;
    seen_stream_t *table; /* owned entries (malloc'd) */
    size_t n;
    /* The newest frame time of the live streams evicted so far: a stream
     * that enters the table later refuses frames sent before it. */
    uint64_t evicted_ns;
} replay = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool window_has(const seen_stream_t *s, uint64_t seq)
{
    uint64_t bit = seq % KVF_AUTH_WINDOW;
    return (s->seen[bit / 64] >> (bit % 64)) & 1u;
}

static void window_set(seen_stream_t *s, uint64_t seq, bool on)
{
    uint64_t bit = seq % KVF_AUTH_WINDOW, mask = 1ull << (bit % 64);
    if (on)
        s->seen[bit / 64] |= mask;
    else
        s->seen[bit / 64] &= ~mask;
}

/* Takes seq into s's window: false when it was accepted before or is
 * older than the window. */
static bool window_take(seen_stream_t *s, uint64_t seq)
{
    if (seq > s->max_seq) {
        if (seq - s->max_seq >= KVF_AUTH_WINDOW) {
            memset(s->seen, 0, sizeof(s->seen));
        } else {
            for (uint64_t q = s->max_seq + 1; q < seq; q++)
                window_set(s, q, false);
        }
        window_set(s, seq, true);
        s->max_seq = seq;
        return true;
    }
    if (s->max_seq - seq >= KVF_AUTH_WINDOW || window_has(s, seq))
        return false;
    window_set(s, seq, true);
    return true;
}

/* Every frame of s is older than the time window: a replay of one is
 * refused as stale, so s need not be remembered. */
static bool stream_expired(const seen_stream_t *s, uint64_t now)
{
    return s->newest_sent_ns + SKEW_NS < now;
}

/* Makes room for one more stream (lock held): drops the expired ones; if
 * none is, evicts the one least recently active and raises the floor of
 * later streams to its newest frame. */
static void table_make_room(uint64_t now)
{
    seen_stream_t *s, *tmp, *oldest = NULL;
    size_t before = replay.n;
    HASH_ITER(hh, replay.table, s, tmp)
    {
        if (stream_expired(s, now)) {
            HASH_DELETE(hh, replay.table, s);
            free(s);
            replay.n--;
        } else if (!oldest || s->newest_sent_ns < oldest->newest_sent_ns) {
            oldest = s;
        }
    }
    if (replay.n < before || !oldest)
        return;
    if (oldest->newest_sent_ns > replay.evicted_ns)
        replay.evicted_ns = oldest->newest_sent_ns;
    HASH_DELETE(hh, replay.table, oldest);
    free(oldest);
    replay.n--;
}

/* The entry of a stream not in the table yet (lock held), or NULL when
 * out of memory. */
static seen_stream_t *table_add(uint64_t nonce, uint64_t now)
{
    if (replay.n >= KVF_AUTH_MAX_STREAMS)
        table_make_room(now);
    seen_stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->nonce = nonce;
    s->floor_ns = replay.evicted_ns;
    kvf_status_t st;
    KVF_HASH_ADD(replay.table, nonce, s, st);
    if (st != KVF_OK) {
        free(s);
        return NULL;
    }
    replay.n++;
    return s;
}

kvf_status_t kvf_auth_check_fresh(const kvf_auth_stamp_t *stamp, uint64_t now_unix_ns)
{
    uint64_t sent = stamp->sent_unix_ns, now = now_unix_ns;
    if (sent + SKEW_NS < now || sent > now + SKEW_NS || sent > UINT64_MAX - SKEW_NS)
        return kvf_auth_refuse(KVF_AUTH_STALE, stamp->sender);
    if (stamp->seq == 0) /* senders start at 1 */
        return kvf_auth_refuse(KVF_AUTH_REPLAY, stamp->sender);
    pthread_mutex_lock(&replay.lock);
    seen_stream_t *s = NULL;
    HASH_FIND(hh, replay.table, &stamp->nonce, sizeof(stamp->nonce), s);
    if (!s && sent <= replay.evicted_ns) {
        pthread_mutex_unlock(&replay.lock);
        return kvf_auth_refuse(KVF_AUTH_REPLAY, stamp->sender);
    }
    if (!s && !(s = table_add(stamp->nonce, now))) {
        pthread_mutex_unlock(&replay.lock);
        kvf_log_error("replay table: out of memory; frame from %s dropped",
                      stamp->sender ? stamp->sender : "?");
        return KVF_ERR_NOMEM;
    }
    bool fresh = sent > s->floor_ns && window_take(s, stamp->seq);
    if (fresh && sent > s->newest_sent_ns)
        s->newest_sent_ns = sent;
    pthread_mutex_unlock(&replay.lock);
    return fresh ? KVF_OK : kvf_auth_refuse(KVF_AUTH_REPLAY, stamp->sender);
}

size_t kvf_auth_replay_streams(void)
{
    pthread_mutex_lock(&replay.lock);
    size_t n = replay.n;
    pthread_mutex_unlock(&replay.lock);
    return n;
}

void kvf_auth_reset(void)
{
    pthread_mutex_lock(&replay.lock);
    seen_stream_t *s, *tmp;
    HASH_ITER(hh, replay.table, s, tmp)
    {
        HASH_DELETE(hh, replay.table, s);
        free(s);
    }
    replay.n = 0;
    replay.evicted_ns = 0;
    pthread_mutex_unlock(&replay.lock);
    for (int r = 0; r < KVF_AUTH_N_REASONS; r++) {
        atomic_store(&refused[r], 0);
        atomic_store(&refuse_logged_ns[r], 0);
    }
}
