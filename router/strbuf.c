#include "strbuf.h"

#include "kvf/array.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvf_strbuf_init(kvf_strbuf_t *sb)
{
    memset(sb, 0, sizeof(*sb));
}

void kvf_strbuf_fini(kvf_strbuf_t *sb)
{
    free(sb->data);
    kvf_strbuf_init(sb);
}

static bool reserve(kvf_strbuf_t *sb, size_t more)
{
    if (sb->failed)
        return false;
    if (more > SIZE_MAX - 1 - sb->len ||
        kvf_array_reserve(&sb->data, &sb->cap, sb->len + more + 1, 256, 1) != KVF_OK) {
        sb->failed = true;
        return false;
    }
    return true;
}

void kvf_strbuf_append(kvf_strbuf_t *sb, const char *s, size_t n)
{
    if (!reserve(sb, n))
        return;
    memcpy(sb->data + sb->len, s, n);
    sb->len += n;
    sb->data[sb->len] = '\0';
}

void kvf_strbuf_puts(kvf_strbuf_t *sb, const char *s)
{
    kvf_strbuf_append(sb, s, strlen(s));
}

void kvf_strbuf_printf(kvf_strbuf_t *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        sb->failed = true;
        return;
    }
    if (!reserve(sb, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

/* The escape of c, a quote, a backslash or a control character, into
 * out (NUL-terminated). */
static void json_escape(unsigned char c, char out[7])
{
    static const char hex[] = "0123456789abcdef";
    const char *two = NULL;
    switch (c) {
    case '"':
        two = "\\\"";
        break;
    case '\\':
        two = "\\\\";
        break;
    case '\b':
        two = "\\b";
        break;
    case '\f':
        two = "\\f";
        break;
    case '\n':
        two = "\\n";
        break;
    case '\r':
        two = "\\r";
        break;
    case '\t':
        two = "\\t";
        break;
    }
    if (two) {
        memcpy(out, two, 3);
        return;
    }
    memcpy(out, "\\u00", 4);
    out[4] = hex[c >> 4];
    out[5] = hex[c & 15];
    out[6] = '\0';
}

void kvf_strbuf_json_string(kvf_strbuf_t *sb, const char *s, size_t n)
{
    kvf_strbuf_append(sb, "\"", 1);
    size_t from = 0; /* s[from..i) is copied as it is */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        char esc[7];
        json_escape(c, esc);
        kvf_strbuf_append(sb, s + from, i - from);
        kvf_strbuf_puts(sb, esc);
        from = i + 1;
    }
    kvf_strbuf_append(sb, s + from, n - from);
    kvf_strbuf_append(sb, "\"", 1);
}

kvf_status_t kvf_strbuf_take(kvf_strbuf_t *sb, char **text_p, size_t *len_p)
{
    if (sb->failed || !reserve(sb, 0)) {
        kvf_strbuf_fini(sb);
        return KVF_ERR_NOMEM;
    }
    sb->data[sb->len] = '\0';
    *text_p = sb->data;
    if (len_p)
        *len_p = sb->len;
    kvf_strbuf_init(sb);
    return KVF_OK;
}
