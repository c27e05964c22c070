/* U+0000 in the strings of a JSON request body.
 *
 * cJSON decodes \u0000 to a 0 byte and hands strings out NUL-terminated,
 * without their length: a prompt holding U+0000 would silently lose
 * everything after it. So before the body is parsed each \u0000 escape is
 * replaced by the two bytes C0 80, an overlong encoding that UTF-8 text
 * never holds (kvf_json_nul_hide); the strings then pass through the
 * parser and the chat renderers whole, and the finished prompt turns each
 * C0 80 back into the 0 byte and travels with its length
 * (kvf_json_nul_restore).
 *
 * Thread rules: pure functions; any thread. */
#ifndef KVF_ROUTER_JSON_NUL_H
#define KVF_ROUTER_JSON_NUL_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "kvf/status.h"

/* The body (len bytes) with every \u0000 escape as C0 80. When it holds
 * none, *out_p is NULL (parse the body as it is). A body that holds a C0
 * byte of its own beside a \u0000 escape cannot be told apart afterwards:
 * KVF_ERR_INVAL. On success a non-NULL *out_p is malloc'd, NUL-terminated,
 * *len_p bytes long without the NUL, and owned by the caller (free()). */
kvf_status_t kvf_json_nul_hide(const char *body, size_t len, char **out_p, size_t *len_p);

/* Parses the body (len bytes) with its \u0000 escapes hidden. *hidden_p
 * says whether there were any (then the strings that may hold them go
 * through kvf_json_nul_restore). Not JSON: KVF_ERR_FORMAT; the C0 clash
 * above: KVF_ERR_INVAL. On success *root_p is owned by the caller
 * (cJSON_Delete). */
kvf_status_t kvf_json_nul_parse(const char *body, size_t len, cJSON **root_p, bool *hidden_p);

/* Turns each C0 80 of the NUL-terminated s back into a 0 byte, in place;
 * returns the length of the result. */
size_t kvf_json_nul_restore(char *s);

#endif
