/* The text kvf-decode streams, in the rig of decode_rig.h: a first token
 * that is EOS, a token whose text is U+0000 (sent, and the text after it
 * too), a stop string that spans two tokens (held back, never sent), and a
 * re-dispatched request whose text continues exactly where the client's
 * ends. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "decode_rig.h"

#include <ctype.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/log.h"
#include "kvf/tokenizer.h"

/* A first token that is EOS ends the request at once: a finishing chunk
 * with no token, nothing counted, no text. */
static void test_eos_first_token(void **state)
{
    drig_t *h = *state;
    drig_start(h, NULL);
    drig_prefill_t f = {0};
    drig_prefill_open(h, &f);
    assert_true(f.model->cfg.n_eos > 0);
    uint32_t eos = (uint32_t)f.model->cfg.eos_ids[0];
    const drig_prompt_t *g = &h->prompts[0];
    uint64_t id = 250;
    Kvf__Sampling s = drig_greedy_sampling(DRIG_N_GREEDY);
    s.ignore_eos = false;
    drig_send_kv_alloc(h, id, 1, (uint32_t)g->n_ids, DRIG_N_GREEDY);
    assert_true(drig_pump(h, 5000, drig_alloc_replied, &id));
    assert_int_equal(h->alloc_status, 0);
    drig_prefill_and_ship(h, &f, id, 1, g);
    drig_send_kv_ready(h, id, 1, eos, g->ids, (uint32_t)g->n_ids, &s);
    assert_true(drig_pump(h, 30000, drig_req_finished, &id));
    const drig_req_t *r = drig_seen(h, id);
    assert_int_equal(r->finish, KVF__FINISH_REASON__FINISH_STOP);
    assert_int_equal(r->n_tokens, 0);
    assert_int_equal(r->first_chunk_tokens, 0);
    assert_int_equal(r->n_generated, 0);
    assert_int_equal(r->text_len, 0);
    assert_int_equal(r->error, 0);
    drig_expect_no_blocks_used(h);
    drig_prefill_close(&f);
    assert_int_equal(drig_stop(h), 0);
}

/* The id of the byte-fallback token of the byte 0x00, whose text is U+0000. */
static uint32_t nul_token(void)
{
    kvf_tokenizer_t *tok;
    assert_int_equal(kvf_tokenizer_load(DRIG_MODEL_DIR, &tok), KVF_OK);
    size_t n_ids = kvf_tokenizer_vocab_size(tok), len = 0;
    uint32_t id = 0;
    while (id < n_ids) {
        const uint8_t *b = kvf_tokenizer_token_bytes(tok, id, &len);
        if (b && len == 1 && b[0] == 0)
            break;
        id++;
    }
    kvf_tokenizer_destroy(tok);
    assert_true(id < n_ids);
    return id;
}

/* A first token whose text is U+0000: its chunk carries that one byte,
 * and the text of the tokens after it follows in full. */
static void test_nul_token_text(void **state)
{
    drig_t *h = *state;
    drig_start(h, NULL);
    drig_prefill_t f = {0};
    drig_prefill_open(h, &f);
    uint32_t nul = nul_token();
    const drig_prompt_t *g = &h->prompts[0];
    uint64_t id = 255;
    Kvf__Sampling s = drig_greedy_sampling(8);
    drig_send_kv_alloc(h, id, 1, (uint32_t)g->n_ids, 8);
    assert_true(drig_pump(h, 5000, drig_alloc_replied, &id));
    assert_int_equal(h->alloc_status, 0);
    drig_prefill_and_ship(h, &f, id, 1, g);
    drig_send_kv_ready(h, id, 1, nul, g->ids, (uint32_t)g->n_ids, &s);
    assert_true(drig_pump(h, 30000, drig_req_finished, &id));
    const drig_req_t *r = drig_seen(h, id);
    assert_int_equal(r->finish, KVF__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(r->error, 0);
    assert_int_equal(r->n_tokens, 8);
    assert_int_equal(r->tokens[0], nul);
    assert_int_equal(r->first_chunk_tokens, 1);
    assert_int_equal(r->text_after[1], 1);
    assert_int_equal(r->text[0], '\0');
    size_t len = 0;
    char *want = drig_decode_text(r->tokens, (size_t)r->n_tokens, &len);
    assert_true(len > 1);
    assert_int_equal(r->text_len, len);
    assert_memory_equal(r->text, want, len);
    free(want);
    drig_expect_no_blocks_used(h);
    drig_prefill_close(&f);
    assert_int_equal(drig_stop(h), 0);
}

/* Sends a local prefill request and waits for its end. */
static const drig_req_t *run_local(drig_t *h, uint64_t id, uint64_t epoch, const uint32_t *ids,
                                   size_t n, Kvf__Sampling *s, uint32_t n_generated)
{
    drig_seen(h, id)->base = n_generated;
    drig_send_prefill_request_resumed(h, id, epoch, ids, n, s, n_generated);
    assert_true(drig_pump(h, 30000, drig_req_finished, &id));
    assert_int_equal(drig_seen(h, id)->error, 0);
    return drig_seen(h, id);
}

/* A stop string made of the end of one token's text and the start of the
 * next: found in the golden continuations (the first place where both
 * sides are plain ASCII and the string occurs nowhere before). *k_p: the
 * first token's index; *cut_p: where the stop string starts in the text. */
static bool find_split_stop(const drig_prompt_t *g, char stop[4], int *k_p, size_t *cut_p)
{
    for (int k = 1; k + 1 < DRIG_N_GREEDY; k++) {
        size_t la = 0, lb = 0;
        char *a = drig_decode_text(g->greedy, (size_t)k + 1, &la);
        char *b = drig_decode_text(g->greedy, (size_t)k + 2, &lb);
        bool ok = la >= 1 && lb >= la + 2 && !memcmp(a, b, la) &&
                  isalpha((unsigned char)a[la - 1]) && isalpha((unsigned char)b[la]) &&
                  isalpha((unsigned char)b[la + 1]);
        if (ok) {
            memcpy(stop, b + la - 1, 3);
            stop[3] = '\0';
            ok = strstr(b, stop) == b + la - 1;
        }
        free(a);
        free(b);
        if (ok) {
            *k_p = k;
            *cut_p = la - 1;
            return true;
        }
    }
    return false;
}

/* The node matches stop strings in its own text: one that spans two
 * tokens ends the request with both tokens, and its text ends before the
 * stop string; the part of it in the first token's text was held back
 * and never sent. */
static void test_stop_string_across_tokens(void **state)
{
    drig_t *h = *state;
    drig_start(h, NULL);
    char stop[4];
    int k = -1, p = 0;
    size_t cut = 0;
    while (p < DRIG_N_PROMPTS && !find_split_stop(&h->prompts[p], stop, &k, &cut))
        p++;
    assert_true(p < DRIG_N_PROMPTS);
    const drig_prompt_t *g = &h->prompts[p];
    Kvf__Sampling s = drig_greedy_sampling(DRIG_N_GREEDY);
    char *stops[1] = {stop};
    s.stop = stops;
    s.n_stop = 1;
    const drig_req_t *r = run_local(h, 260, 1, g->ids, g->n_ids, &s, 0);
    assert_int_equal(r->finish, KVF__FINISH_REASON__FINISH_STOP);
    assert_int_equal(r->n_tokens, k + 2);
    for (int i = 0; i < k + 2; i++)
        assert_int_equal(r->tokens[i], g->greedy[i]);
    assert_int_equal(r->n_generated, (uint32_t)k + 2);
    size_t len = 0;
    char *want = drig_decode_text(g->greedy, (size_t)k + 2, &len);
    assert_int_equal(r->text_len, cut);
    assert_memory_equal(r->text, want, cut);
    /* the chunk of the stop string's first token held its part back */
    assert_true(r->text_after[k + 1] <= cut);
    free(want);
    drig_expect_no_blocks_used(h);
    assert_int_equal(drig_stop(h), 0);
}

/* A request dispatched again after m streamed tokens (a new epoch with the
 * prompt and those tokens) continues the text exactly where the client's
 * ends: what the first epoch sent of its first m tokens, followed by what
 * the new epoch sends, is the whole text. Cut where the first epoch still
 * held text back: half a UTF-8 character, and the start of a stop string. */
static void test_redispatch_text_continues(void **state)
{
    drig_t *h = *state;
    drig_start(h, NULL);
    const drig_prompt_t *g = &h->prompts[1];
    Kvf__Sampling s = drig_greedy_sampling(DRIG_N_GREEDY);
    char stop_text[] = "enX"; /* "en" occurs in the output, "enX" does not */
    char *stops[1] = {stop_text};
    s.stop = stops;
    s.n_stop = 1;
    const drig_req_t *whole = run_local(h, 270, 1, g->ids, g->n_ids, &s, 0);
    assert_int_equal(whole->finish, KVF__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(whole->n_tokens, DRIG_N_GREEDY);
    const uint32_t cuts[2] = {1, 5};
    for (int c = 0; c < 2; c++) {
        uint32_t m = cuts[c];
        size_t len = 0;
        char *streamed = drig_decode_text(g->greedy, m, &len);
        free(streamed);
        assert_true(whole->text_after[m] < len); /* something was held back */
        uint32_t ids[64 + DRIG_N_GREEDY];
        memcpy(ids, g->ids, (size_t)g->n_ids * sizeof(*ids));
        memcpy(ids + g->n_ids, g->greedy, m * sizeof(*ids));
        const drig_req_t *again = run_local(h, 271 + c, 2, ids, (size_t)g->n_ids + m, &s, m);
        assert_int_equal(again->finish, KVF__FINISH_REASON__FINISH_LENGTH);
        assert_int_equal(again->n_tokens, DRIG_N_GREEDY - (int)m);
        for (int i = 0; i < again->n_tokens; i++)
            assert_int_equal(again->tokens[i], g->greedy[m + i]);
        assert_int_equal(again->n_generated, DRIG_N_GREEDY);
        size_t before = whole->text_after[m];
        assert_int_equal(before + again->text_len, whole->text_len);
        assert_memory_equal(again->text, whole->text + before, again->text_len);
    }
    drig_expect_no_blocks_used(h);
    assert_int_equal(drig_stop(h), 0);
}

int main(void)
{
    kvf_log_init("test", NULL);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_eos_first_token, drig_setup, drig_teardown),
        cmocka_unit_test_setup_teardown(test_nul_token_text, drig_setup, drig_teardown),
        cmocka_unit_test_setup_teardown(test_stop_string_across_tokens, drig_setup, drig_teardown),
        cmocka_unit_test_setup_teardown(test_redispatch_text_continues, drig_setup, drig_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
