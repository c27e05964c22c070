/* A growable NUL-terminated text buffer for building responses, metrics
 * pages and prompts. The text may hold NUL bytes itself (generated text
 * with U+0000): len, not strlen, is its length. An allocation failure is
 * sticky: later appends do nothing and kvf_strbuf_take() reports
 * KVF_ERR_NOMEM, so builders check once at the end. Caller owns the struct
 * (init/fini); one thread. */
#ifndef KVF_STRBUF_H
#define KVF_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "kvf/status.h"

typedef struct {
    char *data; /* (len + 1) bytes, NUL-terminated once anything was appended */
    size_t len, cap;
    bool failed;
} kvf_strbuf_t;

void kvf_strbuf_init(kvf_strbuf_t *sb);

/* Frees the text (unless taken). */
void kvf_strbuf_fini(kvf_strbuf_t *sb);

void kvf_strbuf_append(kvf_strbuf_t *sb, const char *s, size_t n);
void kvf_strbuf_puts(kvf_strbuf_t *sb, const char *s);
void kvf_strbuf_printf(kvf_strbuf_t *sb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Appends s[0..n) (UTF-8, U+0000 included) as a JSON string literal, the
 * quotes included: '"' and '\\' escaped, the control characters as \n,
 * \t, ... or \u00XX (U+0000 as \u0000), everything else as it is. The
 * literal holds no NUL byte, so it is a C string too. */
void kvf_strbuf_json_string(kvf_strbuf_t *sb, const char *s, size_t n);

/* Hands the text over: *text_p is malloc'd, NUL-terminated, owned by the
 * caller; *len_p (optional) excludes the NUL. The buffer is empty after.
 * KVF_ERR_NOMEM (and the buffer freed) if an append failed. */
kvf_status_t kvf_strbuf_take(kvf_strbuf_t *sb, char **text_p, size_t *len_p);

#endif
