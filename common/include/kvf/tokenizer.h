/* Tokenizer: BPE from a Hugging Face tokenizer.json, byte-level (GPT-2,
 * Llama 3, Qwen2/3) or over characters with byte fallback (Llama 2,
 * Gemma), encoding as Hugging Face's tokenizers do.
 *
 * Encoding: added tokens are cut out of the text first (longest match;
 * lstrip/rstrip take the white space beside them); each remaining section
 * goes through the normalizer (NFC, NFD, NFKC, NFKD, Prepend, Replace,
 * Sequence), is cut again at the added tokens matched in normalized form,
 * split by the pre-tokenizer (ByteLevel, Split, Metaspace, Digits,
 * Sequence; regexes in PCRE2 with Unicode properties), and every piece is
 * merged by rank, from its bytes' ByteLevel symbols or its characters (a
 * character missing from the vocabulary becomes its <0xNN> tokens with
 * byte_fallback, else the unknown token). The post-processor
 * (TemplateProcessing, ByteLevel, Sequence) says which special tokens go
 * before and after. A component outside these lists is refused at load.
 * Decoding follows tokenizer.json's decoder as Hugging Face does
 * (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence; no
 * decoder: tokens joined by spaces): special tokens decode to their text,
 * invalid UTF-8 (ByteLevel bytes, a run of <0xNN> tokens) becomes U+FFFD
 * for each invalid subpart.
 *
 * Thread rules: a loaded tokenizer is immutable; any number of threads may
 * encode and decode with it at once. A kvf_detok_t belongs to one thread. */
#ifndef KVF_TOKENIZER_H
#define KVF_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"

typedef struct kvf_tokenizer kvf_tokenizer_t;

/* Loads <model_dir>/tokenizer.json and, when present,
 * <model_dir>/tokenizer_config.json. Unsupported features (a non-BPE model,
 * an unknown pre-tokenizer or decoder) are KVF_ERR_UNSUPPORTED, malformed
 * files KVF_ERR_FORMAT, both logged with the file name and the component.
 * On success *tok_p is
 * owned by the caller, who frees it with kvf_tokenizer_destroy(). */
kvf_status_t kvf_tokenizer_load(const char *model_dir, kvf_tokenizer_t **tok_p);

/* Frees the tokenizer; NULL is a no-op. */
void kvf_tokenizer_destroy(kvf_tokenizer_t *tok);

/* Encodes len bytes of text (any bytes: each byte that is not valid UTF-8
 * is a piece of its own, its byte symbol, <0xNN> token or the unknown
 * token). add_bos means "add special tokens": the post-processor's
 * template puts its special tokens before the text (BOS,
 * kvf_tokenizer_adds_bos) and after it (EOS where the template says), as
 * Hugging Face's JS tokenizers do; tokenizer_config.json's add_bos_token
 * and add_eos_token do not change that. On success *ids_p is malloc'd and
 * owned by the caller (free()); it is non-NULL even when *n_p is 0. */
kvf_status_t kvf_tokenizer_encode(const kvf_tokenizer_t *tok, const char *text, size_t len,
                                  bool add_bos, uint32_t **ids_p, size_t *n_p);

/* Decodes ids to UTF-8 text through the decoder chain: special tokens as
 * their text, invalid byte sequences as U+FFFD. An id the tokenizer does not know (beyond its
 * vocabulary, e.g. a model whose embedding is larger, or a gap) decodes to
 * nothing. On success *text_p is malloc'd, NUL-terminated and owned by the
 * caller (free()); *len_p (optional, may be NULL) excludes the NUL. The
 * text holds U+0000 where a token stands for the byte 0x00: its length is
 * *len_p, not strlen. */
kvf_status_t kvf_tokenizer_decode(const kvf_tokenizer_t *tok, const uint32_t *ids, size_t n,
                                  char **text_p, size_t *len_p);

/* One more than the largest id of the vocabulary and the added tokens. */
size_t kvf_tokenizer_vocab_size(const kvf_tokenizer_t *tok);

/* True when id names a token (vocabulary entry or added token). */
bool kvf_tokenizer_has_id(const kvf_tokenizer_t *tok, uint32_t id);

/* BOS / EOS ids from tokenizer_config.json (or the post_processor's
 * template's first token for BOS); -1 when the tokenizer has none. */
int64_t kvf_tokenizer_bos_id(const kvf_tokenizer_t *tok);
int64_t kvf_tokenizer_eos_id(const kvf_tokenizer_t *tok);

/* Whether encode(add_bos = true) prepends a token (the template starts
 * with a special token). */
bool kvf_tokenizer_adds_bos(const kvf_tokenizer_t *tok);

/* The token's string as written in tokenizer.json ("Ġthe",
 * "<|end_of_text|>"), NUL-terminated, owned by the tokenizer; NULL for an
 * unknown id. */
const char *kvf_tokenizer_token_text(const kvf_tokenizer_t *tok, uint32_t id);

/* The bytes a token decodes to when it is not the first of a sequence,
 * through the decoder's per-token steps (a ByteLevel symbol's byte, a
 * <0xNN> byte token's byte, "▁" as a space under Metaspace; may be a
 * partial UTF-8 sequence), owned by the tokenizer; NULL and *len_p = 0 for
 * an unknown id. */
const uint8_t *kvf_tokenizer_token_bytes(const kvf_tokenizer_t *tok, uint32_t id, size_t *len_p);

/* The id of a token string as written in tokenizer.json (vocabulary or
 * added token); KVF_ERR_NOT_FOUND if there is none. */
kvf_status_t kvf_tokenizer_token_id(const kvf_tokenizer_t *tok, const char *text, uint32_t *id_p);

/* Incremental decoder for streaming: text is released only once no later
 * token can change it (whole UTF-8 characters; a byte-fallback run's
 * characters once complete; a character a Strip of the joined text might
 * remove, once it is known not to be). The concatenation of every push and
 * the final flush equals kvf_tokenizer_decode() of the same ids, and text
 * handed out is never taken back. Caller owns the struct (init/fini); the
 * fields are private. */
#define KVF_DETOK_MAX_STRIPS     4 /* Strip decoders after a Fuse */
#define KVF_DETOK_MAX_STRIPS_STR "4"
typedef struct {
    const kvf_tokenizer_t *tok;
    uint8_t pending[4]; /* a valid but incomplete UTF-8 prefix */
    size_t n_pending;
    uint8_t *run; /* a byte-fallback run held whole (run_cap) */
    size_t n_run, run_cap;
    bool in_run;                               /* the last token was a byte-fallback byte */
    bool started;                              /* a known token was pushed */
    bool had_element;                          /* an element (token or run) is complete */
    uint32_t strip_left[KVF_DETOK_MAX_STRIPS]; /* characters the Strip may still cut */
    uint32_t strip_held[KVF_DETOK_MAX_STRIPS]; /* trailing stripped characters held back */
    uint8_t *scratch;                          /* a token's bytes and their text (scratch_cap) */
    size_t scratch_cap;
    char *out; /* the text handed out by the last call */
    size_t out_len, out_cap;
} kvf_detok_t;

/* Starts a stream; tok must outlive the decoder. */
void kvf_detok_init(kvf_detok_t *detok, const kvf_tokenizer_t *tok);

/* Adds one token. *text_p / *len_p receive the text now complete (maybe
 * none: *len_p = 0; it may hold U+0000, so *len_p is its length); the text
 * is owned by the decoder, NUL-terminated, and valid until the next call
 * on it. */
kvf_status_t kvf_detok_push(kvf_detok_t *detok, uint32_t id, const char **text_p, size_t *len_p);

/* Ends the stream: a pending incomplete character becomes U+FFFD, held
 * characters that end the text are dropped or handed out as decoding the
 * whole sequence would. Same
 * ownership as kvf_detok_push(). The decoder may then start a new stream. */
kvf_status_t kvf_detok_flush(kvf_detok_t *detok, const char **text_p, size_t *len_p);

/* Frees the decoder's buffer (not the struct). */
void kvf_detok_fini(kvf_detok_t *detok);

#endif
