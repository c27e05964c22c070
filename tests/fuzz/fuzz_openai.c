/* Fuzzes kvf_openai_parse: each input is the body of both a completions
 * and a chat completions request, for a server with a chat template and
 * BOS / EOS text. */
#include "fuzz.h"
#include "openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_fuzz_quiet();
    const kvf_openai_server_t srv = {
        .model_name = "tiny",
        .chat = KVF_CHAT_LLAMA3,
        .bos_text = "<s>",
        .eos_text = "</s>",
        .leading_bos = true,
    };
    for (int chat = 0; chat < 2; chat++) {
        kvf_openai_request_t req;
        kvf_openai_error_t err;
        (void)kvf_openai_parse(&srv, chat, (const char *)data, size, &req, &err);
        kvf_openai_request_fini(&req);
    }
    return 0;
}
