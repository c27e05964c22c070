/* Fuzzes kvf_chat_render with every template kvf_chat_template_parse
 * knows. The input is split at NUL bytes into strings taken in pairs:
 * (role, content), a role byte 0-3 picking system / user / assistant or
 * the string itself as the role. */
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "fuzz.h"

#define FUZZ_CHAT_MAX_MSGS 16

static const char *const fuzz_templates[] = {
    "llama3", "llama3.1", "chatml",       "qwen2",        "qwen2.5",      "qwen3",
    "llama2", "mistral",  "mistral-v0.1", "mistral-v0.2", "mistral-v0.3", "gemma",
};
static const char *const fuzz_roles[] = {"system", "user", "assistant", "tool"};

/* Splits buf (NUL-terminated, len bytes before the NUL) into messages. */
static size_t split_messages(char *buf, size_t len, kvf_chat_message_t *msgs)
{
    size_t n = 0;
    char *p = buf, *end = buf + len;
    while (p < end && n < FUZZ_CHAT_MAX_MSGS) {
        const char *role = p;
        p += strlen(p) + 1;
        if ((unsigned char)role[0] < 4 && role[0] != 0 && role[1] == 0)
            role = fuzz_roles[(unsigned char)role[0]];
        else if (role[0] == 0)
            role = fuzz_roles[n % 3];
        const char *content = p < end ? p : "";
        if (p < end)
            p += strlen(p) + 1;
        msgs[n].role = role;
        msgs[n].content = content;
        n++;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    buf[size] = 0;
    kvf_chat_message_t msgs[FUZZ_CHAT_MAX_MSGS];
    size_t n = split_messages(buf, size, msgs);
    for (size_t i = 0; n && i < sizeof(fuzz_templates) / sizeof(fuzz_templates[0]); i++) {
        kvf_chat_template_t t;
        if (kvf_chat_template_parse(fuzz_templates[i], &t) != KVF_OK)
            continue;
        for (int bos = 0; bos < 2; bos++) {
            char *text = NULL, why[200];
            if (kvf_chat_render(t, msgs, n, bos ? "<s>" : NULL, bos ? "</s>" : NULL, bos, &text,
                                why, sizeof(why)) == KVF_OK)
                free(text);
        }
    }
    free(buf);
    return 0;
}
