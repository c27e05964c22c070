/* Registration tokens, per-attempt credentials and bounded refusal logs
 * (kvf/identity.h). */
#include "kvf/identity.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include <sodium.h>

#include "kvf/clock.h"
#include "kvf/log.h"

kvf_status_t kvf_identity_draw(uint8_t token[KVF_REG_TOKEN_LEN])
{
    size_t got = 0;
    while (got < KVF_REG_TOKEN_LEN) {
        ssize_t n = getrandom(token + got, KVF_REG_TOKEN_LEN - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return KVF_ERR_IO;
        got += (size_t)n;
    }
    return KVF_OK;
}

bool kvf_identity_equal(const uint8_t *a, size_t a_len, const uint8_t *b, size_t b_len)
{
    if (!a || !b || a_len == 0 || a_len != b_len)
        return false;
    uint8_t diff = 0;
    for (size_t i = 0; i < a_len; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

void kvf_identity_alloc_token(const uint8_t reg_token[KVF_REG_TOKEN_LEN], uint64_t req_id,
                              uint64_t epoch, uint8_t out_p[KVF_ALLOC_TOKEN_LEN])
{
    uint8_t msg[16];
    for (int i = 0; i < 8; i++) {
        msg[i] = (uint8_t)(req_id >> (8 * i));
        msg[8 + i] = (uint8_t)(epoch >> (8 * i));
    }
    crypto_generichash(out_p, KVF_ALLOC_TOKEN_LEN, msg, sizeof(msg), reg_token,
                       KVF_REG_TOKEN_LEN);
}

void kvf_refusals_init(kvf_refusals_t *c, const char *const *names, unsigned n)
{
    memset(c, 0, sizeof(*c));
    c->names = names;
    c->n = n < KVF_REFUSALS_MAX ? n : KVF_REFUSALS_MAX;
}

void kvf_refusals_note(kvf_refusals_t *c, unsigned reason, const char *fmt, ...)
{
    if (reason >= c->n)
        return;
    c->count[reason]++;
    uint64_t now = kvf_clock_ns();
    if (now - c->window_start_ns >= (uint64_t)KVF_REFUSALS_WINDOW_MS * 1000000ull) {
        if (c->suppressed) {
            char counts[256];
            kvf_refusals_format(c, counts, sizeof(counts));
            kvf_log_warn("%llu more messages refused in the last %u s, not logged (totals: %s)",
                         (unsigned long long)c->suppressed, KVF_REFUSALS_WINDOW_MS / 1000, counts);
        }
        c->window_start_ns = now;
        c->logged = 0;
        c->suppressed = 0;
    }
    if (c->logged >= KVF_REFUSALS_LOG_BURST) {
        c->suppressed++;
        return;
    }
    c->logged++;
    char text[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    kvf_log_warn("refused (%s): %s", c->names[reason], text);
}

void kvf_refusals_format(const kvf_refusals_t *c, char *buf, size_t len)
{
    size_t at = 0;
    if (len)
        buf[0] = '\0';
    for (unsigned i = 0; i < c->n && at < len; i++) {
        int w = snprintf(buf + at, len - at, "%s%s=%llu", i ? " " : "", c->names[i],
                         (unsigned long long)c->count[i]);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}
