/* Private to the tokenizer (kvf/tokenizer.h): the loaded tokenizer's
 * layout, shared by the files that build it and the ones that use it.
 *
 *   tokenizer_load.c   tokenizer.json and tokenizer_config.json: the model
 *                      section, the post-processor, BOS/EOS; destroy
 *   tokenizer_scan.c   model.vocab and model.merges read from the text
 *                      without a JSON tree, the rest handed to cJSON
 *   tokenizer_vocab.c  the vocabulary, added tokens and merges, their maps,
 *                      and the id/text queries of kvf/tokenizer.h
 *   tokenizer_norm.c   normalizers (NFC/NFD/NFKC/NFKD through utf8proc,
 *                      Prepend, Replace, Sequence): loading and applying
 *   tokenizer_pre.c    pre-tokenizers (ByteLevel, Split, Metaspace, Digits,
 *                      Sequence): loading and splitting text into pieces
 *   tokenizer_encode.c kvf_tokenizer_encode: added tokens, normalization,
 *                      pre-tokenization, the post-processor's template
 *   bpe.c              the BPE model on one piece (merges, byte fallback,
 *                      unknown tokens)
 *   tokenizer_decoder.c the decoder section: its steps and each id's piece
 *   detok.c            decoding, whole and incremental (kvf_detok_*)
 *
 * Every id owns a string in one arena (the tokenizer.json spelling) and the
 * bytes it decodes to; the vocabulary is a map from spelling to id, the
 * merges a map from an id pair to (rank, merged id), both flat tables
 * sized once at load (kvf_tok_index_t). A loaded tokenizer is never
 * written again, so lookups from any number of threads are safe. */
#ifndef KVF_TOKENIZER_INTERNAL_H
#define KVF_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "kvf/tokenizer.h"

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVF_TOK_MAX_IDS        (1u << 24) /* ids above this are rejected as malformed */
#define KVF_TOK_NO_ID          UINT32_MAX
#define KVF_TOK_BYTE_LEVEL_CPS 0x144 /* code points used by the byte <-> symbol mapping */

/* How a Split keeps its matches (Hugging Face's SplitDelimiterBehavior). */
typedef enum {
    KVF_TOK_SPLIT_ISOLATED,    /* matches and the text between them are pieces */
    KVF_TOK_SPLIT_REMOVED,     /* matches are dropped, the text between them kept */
    KVF_TOK_SPLIT_MERGED_PREV, /* a match joins the piece before it */
    KVF_TOK_SPLIT_MERGED_NEXT, /* a match joins the piece after it */
    KVF_TOK_SPLIT_CONTIGUOUS,  /* consecutive matches are one piece */
} kvf_tok_split_behavior_t;

/* ---- decoding (built by tokenizer_decoder.c, used by detok.c) ----------
 *
 * A decoder chain is read as  before* [ByteFallback] after* [join whole*]:
 * per-token steps, the byte run rule, per-element steps, then a Fuse or
 * ByteLevel that joins everything into one text, and Strip steps on that
 * text. Every id's piece is its token run through the steps that do not
 * depend on its position, computed once at load; what does (the first
 * token under Metaspace, a byte run, the first characters under a Strip of
 * the joined text) is done while decoding. */

typedef enum {
    KVF_TOK_STEP_REPLACE,   /* every match of from (or re) becomes to */
    KVF_TOK_STEP_METASPACE, /* from becomes ' '; the first token loses one leading ' ' */
    KVF_TOK_STEP_STRIP,     /* up to start / stop copies of strip_cp off each end */
} kvf_tok_step_kind_t;

typedef struct {
    kvf_tok_step_kind_t kind;
    char *from, *to; /* owned, NUL-terminated */
    size_t from_len, to_len;
    pcre2_code *re; /* Replace with a Regex pattern (owned), else NULL */
    uint32_t strip_cp;
    uint32_t start, stop;
    bool strip_first; /* Metaspace: prepend_scheme is not "never" */
} kvf_tok_step_t;

/* An id's decoded form: a <0xNN> byte under ByteFallback, else text (bytes
 * for ByteLevel) in the decoder's arena. */
typedef struct {
    uint32_t off, len;
    int16_t byte; /* -1: not a byte token */
} kvf_tok_piece_t;

typedef struct {
    bool space_join;    /* no decoder: tokens are joined by ' ' */
    bool byte_level;    /* pieces are bytes; their concatenation is decoded lossily */
    bool byte_fallback; /* runs of <0xNN> tokens are decoded lossily */
    bool first_differs; /* a Metaspace step: the first id's piece is made when decoding */
    kvf_tok_step_t *before, *after, *whole; /* (n_before, n_after, n_whole) */
    size_t n_before, n_after, n_whole;
    kvf_tok_piece_t *pieces; /* [n_ids] */
    char *arena;
    size_t arena_len, arena_cap;
} kvf_tok_decoder_t;

/* A growing byte string. */
typedef struct {
    char *data;
    size_t len, cap;
} kvf_tok_text_t;

typedef enum {
    KVF_TOK_PRE_SPLIT,      /* Split, Digits */
    KVF_TOK_PRE_BYTE_LEVEL, /* optional prefix space, then the GPT-2 regex (re may be NULL) */
    KVF_TOK_PRE_METASPACE,  /* spaces become the replacement; re splits at it */
} kvf_tok_pre_kind_t;

typedef enum {
    KVF_TOK_PREPEND_ALWAYS,
    KVF_TOK_PREPEND_FIRST, /* only the piece at the start of the text */
    KVF_TOK_PREPEND_NEVER,
} kvf_tok_prepend_t;

/* One pre-tokenizer step, applied to every piece of the step before. */
typedef struct {
    kvf_tok_pre_kind_t kind;
    pcre2_code *re; /* what splits (NULL: the piece stays whole) */
    kvf_tok_split_behavior_t behavior;
    bool invert;               /* Split: the text between matches is what the behavior applies to */
    bool add_prefix_space;     /* ByteLevel */
    kvf_tok_prepend_t prepend; /* Metaspace */
    uint8_t replacement[8];    /* Metaspace: UTF-8 of the replacement character */
    uint8_t replacement_len;
} kvf_tok_pre_t;

#define KVF_TOK_MAX_PRE 16 /* pre-tokenizer steps, Sequences flattened */

typedef enum {
    KVF_TOK_NORM_NFC,
    KVF_TOK_NORM_NFD,
    KVF_TOK_NORM_NFKC,
    KVF_TOK_NORM_NFKD,
    KVF_TOK_NORM_PREPEND, /* content before non-empty text */
    KVF_TOK_NORM_REPLACE, /* every match of re (or of the literal pattern) becomes content */
} kvf_tok_norm_kind_t;

/* One normalizer step (Sequences flattened); strings are malloc'd, owned
 * by the tokenizer. */
typedef struct {
    kvf_tok_norm_kind_t kind;
    pcre2_code *re; /* Replace */
    char *content;  /* Prepend, Replace */
    size_t content_len;
} kvf_tok_norm_t;

#define KVF_TOK_MAX_NORM 16

typedef struct {
    uint32_t id;
    uint32_t len;
    uint32_t content_off; /* raw text (not ByteLevel) in the arena */
    const char *content;  /* the same, once the arena is complete */
    bool lstrip, rstrip;
    bool single_word, special;
    bool normalized;   /* matched in the normalized text, as match */
    const char *match; /* what is matched: content, or its normalized form */
    uint32_t match_len;
} kvf_tok_added_t;

typedef struct {
    uint32_t text_off, text_len;   /* spelling in tokenizer.json */
    uint32_t bytes_off, bytes_len; /* bytes it decodes to */
    bool present;
} kvf_tok_entry_t;

/* A merge: the pair (left, right) of ids becomes merged, at rank. */
typedef struct {
    uint64_t pair; /* left << 32 | right: the key */
    uint32_t rank;
    uint32_t merged;
} kvf_tok_merge_t;

/* A map sized once at load: open addressing with linear probing over
 * 2^k slots (at most half full), each an index + 1 into the table it maps
 * to (0: empty). */
typedef struct {
    uint32_t *slots;
    uint32_t mask;
} kvf_tok_index_t;

struct kvf_tokenizer {
    char *arena; /* spellings and bytes of every token */
    size_t arena_len, arena_cap;
    kvf_tok_entry_t *tokens; /* [n_ids] */
    uint32_t n_ids;
    kvf_tok_index_t vocab; /* spelling -> id (model.vocab entries only) */

    kvf_tok_merge_t *merge_nodes; /* [n_merges] */
    size_t n_merges;
    kvf_tok_index_t merges; /* pair -> index into merge_nodes */

    uint32_t byte_id[256];         /* ByteLevel symbol id of each byte, KVF_TOK_NO_ID if absent */
    uint8_t byte_spelling[256][3]; /* UTF-8 of each byte's symbol */
    uint8_t byte_spelling_len[256];
    int16_t cp_to_byte[KVF_TOK_BYTE_LEVEL_CPS]; /* -1: not a byte symbol */
    uint8_t byte_value[256];                    /* b at [b]: a byte token's decoded byte */

    bool ignore_merges;

    kvf_tok_added_t *added;
    size_t n_added;
    bool added_first_byte[256]; /* of the added tokens matched in the raw text */

    int64_t bos_id, eos_id;
    bool adds_bos;

    /* ---- decoding: tokenizer_decoder.c, detok.c ---- */
    kvf_tok_decoder_t dec;
    /* ---- end of decoding ---- */
    /* ---- the encode pipeline (tokenizer_norm.c, tokenizer_pre.c,
     * tokenizer_encode.c, bpe.c) ---- */
    kvf_tok_norm_t norms[KVF_TOK_MAX_NORM];
    size_t n_norms;
    kvf_tok_pre_t pres[KVF_TOK_MAX_PRE];
    size_t n_pres;
    bool byte_level;           /* a ByteLevel pre-tokenizer: BPE starts from byte symbols */
    bool byte_fallback;        /* a character missing from the vocabulary becomes <0xNN> tokens */
    bool fuse_unk;             /* consecutive unknown tokens are one */
    uint32_t unk_id;           /* KVF_TOK_NO_ID: an unknown character is dropped */
    uint32_t fallback_id[256]; /* <0xNN>, KVF_TOK_NO_ID if absent */
    bool added_norm_first_byte[256]; /* of the added tokens matched in normalized text */
    char *added_norm_text;           /* the normalized contents of those tokens, one buffer */
    uint32_t *tmpl_ids; /* the post-processor's special tokens: before $A, then after */
    size_t n_tmpl_before, n_tmpl_after;
};

/* ---- tokenizer_scan.c ---- */

/* A model.vocab entry: its spelling (decoded, in the file's text) and id. */
typedef struct {
    const char *text;
    uint32_t len;
    uint32_t id;
} kvf_tok_vocab_item_t;

/* A model.merges entry: its two sides (decoded, in the file's text). */
typedef struct {
    const char *left, *right;
    uint32_t left_len, right_len;
} kvf_tok_merge_item_t;

typedef struct {
    kvf_tok_vocab_item_t *vocab; /* [n_vocab], in file order */
    size_t n_vocab;
    bool has_vocab;               /* model.vocab was an object, read here */
    kvf_tok_merge_item_t *merges; /* [n_merges], in rank order */
    size_t n_merges;
    bool has_merges; /* model.merges was an array, read here */
    char *rest;      /* the document with those two values as {} and [] */
    size_t rest_len;
} kvf_tok_scan_t;

/* Reads root.model.vocab (when an object) and root.model.merges (when an
 * array) out of the tokenizer.json text[0..len), decoding their strings in
 * place: the items point into text, which must outlive them. The rest of
 * the document is copied into scan->rest for cJSON. A malformed document
 * is KVF_ERR_FORMAT, logged naming path and the byte offset. */
kvf_status_t kvf_tokenizer__scan(char *text, size_t len, const char *path, kvf_tok_scan_t *scan);

void kvf_tokenizer__scan_free(kvf_tok_scan_t *scan);

/* ---- tokenizer_vocab.c ---- */

/* GPT-2's byte <-> symbol mapping into tok (the first step of a load). */
void kvf_tokenizer__byte_mapping(kvf_tokenizer_t *tok);

/* Reads model.vocab and model.merges (from scan), added_tokens (NULL:
 * none) into tok and builds the maps; errors are logged naming path. */
kvf_status_t kvf_tokenizer__load_vocab(kvf_tokenizer_t *tok, const char *path,
                                       const kvf_tok_scan_t *scan, const cJSON *added);

/* Frees what kvf_tokenizer__load_vocab() built (not tok itself). */
void kvf_tokenizer__free_vocab(kvf_tokenizer_t *tok);

/* The model.vocab id spelled text[0..len), or KVF_TOK_NO_ID. */
uint32_t kvf_tokenizer__vocab_find(const kvf_tokenizer_t *tok, const char *text, size_t len);

/* The merge of the pair (left, right), or NULL. */
const kvf_tok_merge_t *kvf_tokenizer__merge_find(const kvf_tokenizer_t *tok, uint32_t left,
                                                 uint32_t right);

/* Reads an id: a JSON integer in [0, KVF_TOK_MAX_IDS). */
bool kvf_tokenizer__json_id(const cJSON *item, uint32_t *id_p);

/* ---- tokenizer_decoder.c ---- */

/* Reads the decoder section (NULL or JSON null: none) and builds every
 * id's piece; called once the vocabulary is loaded. A decoder type or an
 * order of steps it does not implement is KVF_ERR_UNSUPPORTED, logged
 * naming path and the type. */
kvf_status_t kvf_tokenizer__load_decoder(kvf_tokenizer_t *tok, const char *path,
                                         const cJSON *decoder);

/* Frees what kvf_tokenizer__load_decoder() built. */
void kvf_tokenizer__free_decoder(kvf_tokenizer_t *tok);

/* The piece of id made as the first token of a stream (first) or as any
 * other: *byte_p is its <0xNN> byte, or -1 and text receives it (text is
 * emptied first). */
kvf_status_t kvf_tokenizer__make_piece(const kvf_tokenizer_t *tok, uint32_t id, bool first,
                                       kvf_tok_text_t *text, int *byte_p);

/* Runs text through steps[0..n), in place; first: it is the first token. */
kvf_status_t kvf_tokenizer__apply_steps(const kvf_tok_step_t *steps, size_t n, bool first,
                                        kvf_tok_text_t *text);

/* Appends s[0..n) to text (kept NUL-terminated). */
kvf_status_t kvf_tokenizer__text_append(kvf_tok_text_t *text, const void *s, size_t n);
/* The "type" string of a JSON object, "" when there is none. */
const char *kvf_tokenizer__json_type(const cJSON *obj);

/* Compiles a pattern (PCRE2 with UTF and Unicode properties; literal:
 * matched as is); errors are logged naming path and what. */
kvf_status_t kvf_tokenizer__compile(const char *path, const char *what, const char *pattern,
                                    size_t len, bool literal, pcre2_code **re_p);

/* ---- tokenizer_norm.c ---- */

/* Reads the normalizer (NULL or JSON null: none) into tok->norms. */
kvf_status_t kvf_tokenizer__load_normalizer(kvf_tokenizer_t *tok, const char *path,
                                            const cJSON *norm);

/* Applies tok's normalizers to s[0..len) (valid UTF-8). *out_p is a
 * malloc'd buffer the caller owns (reused: *cap_p is its size); the
 * result is (*out_p)[0..*out_len_p). */
kvf_status_t kvf_tokenizer__normalize(const kvf_tokenizer_t *tok, const uint8_t *s, size_t len,
                                      uint8_t **out_p, size_t *cap_p, size_t *out_len_p);

/* Frees the normalizers' patterns and strings. */
void kvf_tokenizer__free_normalizer(kvf_tokenizer_t *tok);

/* ---- tokenizer_pre.c ---- */

/* Reads the pre-tokenizer (NULL or JSON null: none) into tok->pres and
 * sets tok->byte_level. */
kvf_status_t kvf_tokenizer__load_pre_tokenizer(kvf_tokenizer_t *tok, const char *path,
                                               const cJSON *pre);

void kvf_tokenizer__free_pre_tokenizer(kvf_tokenizer_t *tok);

/* Receives each piece the pre-tokenizer makes. */
typedef kvf_status_t (*kvf_tok_piece_fn)(void *ctx, const uint8_t *piece, size_t len);

/* Scratch space of pre-tokenization, owned by one encode call. */
typedef struct {
    uint8_t *buf; /* a piece rewritten by the step (Metaspace, the prefix space) */
    size_t buf_cap;
    size_t *cuts; /* start, end of each piece the step made */
    size_t cuts_cap;
    size_t *spans; /* start, end, is_match of each span of the pattern */
    size_t spans_cap;
} kvf_tok_pre_level_t;

typedef struct {
    kvf_tok_pre_level_t level[KVF_TOK_MAX_PRE];
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
} kvf_tok_pre_run_t;

/* Splits s[0..len) (valid UTF-8) into pieces and hands each to fn, in
 * order. at_start: s begins the text (Metaspace's prepend_scheme first). */
kvf_status_t kvf_tokenizer__pre_tokenize(const kvf_tokenizer_t *tok, kvf_tok_pre_run_t *run,
                                         const uint8_t *s, size_t len, bool at_start,
                                         kvf_tok_piece_fn fn, void *ctx);

/* Frees the scratch space (not the struct). */
void kvf_tokenizer__pre_run_fini(kvf_tok_pre_run_t *run);

/* ---- bpe.c ---- */

/* Scratch space and output of the BPE model, owned by one encode call. */
typedef struct {
    const kvf_tokenizer_t *tok;
    uint32_t *ids; /* output */
    size_t n_ids, ids_cap;
    uint32_t *sym;     /* BPE symbols of the current piece */
    uint32_t *sym_off; /* where each initial symbol starts in the piece */
    int32_t *prev, *next;
    uint64_t *heap; /* rank << 32 | left symbol index */
    size_t sym_cap; /* of sym, sym_off, prev and next; the heap holds 2 * sym_cap */
    char *spelled;  /* the piece in ByteLevel spelling (ignore_merges) */
    size_t spelled_cap;
    bool last_unk; /* the last id the model gave was unk (fuse_unk) */
} kvf_tok_bpe_t;

/* Appends one id to the output. */
kvf_status_t kvf_tokenizer__emit(kvf_tok_bpe_t *bpe, uint32_t id);

/* BPE over one piece of raw bytes (any bytes), ids appended to bpe->ids. */
kvf_status_t kvf_tokenizer__bpe_piece(kvf_tok_bpe_t *bpe, const uint8_t *piece, size_t len);

void kvf_tokenizer__bpe_fini(kvf_tok_bpe_t *bpe);

#endif
