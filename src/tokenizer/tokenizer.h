/* src/tokenizer: the tokenizer module (tokenizer.json loading, BPE encode, streaming decode,
 * and the tokenizer files make-tiny writes). It includes base/ only.
 *
 * m3_tok: Hugging Face `tokenizer.json` BPE tokenizers (Qwen, GPT-OSS, MiniMax, Llama 3...).
 *
 * What is loaded: the BPE model (vocab, merges as "a b" strings or ["a","b"] pairs,
 * ignore_merges, byte_fallback, unk_token, fuse_unk), normalizers (NFC/NFD/NFKC/NFKD,
 * Lowercase, Prepend, Replace, Sequence), pre-tokenizers (Sequence, Split with a PCRE2
 * regex or a literal, every split behaviour and invert, ByteLevel with add_prefix_space and
 * use_regex, Digits, Whitespace, WhitespaceSplit), added tokens with their lstrip / rstrip /
 * single_word / normalized / special flags, and decoders (ByteLevel, ByteFallback, Replace,
 * Fuse, Strip, Metaspace, Sequence). Anything else is refused at load with a message that
 * names the component. `tokenizer_config.json` beside the file supplies bos / eos / pad /
 * unk token names and any added tokens tokenizer.json lacks.
 *
 * Semantics follow the Rust `tokenizers` crate: added tokens are found first (leftmost,
 * longest), the rest is normalized, split by the pre-tokenizers and merged by BPE in merge
 * rank order (ties: leftmost). Encode adds no BOS/EOS (chat templates write them).
 *
 * Ownership and threads: m3_tok is immutable after load; encode / decode / queries may run
 * from any number of threads at once. Returned arrays and strings are malloc'd and owned by
 * the caller. A m3_tok_stream belongs to one thread at a time and must not outlive its
 * tokenizer. */
#ifndef M3_TOKENIZER_H
#define M3_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct m3_tok m3_tok;

/* path: a tokenizer.json file or a checkpoint directory holding one. */
m3_tok *m3_tok_load(const char *path, m3_err *err);
/* From tokenizer.json text (len bytes, no terminator needed); config_json (may be NULL) is
 * the text of tokenizer_config.json. `what` names the source in error messages. */
m3_tok *m3_tok_load_mem(const char *json, size_t len, const char *config_json, size_t config_len,
                        const char *what, m3_err *err);
/* Same as m3_tok_load_mem without a config (the fuzz entry point). */
m3_tok *m3_tok_load_json(const char *json, size_t len, m3_err *err);
void m3_tok_free(m3_tok *t);

/* text must be valid UTF-8 (an error names the first bad byte offset otherwise).
 * allow_special: special added tokens written in the text become their ids; when 0 they
 * are tokenized as plain text (non-special added tokens are always recognised).
 * On success *ids (malloc'd, may be NULL when *n == 0) holds *n ids; returns 0 or -1. */
int m3_tok_encode(const m3_tok *t, const char *text, size_t len, int allow_special,
                  int32_t **ids, size_t *n, m3_err *err);

/* ids -> malloc'd NUL-terminated UTF-8 (invalid byte sequences become U+FFFD, as Hugging
 * Face does); *len (may be NULL) gets its length. skip_special drops special added tokens.
 * An id that no token spells (beyond the tokenizer's vocabulary: checkpoints pad vocab_size)
 * decodes to nothing, as in the Rust tokenizers library; NULL with a message on a negative id
 * or out of memory. The stream decoder below does the same. */
char *m3_tok_decode(const m3_tok *t, const int32_t *ids, size_t n, int skip_special, size_t *len,
                    m3_err *err);

/* Streaming decode: push ids one at a time; each push yields only complete UTF-8 (a
 * multi-byte character split across tokens is held back until it completes; bytes that can
 * never form a character become U+FFFD). The concatenation of all pushes and the final
 * finish equals m3_tok_decode of the whole sequence. */
typedef struct m3_tok_stream m3_tok_stream;
m3_tok_stream *m3_tok_stream_new(const m3_tok *t, int skip_special, m3_err *err);
/* *text / *len: new text (NOT NUL-terminated; valid until the next call on s). */
int m3_tok_stream_push(m3_tok_stream *s, int32_t id, const char **text, size_t *len, m3_err *err);
/* Flushes held-back bytes (as U+FFFD) and resets the stream for a new sequence. */
void m3_tok_stream_finish(m3_tok_stream *s, const char **text, size_t *len);
void m3_tok_stream_free(m3_tok_stream *s);

/* Queries. n_vocab is one past the largest id (model vocab and added tokens together). */
int32_t m3_tok_n_vocab(const m3_tok *t);
/* -1 when absent. Looks at added tokens first, then the model vocabulary (its stored
 * spelling, e.g. "Ġthe" for byte-level models). */
int32_t m3_tok_token_to_id(const m3_tok *t, const char *token);
/* The stored spelling of id (NUL-terminated, owned by t), NULL when id has none. */
const char *m3_tok_id_to_token(const m3_tok *t, int32_t id);
int m3_tok_is_special(const m3_tok *t, int32_t id); /* 1 for a special added token */
/* The bytes id decodes to on its own (before the decoders' start / end stripping; a byte-level
 * token may hold part of a UTF-8 character), *len of them; NULL when no token spells id. */
const char *m3_tok_id_bytes(const m3_tok *t, int32_t id, size_t *len);
/* From tokenizer_config.json (bos_token, eos_token, pad_token, unk_token); -1 if unset. */
int32_t m3_tok_bos_id(const m3_tok *t);
int32_t m3_tok_eos_id(const m3_tok *t);
int32_t m3_tok_pad_id(const m3_tok *t);
int32_t m3_tok_unk_id(const m3_tok *t);

/* The tokenizer files of a MiniMax-M3 checkpoint made from another model's tokenizer.json
 * (m3 make-tiny --tokenizer; tok_write.c): that file with the chat tokens it lacks
 * (]~!b[ ]~b] [e~[ <mm:think> </mm:think> ]<]minimax[>[) appended as added tokens after its
 * largest id, and a tokenizer_config.json naming ]~!b[ as BOS and [e~[ as EOS. Turn markers
 * and [e~[ are special; the think tags and the tool-call namespace are not, so decoded text
 * keeps them for the parsers. Texts are malloc'd; m3_tok_files_free frees them. */
typedef struct m3_tok_files {
    char *tokenizer_json;        /* compact JSON */
    char *tokenizer_config_json; /* indented by 2 */
    int64_t max_id;              /* the largest id, added tokens included */
    int64_t bos_id, eos_id;      /* ]~!b[ and [e~[ */
} m3_tok_files;
int m3_tok_files_make(const char *path, m3_tok_files *out, m3_err *err);
void m3_tok_files_free(m3_tok_files *f);

#endif
