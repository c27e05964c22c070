/* UTF-8 helpers shared by the tokenizer, streaming and stop strings.
 *
 * Invalid input follows the Unicode "maximal subpart" practice (the one
 * Hugging Face's lossy decoding and most browsers use): each maximal
 * prefix of a valid sequence that cannot be completed counts as one error,
 * replaced by one U+FFFD. */
#ifndef KVF_UTF8_H
#define KVF_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Classifies the bytes at s[0..n), n >= 1:
 *   > 0: a complete, valid character of that many bytes; *cp_p is set;
 *     0: a valid but incomplete prefix that spans all n bytes;
 *   < 0: invalid; -k is the length of the maximal invalid subpart (k >= 1).
 * cp_p may be NULL. */
int kvf_utf8_next(const uint8_t *s, size_t n, uint32_t *cp_p);

/* Writes the UTF-8 encoding of cp (< 0x110000, not a surrogate) into out
 * and returns its length (1..4); 0 for an invalid code point. */
size_t kvf_utf8_encode(uint32_t cp, uint8_t out[4]);

/* Length of the longest prefix of s[0..n) made of complete, valid
 * characters. */
size_t kvf_utf8_valid_prefix(const uint8_t *s, size_t n);

#endif
