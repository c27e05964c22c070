/* U+0000 in JSON request bodies: see json_nul.h. */
#include "json_nul.h"

#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_json_nul_hide(const char *body, size_t len, char **out_p, size_t *len_p)
{
    bool any = false, c0 = false;
    /* Backslashes occur only inside strings, and each starts an escape of
     * at least two characters: stepping over the escaped character keeps
     * "\\u0000" (a backslash, then text) from being read as an escape. */
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)body[i] == 0xC0)
            c0 = true;
        else if (body[i] == '\\' && i + 1 < len) {
            any |= len - i >= 6 && !memcmp(body + i + 1, "u0000", 5);
            i++;
        }
    }
    if (!any) {
        *out_p = NULL;
        *len_p = 0;
        return KVF_OK;
    }
    if (c0)
        return KVF_ERR_INVAL;
    char *out = malloc(len + 1);
    if (!out)
        return KVF_ERR_NOMEM;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (body[i] == '\\' && i + 1 < len) {
            if (len - i >= 6 && !memcmp(body + i + 1, "u0000", 5)) {
                out[n++] = (char)0xC0;
                out[n++] = (char)0x80;
                i += 5;
            } else {
                out[n++] = body[i++];
                out[n++] = body[i];
            }
            continue;
        }
        out[n++] = body[i];
    }
    out[n] = '\0';
    *out_p = out;
    *len_p = n;
    return KVF_OK;
}

kvf_status_t kvf_json_nul_parse(const char *body, size_t len, cJSON **root_p, bool *hidden_p)
{
    char *hidden;
    size_t hidden_len;
    kvf_status_t st = kvf_json_nul_hide(body ? body : "", body ? len : 0, &hidden, &hidden_len);
    if (st != KVF_OK)
        return st;
    cJSON *root = hidden ? cJSON_ParseWithLength(hidden, hidden_len)
                         : cJSON_ParseWithLength(body ? body : "", body ? len : 0);
    free(hidden);
    if (!root)
        return KVF_ERR_FORMAT;
    *root_p = root;
    *hidden_p = hidden != NULL;
    return KVF_OK;
}

size_t kvf_json_nul_restore(char *s)
{
    size_t n = 0;
    for (size_t i = 0; s[i]; i++) {
        if ((unsigned char)s[i] == 0xC0 && (unsigned char)s[i + 1] == 0x80) {
            s[n++] = '\0';
            i++;
        } else {
            s[n++] = s[i];
        }
    }
    s[n] = '\0';
    return n;
}
