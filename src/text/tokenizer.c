/*
 * tokenizer.c — byte-level BPE tokenizers read from local files: GPT-2's
 * (encoder.json + vocab.bpe, or vocab.json + merges.txt) and tiktoken's
 * (base64 token and rank per line; Llama 3's tokenizer.model).
 *
 * Encoding is two steps, as in the Python tokenizers these files come from:
 *   1. the text is split into pieces by the model's pre-tokenizer pattern,
 *      matched here by hand (pretokenize below) with the Unicode classes of
 *      unicode_classes.c. GPT-2 (transformers' GPT2Tokenizer, Python regex):
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      Llama 3 (llms_from_scratch's Llama3Tokenizer, tiktoken's Rust regex):
 *        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 *        | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *      Invalid UTF-8 bytes are each a character of their own in none of the
 *      classes, so every byte of the text lands in some piece.
 *   2. each piece's bytes are merged, lowest rank first (the leftmost of
 *      equal ranks), with a heap of candidate pairs over a linked list of
 *      symbols: O(n log n) in the piece's length n.
 *        GPT-2:    the rank of a pair of tokens is its line in the merges
 *                  file (GPT2Tokenizer.bpe; a rank's occurrences merge in
 *                  one pass, left to right, before any other rank).
 *        tiktoken: a piece that is a token is that token; else the rank of
 *                  a pair is the rank of its concatenated bytes
 *                  (tiktoken's byte_pair_encode).
 *
 * Special tokens (GPT-2's <|endoftext|>; Llama 3's <|begin_of_text|> ...)
 * are never produced by encoding text, which is encoded as plain text, as
 * tiktoken's encode(disallowed_special=()) would: they come only by id, and
 * decode to their names.
 *
 * Reading is strict where a lenient reader would encode differently from
 * the Python ones: every byte needs its token, every merge's two tokens and
 * their concatenation must be in the vocabulary, ids and tokens are given
 * once (GPT2Tokenizer would map a missing token to <|endoftext|>; tiktoken
 * panics on a missing byte). A GPT-2 vocabulary key with a character
 * outside bytes_to_unicode (an added token) decodes to its own UTF-8.
 */
#include "internal.h"
#include "utf8.h"

#include "io/file.h"
#include "io/json.h"
#include "text/unicode_classes.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Token bytes by id, and a hash table from bytes to id                      */
/* ------------------------------------------------------------------------ */

/* Byte strings by id: an arena and each id's span (len 0: no such id). */
typedef struct byte_store {
    unsigned char *data;
    size_t used, cap;
    size_t *start;
    uint32_t *len;
    size_t count; /* ids */
} byte_store;

static void byte_store_free(byte_store *b) {
    attn_free(b->data);
    attn_free(b->start);
    attn_free(b->len);
    memset(b, 0, sizeof(*b));
}

/* Appends n bytes to the arena; *offset receives where they start. */
static bool byte_store_append(byte_store *b, const void *bytes, size_t n, size_t *offset) {
    if (n > b->cap - b->used) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->used < n) {
            if (cap > (size_t)-1 / 2) return false;
            cap *= 2;
        }
        unsigned char *grown = attn_realloc(b->data, cap);
        if (!grown) return false;
        b->data = grown;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->used, bytes, n);
    *offset = b->used;
    b->used += n;
    return true;
}

static bool byte_store_ids(byte_store *b, size_t count) {
    b->start = attn_calloc(count, sizeof(*b->start));
    b->len = attn_calloc(count, sizeof(*b->len));
    b->count = count;
    return b->start && b->len;
}

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* Open addressing over ids, their bytes in a byte_store (-1: empty). */
typedef struct id_table {
    int32_t *slot;
    size_t mask;
} id_table;

static bool id_table_init(id_table *t, size_t entries) {
    size_t cap = 16;
    while (cap < entries * 2) cap *= 2;
    t->slot = attn_malloc(cap * sizeof(*t->slot));
    if (!t->slot) return false;
    for (size_t i = 0; i < cap; i++) t->slot[i] = -1;
    t->mask = cap - 1;
    return true;
}

static int32_t id_table_find(const id_table *t, const byte_store *b, const unsigned char *key,
                             size_t n) {
    for (size_t i = hash_bytes(key, n) & t->mask;; i = (i + 1) & t->mask) {
        int32_t id = t->slot[i];
        if (id < 0) return -1;
        if (b->len[id] == n && memcmp(b->data + b->start[id], key, n) == 0) return id;
    }
}

/* Inserts id; returns the id that already has its bytes, or -1. */
static int32_t id_table_insert(id_table *t, const byte_store *b, int32_t id) {
    const unsigned char *key = b->data + b->start[id];
    size_t n = b->len[id];
    size_t i = hash_bytes(key, n) & t->mask;
    for (; t->slot[i] >= 0; i = (i + 1) & t->mask) {
        int32_t other = t->slot[i];
        if (b->len[other] == n && memcmp(b->data + b->start[other], key, n) == 0) return other;
    }
    t->slot[i] = id;
    return -1;
}

/* GPT-2's merges: (left id, right id) -> rank and the merged token. */
typedef struct pair_table {
    uint64_t *key; /* UINT64_MAX: empty */
    uint32_t *rank;
    int32_t *merged;
    size_t mask;
} pair_table;

static uint64_t pair_key(int32_t left, int32_t right) {
    return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
}

static size_t pair_slot(const pair_table *t, uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 31)) & t->mask;
}

static bool pair_table_init(pair_table *t, size_t entries) {
    size_t cap = 16;
    while (cap < entries * 2) cap *= 2;
    t->key = attn_malloc(cap * sizeof(*t->key));
    t->rank = attn_malloc(cap * sizeof(*t->rank));
    t->merged = attn_malloc(cap * sizeof(*t->merged));
    if (!t->key || !t->rank || !t->merged) return false;
    for (size_t i = 0; i < cap; i++) t->key[i] = UINT64_MAX;
    t->mask = cap - 1;
    return true;
}

static void pair_table_free(pair_table *t) {
    attn_free(t->key);
    attn_free(t->rank);
    attn_free(t->merged);
    memset(t, 0, sizeof(*t));
}

/* Sets the pair's rank and token; a pair seen before takes the later rank
 * (GPT2Tokenizer builds a dict from the merges, so the last line wins). */
static void pair_table_put(pair_table *t, int32_t left, int32_t right, uint32_t rank,
                           int32_t merged) {
    uint64_t key = pair_key(left, right);
    size_t i = pair_slot(t, key);
    while (t->key[i] != UINT64_MAX && t->key[i] != key) i = (i + 1) & t->mask;
    t->key[i] = key;
    t->rank[i] = rank;
    t->merged[i] = merged;
}

static bool pair_table_find(const pair_table *t, int32_t left, int32_t right, uint32_t *rank,
                            int32_t *merged) {
    uint64_t key = pair_key(left, right);
    for (size_t i = pair_slot(t, key); t->key[i] != UINT64_MAX; i = (i + 1) & t->mask) {
        if (t->key[i] == key) {
            *rank = t->rank[i];
            *merged = t->merged[i];
            return true;
        }
    }
    return false;
}

/* ------------------------------------------------------------------------ */
/* The tokenizer                                                             */
/* ------------------------------------------------------------------------ */

typedef enum tokenizer_kind { TOKENIZER_GPT2 = 1, TOKENIZER_TIKTOKEN = 2 } tokenizer_kind;

/* Llama 3's special tokens, at these offsets from the first id after the
 * ranks (128000 in Meta's file): llms_from_scratch's Llama3Tokenizer; the
 * other offsets below 256 are <|reserved_{offset - 2}|>. */
#define LLAMA3_SPECIALS 256
static const struct {
    unsigned offset;
    const char *name;
} llama3_named_specials[] = {
    {0, "<|begin_of_text|>"}, {1, "<|end_of_text|>"}, {6, "<|start_header_id|>"},
    {7, "<|end_header_id|>"}, {9, "<|eot_id|>"},
};

struct attn_tokenizer {
    attn_ctx *ctx;
    tokenizer_kind kind;
    size_t vocab_size;
    byte_store tokens; /* id -> its bytes (a special token: its name) */
    id_table by_bytes; /* tiktoken: bytes -> rank (special tokens left out) */
    pair_table merges; /* GPT-2 */
    int32_t byte_token[256];
};

/* ------------------------------------------------------------------------ */
/* UTF-8 and the pre-tokenizers                                              */
/* ------------------------------------------------------------------------ */

#define NOT_A_CHAR 0xFFFFFFFFu

typedef struct text_char {
    uint32_t cp; /* NOT_A_CHAR for an invalid byte */
    size_t len;  /* bytes */
    attn_unicode_class cls;
} text_char;

static attn_unicode_class ascii_class(unsigned char b) {
    if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')) return ATTN_UNICODE_LETTER;
    if (b >= '0' && b <= '9') return ATTN_UNICODE_NUMBER;
    if (b == ' ' || (b >= '\t' && b <= '\r')) return ATTN_UNICODE_SPACE;
    return ATTN_UNICODE_OTHER;
}

/* The character at s[i], i < n: an invalid byte is a character of its own. */
static text_char char_at(const unsigned char *s, size_t n, size_t i) {
    text_char c;
    if (s[i] < 0x80) {
        c.cp = s[i];
        c.len = 1;
        c.cls = ascii_class(s[i]);
        return c;
    }
    c.len = attn_utf8_decode(s + i, n - i, &c.cp);
    if (c.len == 0) {
        c.cp = NOT_A_CHAR;
        c.len = 1;
        c.cls = ATTN_UNICODE_OTHER;
    } else {
        c.cls = attn_unicode_class_of(c.cp);
    }
    return c;
}

/* The end of the run of cls characters that starts at i. */
static size_t run_end(const unsigned char *s, size_t n, size_t i, attn_unicode_class cls) {
    while (i < n) {
        text_char c = char_at(s, n, i);
        if (c.cls != cls) break;
        i += c.len;
    }
    return i;
}

/* Whether s[i..] starts with the letter lower, also in upper case and, for
 * 's', as U+017F (long s) when fold: (?i) in Rust's regex folds cases by
 * Unicode's simple case folding. *len receives the bytes. */
static bool letter_at(const unsigned char *s, size_t n, size_t i, char lower, bool fold,
                      size_t *len) {
    if (i >= n) return false;
    *len = 1;
    if (s[i] == (unsigned char)lower) return true;
    if (!fold) return false;
    if (s[i] == (unsigned char)(lower - 'a' + 'A')) return true;
    *len = 2;
    return lower == 's' && i + 1 < n && s[i] == 0xC5 && s[i + 1] == 0xBF;
}

/* 's|'t|'re|'ve|'m|'ll|'d at i (case-folded when fold): its end, or 0. */
static size_t contraction_end(const unsigned char *s, size_t n, size_t i, bool fold) {
    if (s[i] != '\'') return 0;
    size_t a, b;
    static const char single[] = "stmd";
    for (const char *c = single; *c; c++)
        if (letter_at(s, n, i + 1, *c, fold, &a)) return i + 1 + a;
    static const char *const pairs[] = {"re", "ve", "ll"};
    for (size_t k = 0; k < 3; k++) {
        if (letter_at(s, n, i + 1, pairs[k][0], fold, &a) &&
            letter_at(s, n, i + 1 + a, pairs[k][1], fold, &b))
            return i + 1 + a + b;
    }
    return 0;
}

/* The whitespace alternatives at i (a \s character): \s+(?!\S) gives the
 * run but its last character when a non-space follows (and the run has
 * two or more), else \s+ the whole run. With newline (Llama 3's \s*[\r\n]+
 * before them), a run holding \r or \n ends after its last one. */
static size_t space_end(const unsigned char *s, size_t n, size_t i, bool newline) {
    size_t end = i, last = i, after_newline = 0;
    while (end < n) {
        text_char c = char_at(s, n, end);
        if (c.cls != ATTN_UNICODE_SPACE) break;
        last = end;
        end += c.len;
        if (c.cp == '\r' || c.cp == '\n') after_newline = end;
    }
    if (newline && after_newline) return after_newline;
    if (end == n || last == i) return end;
    return last;
}

/* The end of GPT-2's piece that starts at i (i < n; always > i). */
static size_t gpt2_piece_end(const unsigned char *s, size_t n, size_t i) {
    size_t end = contraction_end(s, n, i, false);
    if (end) return end;
    /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': a space may lead */
    size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
    text_char c = char_at(s, n, j);
    if (c.cls != ATTN_UNICODE_SPACE) return run_end(s, n, j + c.len, c.cls);
    return space_end(s, n, i, false);
}

/* The end of Llama 3's piece that starts at i (i < n; always > i). */
static size_t llama3_piece_end(const unsigned char *s, size_t n, size_t i) {
    size_t end = contraction_end(s, n, i, true);
    if (end) return end;
    text_char c0 = char_at(s, n, i);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c0.cls == ATTN_UNICODE_LETTER) return run_end(s, n, i + c0.len, ATTN_UNICODE_LETTER);
    if (c0.cls != ATTN_UNICODE_NUMBER && c0.cp != '\r' && c0.cp != '\n' && i + c0.len < n &&
        char_at(s, n, i + c0.len).cls == ATTN_UNICODE_LETTER)
        return run_end(s, n, i + c0.len, ATTN_UNICODE_LETTER);
    /* \p{N}{1,3} */
    if (c0.cls == ATTN_UNICODE_NUMBER) {
        end = i + c0.len;
        for (int k = 1; k < 3 && end < n; k++) {
            text_char c = char_at(s, n, end);
            if (c.cls != ATTN_UNICODE_NUMBER) break;
            end += c.len;
        }
        return end;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t j = (c0.cp == ' ' && i + 1 < n) ? i + 1 : i;
    text_char c = j == i ? c0 : char_at(s, n, j);
    if (c.cls == ATTN_UNICODE_OTHER) {
        end = run_end(s, n, j + c.len, ATTN_UNICODE_OTHER);
        while (end < n && (s[end] == '\r' || s[end] == '\n')) end++;
        return end;
    }
    return space_end(s, n, i, true);
}

/* ------------------------------------------------------------------------ */
/* Merging a piece                                                           */
/* ------------------------------------------------------------------------ */

/* A symbol of a piece: bytes [start, end); start is also its index, since
 * a merge keeps the left symbol and grows it over the right one. */
typedef struct bpe_symbol {
    size_t end;
    size_t prev, next; /* NO_SYMBOL at the ends */
    int32_t id;        /* -1 once merged into its left neighbour */
} bpe_symbol;
#define NO_SYMBOL ((size_t)-1)

/* A candidate merge of left with the symbol after it, which ended at
 * right_end when the candidate was made (stale once that changed). */
typedef struct bpe_candidate {
    uint32_t rank;
    int32_t merged;
    size_t left, right_end;
} bpe_candidate;

/* Scratch an encode call keeps from piece to piece. */
typedef struct bpe_work {
    bpe_symbol *sym;
    bpe_candidate *heap, *pending;
    size_t capacity; /* symbols; the heap holds 3x, pending 2x */
    size_t heap_len, pending_len;
} bpe_work;

static void bpe_work_free(bpe_work *w) {
    attn_free(w->sym);
    attn_free(w->heap);
    attn_free(w->pending);
    memset(w, 0, sizeof(*w));
}

static bool bpe_work_reserve(bpe_work *w, size_t n) {
    if (n <= w->capacity) return true;
    size_t cap = w->capacity ? w->capacity : 64;
    while (cap < n) cap *= 2;
    bpe_symbol *sym = attn_calloc(cap, sizeof(*sym));
    bpe_candidate *heap = attn_calloc(cap, 3 * sizeof(*heap));
    bpe_candidate *pending = attn_calloc(cap, 2 * sizeof(*pending));
    if (!sym || !heap || !pending) {
        attn_free(sym);
        attn_free(heap);
        attn_free(pending);
        return false;
    }
    bpe_work_free(w);
    w->sym = sym;
    w->heap = heap;
    w->pending = pending;
    w->capacity = cap;
    return true;
}

static bool candidate_before(const bpe_candidate *a, const bpe_candidate *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(bpe_work *w, bpe_candidate c) {
    size_t i = w->heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!candidate_before(&c, &w->heap[parent])) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = c;
}

static bpe_candidate heap_pop(bpe_work *w) {
    bpe_candidate top = w->heap[0], last = w->heap[--w->heap_len];
    size_t i = 0, n = w->heap_len;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && candidate_before(&w->heap[child + 1], &w->heap[child])) child++;
        if (!candidate_before(&w->heap[child], &last)) break;
        w->heap[i] = w->heap[child];
        i = child;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* The merge of symbol left with its next, if the model has one. */
static bool pair_candidate(const attn_tokenizer *t, const unsigned char *piece, const bpe_work *w,
                           size_t left, bpe_candidate *out) {
    if (left == NO_SYMBOL || w->sym[left].next == NO_SYMBOL) return false;
    size_t right = w->sym[left].next;
    out->left = left;
    out->right_end = w->sym[right].end;
    if (t->kind == TOKENIZER_GPT2)
        return pair_table_find(&t->merges, w->sym[left].id, w->sym[right].id, &out->rank,
                               &out->merged);
    int32_t id = id_table_find(&t->by_bytes, &t->tokens, piece + left, out->right_end - left);
    out->rank = (uint32_t)id;
    out->merged = id;
    return id >= 0;
}

static bool candidate_valid(const bpe_work *w, const bpe_candidate *c) {
    const bpe_symbol *left = &w->sym[c->left];
    return left->id >= 0 && left->next != NO_SYMBOL && w->sym[left->next].end == c->right_end;
}

/* Merges c (valid) and adds its new neighbours' candidates to the heap, or
 * to pending when defer (GPT-2 finishes a rank before the next). */
static void apply_merge(const attn_tokenizer *t, const unsigned char *piece, bpe_work *w,
                        const bpe_candidate *c, bool defer) {
    bpe_symbol *left = &w->sym[c->left];
    size_t right = left->next;
    left->end = w->sym[right].end;
    left->id = c->merged;
    left->next = w->sym[right].next;
    if (left->next != NO_SYMBOL) w->sym[left->next].prev = c->left;
    w->sym[right].id = -1;
    bpe_candidate around[2];
    size_t found = 0;
    if (pair_candidate(t, piece, w, left->prev, &around[found])) found++;
    if (pair_candidate(t, piece, w, c->left, &around[found])) found++;
    for (size_t k = 0; k < found; k++) {
        if (defer) w->pending[w->pending_len++] = around[k];
        else heap_push(w, around[k]);
    }
}

/* The tokens of one piece (n > 0 bytes) through emit. */
typedef struct token_sink {
    int32_t *ids;
    size_t capacity, count;
} token_sink;

static void sink_put(token_sink *k, int32_t id) {
    if (k->count < k->capacity) k->ids[k->count] = id;
    k->count++;
}

static bool encode_piece(const attn_tokenizer *t, const unsigned char *piece, size_t n,
                         bpe_work *w, token_sink *sink) {
    if (t->kind == TOKENIZER_TIKTOKEN) {
        int32_t whole = id_table_find(&t->by_bytes, &t->tokens, piece, n);
        if (whole >= 0) {
            sink_put(sink, whole);
            return true;
        }
    }
    if (n == 1) {
        sink_put(sink, t->byte_token[piece[0]]);
        return true;
    }
    if (!bpe_work_reserve(w, n)) return false;
    for (size_t i = 0; i < n; i++) {
        w->sym[i] = (bpe_symbol){.end = i + 1, .prev = i ? i - 1 : NO_SYMBOL,
                                 .next = i + 1 < n ? i + 1 : NO_SYMBOL,
                                 .id = t->byte_token[piece[i]]};
    }
    w->heap_len = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        bpe_candidate c;
        if (pair_candidate(t, piece, w, i, &c)) heap_push(w, c);
    }
    bool batch = t->kind == TOKENIZER_GPT2;
    while (w->heap_len) {
        bpe_candidate c = heap_pop(w);
        if (!candidate_valid(w, &c)) continue;
        w->pending_len = 0;
        apply_merge(t, piece, w, &c, batch);
        /* GPT-2: every other occurrence of this pair, left to right */
        while (batch && w->heap_len && w->heap[0].rank == c.rank) {
            bpe_candidate same = heap_pop(w);
            if (candidate_valid(w, &same)) apply_merge(t, piece, w, &same, true);
        }
        for (size_t k = 0; k < w->pending_len; k++) heap_push(w, w->pending[k]);
    }
    for (size_t i = 0; i != NO_SYMBOL; i = w->sym[i].next) sink_put(sink, w->sym[i].id);
    return true;
}

/* ------------------------------------------------------------------------ */
/* Reading files                                                             */
/* ------------------------------------------------------------------------ */

/* n bytes of a line for a message, into buf: NUL, control and non-UTF-8
 * bytes escaped (a token may hold any byte), cut to about 60 characters. */
#define QUOTED_CHARS 64
static const char *quoted(char buf[QUOTED_CHARS], const unsigned char *s, size_t n) {
    attn_escape_text(buf, QUOTED_CHARS, (const char *)s, n);
    return buf;
}

/* The whole file at path (NUL-terminated, *size without the NUL). */
static attn_status read_file(attn_ctx *ctx, const char *path, unsigned char **out, size_t *size) {
    return attn_file_read_whole(ctx, NULL, path, out, size);
}

/* The 1-based line and column of byte offset pos in s. */
static void line_and_column(const unsigned char *s, size_t pos, size_t *line, size_t *column) {
    *line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < pos; i++) {
        if (s[i] == '\n') {
            (*line)++;
            line_start = i + 1;
        }
    }
    *column = pos - line_start + 1;
}

/* ------------------------------------------------------------------------ */
/* GPT-2: encoder.json / vocab.json and vocab.bpe / merges.txt               */
/* ------------------------------------------------------------------------ */

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the 68
 * others (0-32, 127-160, 173) for U+0100 + their index among them. */
static uint32_t byte_to_unicode(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256 + b;
    if (b <= 160) return 256 + 33 + (b - 127);
    return 256 + 67; /* 173 */
}

/* The byte cp stands for, or -1. */
static int unicode_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp > 256 + 67) return -1;
    uint32_t k = cp - 256;
    if (k <= 32) return (int)k;
    if (k <= 66) return (int)(127 + k - 33);
    return 173;
}

/* One vocabulary entry as read: its key's bytes in the arena, its id and
 * where it was (a byte offset or a line) for messages. */
typedef struct raw_entry {
    size_t offset, where;
    uint32_t len;
    int32_t id;
} raw_entry;

typedef struct raw_entries {
    raw_entry *at;
    size_t count, cap;
} raw_entries;

static bool raw_entries_push(raw_entries *e, raw_entry entry) {
    if (e->count == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 1024;
        raw_entry *grown = attn_realloc(e->at, cap * sizeof(*grown));
        if (!grown) return false;
        e->at = grown;
        e->cap = cap;
    }
    e->at[e->count++] = entry;
    return true;
}

/* What a vocabulary is, for messages about one that is not. */
#define VOCAB_SHAPE "(a vocabulary is a JSON object of \"token\": id)"

/* The JSON object's entries: keys (UTF-8) in strings, where = the key's
 * byte offset. Read token by token with the library's JSON reader, with
 * positions as line:column, raw UTF-8 checked and \u0000 allowed (a token's
 * bytes are counted, not a C string). */
static attn_status read_vocab_json(attn_json_reader *c, byte_store *strings, raw_entries *entries) {
    attn_status st = attn_json_expect(c, '{', "'{' " VOCAB_SHAPE);
    if (st) return st;
    if (attn_json_peek(c, '}'))
        return attn_json_fail_at(c, (size_t)(c->p - c->begin), ATTN_ERR_FORMAT,
                                 "an empty vocabulary " VOCAB_SHAPE);
    for (;;) {
        attn_json_skip_space(c);
        raw_entry e = {.where = (size_t)(c->p - c->begin)};
        char *key;
        size_t len = 0;
        if ((st = attn_json_read_string(c, "a token (a string)", &key, &len))) return st;
        bool stored =
            len > 0 && len <= UINT32_MAX && byte_store_append(strings, key, len, &e.offset);
        attn_free(key);
        if (len == 0 || len > UINT32_MAX)
            return attn_json_fail_at(c, e.where, ATTN_ERR_FORMAT, "an empty token " VOCAB_SHAPE);
        if (!stored) return attn_fail(c->ctx, ATTN_ERR_NO_MEMORY, "no memory to read %s", c->label);
        e.len = (uint32_t)len;
        if ((st = attn_json_expect(c, ':', "':'"))) return st;
        /* the ids above leave room for Llama 3's special tokens */
        uint64_t id;
        if ((st = attn_json_read_uint(c, INT32_MAX - LLAMA3_SPECIALS, NULL, "a token id", &id)))
            return st;
        e.id = (int32_t)id;
        if (!raw_entries_push(entries, e))
            return attn_fail(c->ctx, ATTN_ERR_NO_MEMORY, "no memory to read %s", c->label);
        if (attn_json_accept(c, ',')) continue;
        if (attn_json_accept(c, '}')) break;
        return attn_json_expected(c, "',' or '}'");
    }
    return attn_json_end(c, "the vocabulary's closing '}'");
}

/* Lays entries out by id in store (vocab_size = the largest id + 1) and
 * indexes them by their bytes; duplicates are errors naming both. */
static attn_status index_entries(attn_ctx *ctx, const char *path, const unsigned char *file,
                                 bool where_is_line, const raw_entries *entries, byte_store *store,
                                 id_table *table) {
    int32_t max_id = -1;
    for (size_t i = 0; i < entries->count; i++)
        if (entries->at[i].id > max_id) max_id = entries->at[i].id;
    size_t count = (size_t)max_id + 1;
    /* the table is laid out by id: ids far past the entries would make a
     * few bytes of file ask for gigabytes (a fuzzer's find) */
    size_t most = 2 * entries->count + 1024;
    if (count > most)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: token ids reach %d with %zu tokens (ids may reach %zu at most: the "
                         "table is laid out by id)", path, (int)max_id, entries->count, most - 1);
    if (!byte_store_ids(store, count + LLAMA3_SPECIALS) || !id_table_init(table, entries->count))
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "no memory for %s's %zu tokens", path, count);
    store->count = count;
    size_t *first_at = attn_calloc(count, sizeof(*first_at));
    if (!first_at) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "no memory for %s's tokens", path);
    attn_status st = ATTN_OK;
    for (size_t i = 0; i < entries->count && !st; i++) {
        const raw_entry *e = &entries->at[i];
        /* where an entry is, for the messages only: finding the line of a
         * JSON offset scans the file up to it */
        size_t line = e->where, column = 0, other_line, other_column;
        if (store->len[e->id]) {
            if (!where_is_line) line_and_column(file, e->where, &line, &column);
            other_line = first_at[e->id];
            if (!where_is_line) line_and_column(file, first_at[e->id], &other_line, &other_column);
            st = attn_fail(ctx, ATTN_ERR_FORMAT, "%s:%zu: id %d is given twice (first on line %zu)",
                           path, line, (int)e->id, other_line);
            break;
        }
        store->start[e->id] = e->offset;
        store->len[e->id] = e->len;
        first_at[e->id] = e->where;
        int32_t same = id_table_insert(table, store, e->id);
        if (same >= 0) {
            if (!where_is_line) line_and_column(file, e->where, &line, &column);
            other_line = first_at[same];
            if (!where_is_line) line_and_column(file, first_at[same], &other_line, &other_column);
            st = attn_fail(ctx, ATTN_ERR_FORMAT,
                           "%s:%zu: the token of id %d is given twice (first as id %d on line %zu)",
                           path, line, (int)e->id, (int)same, other_line);
        }
    }
    attn_free(first_at);
    return st;
}

/* The pair on one merges line, "left right": their spans in line. */
static bool split_merge_line(const unsigned char *line, size_t n, size_t span[4]) {
    size_t i = 0, fields = 0;
    while (i < n) {
        while (i < n && (line[i] == ' ' || line[i] == '\t')) i++;
        if (i == n) break;
        if (fields == 2) return false;
        span[2 * fields] = i;
        while (i < n && line[i] != ' ' && line[i] != '\t') i++;
        span[2 * fields + 1] = i;
        fields++;
    }
    return fields == 2;
}

/* vocab.bpe / merges.txt: "left right" per line, ranked by line; an
 * optional "#version" first line; blank lines skipped. */
static attn_status read_merges(attn_tokenizer *t, const char *path, const byte_store *strings,
                               const id_table *by_string) {
    attn_ctx *ctx = t->ctx;
    unsigned char *file;
    size_t n;
    attn_status st = read_file(ctx, path, &file, &n);
    if (st) return st;
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += file[i] == '\n';
    unsigned char *joined = NULL;
    size_t joined_cap = 0;
    if (!pair_table_init(&t->merges, lines)) {
        st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "no memory for %s's %zu merges", path, lines);
        goto done;
    }
    uint32_t rank = 0;
    size_t line_no = 0;
    for (size_t begin = 0; begin < n;) {
        size_t end = begin;
        while (end < n && file[end] != '\n') end++;
        size_t next = end + 1, len = end - begin;
        const unsigned char *line = file + begin;
        line_no++;
        begin = next;
        if (len && line[len - 1] == '\r') len--;
        if (line_no == 1 && len >= 8 && memcmp(line, "#version", 8) == 0) continue;
        size_t span[4];
        char shown[QUOTED_CHARS];
        bool blank = true;
        for (size_t i = 0; i < len; i++) blank = blank && (line[i] == ' ' || line[i] == '\t');
        if (blank) continue;
        if (!split_merge_line(line, len, span)) {
            st = attn_fail(ctx, ATTN_ERR_FORMAT,
                           "%s:%zu: a merge is two tokens separated by a space, not \"%s\"", path,
                           line_no, quoted(shown, line, len));
            goto done;
        }
        size_t left_len = span[1] - span[0], right_len = span[3] - span[2];
        if (left_len + right_len > joined_cap) {
            attn_free(joined);
            joined_cap = 2 * (left_len + right_len);
            joined = attn_malloc(joined_cap);
            if (!joined) {
                st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "no memory to read %s", path);
                goto done;
            }
        }
        memcpy(joined, line + span[0], left_len);
        memcpy(joined + left_len, line + span[2], right_len);
        int32_t left = id_table_find(by_string, strings, joined, left_len);
        int32_t right = id_table_find(by_string, strings, line + span[2], right_len);
        int32_t merged = id_table_find(by_string, strings, joined, left_len + right_len);
        if (left < 0 || right < 0 || merged < 0) {
            const unsigned char *missing = left < 0 ? joined : right < 0 ? line + span[2] : joined;
            size_t missing_len = left < 0 ? left_len : right < 0 ? right_len : left_len + right_len;
            st = attn_fail(ctx, ATTN_ERR_FORMAT,
                           "%s:%zu: the merge's token \"%s\" is not in the vocabulary", path,
                           line_no, quoted(shown, missing, missing_len));
            goto done;
        }
        pair_table_put(&t->merges, left, right, rank++, merged);
    }
done:
    attn_free(joined);
    attn_free(file);
    return st;
}

/* Each id's bytes: the key's characters mapped back through
 * bytes_to_unicode (a character outside it stands for its own UTF-8). */
static attn_status decode_gpt2_tokens(attn_tokenizer *t, const char *path,
                                      const byte_store *strings) {
    if (!byte_store_ids(&t->tokens, strings->count))
        return attn_fail(t->ctx, ATTN_ERR_NO_MEMORY, "no memory for %s's tokens", path);
    for (size_t id = 0; id < strings->count; id++) {
        const unsigned char *s = strings->data + strings->start[id];
        size_t n = strings->len[id], start = t->tokens.used;
        if (!n) continue;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t len = attn_utf8_decode(s + i, n - i, &cp); /* valid: the JSON reader checked */
            int b = unicode_to_byte(cp);
            unsigned char one = (unsigned char)b;
            size_t at;
            bool ok = b >= 0 ? byte_store_append(&t->tokens, &one, 1, &at)
                             : byte_store_append(&t->tokens, s + i, len, &at);
            if (!ok) return attn_fail(t->ctx, ATTN_ERR_NO_MEMORY, "no memory for %s's tokens", path);
            i += len;
        }
        t->tokens.start[id] = start;
        t->tokens.len[id] = (uint32_t)(t->tokens.used - start);
    }
    return ATTN_OK;
}

static attn_status load_gpt2(attn_tokenizer *t, const char *vocab_path, const char *merges_path) {
    attn_ctx *ctx = t->ctx;
    byte_store strings = {0};
    raw_entries entries = {0};
    id_table by_string = {0};
    unsigned char *file = NULL;
    size_t n;
    attn_status st = read_file(ctx, vocab_path, &file, &n);
    if (st) goto done;
    attn_json_reader c;
    attn_json_reader_init(&c, ctx, file, n, vocab_path);
    c.lines = true;
    c.check_utf8 = true;
    c.allow_nul = true;
    if ((st = read_vocab_json(&c, &strings, &entries))) goto done;
    if ((st = index_entries(ctx, vocab_path, file, false, &entries, &strings, &by_string)))
        goto done;
    for (unsigned b = 0; b < 256; b++) {
        unsigned char key[4];
        size_t len = attn_utf8_encode(byte_to_unicode(b), key);
        t->byte_token[b] = id_table_find(&by_string, &strings, key, len);
        if (t->byte_token[b] < 0) {
            st = attn_fail(ctx, ATTN_ERR_FORMAT,
                           "%s: no token for byte 0x%02X (\"%.*s\"): a byte-level BPE vocabulary "
                           "has all 256", vocab_path, b, (int)len, (const char *)key);
            goto done;
        }
    }
    if ((st = read_merges(t, merges_path, &strings, &by_string))) goto done;
    if ((st = decode_gpt2_tokens(t, vocab_path, &strings))) goto done;
    t->tokens.count = strings.count;
    t->vocab_size = strings.count;
done:
    attn_free(file);
    attn_free(entries.at);
    attn_free(by_string.slot);
    byte_store_free(&strings);
    return st;
}

/* ------------------------------------------------------------------------ */
/* tiktoken: "base64 rank" per line                                          */
/* ------------------------------------------------------------------------ */

static int base64_value(unsigned char ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+') return 62;
    if (ch == '/') return 63;
    return -1;
}

/* Standard base64 with padding into out (n / 4 * 3 bytes at most);
 * false when it is not. */
static bool base64_decode(const unsigned char *in, size_t n, unsigned char *out, size_t *len) {
    if (n == 0 || n % 4) return false;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        size_t pad = 0;
        for (size_t k = 0; k < 4; k++) {
            bool last_group = i + 4 == n;
            if (in[i + k] == '=' && last_group && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad) return false; /* '=' then a digit */
            v[k] = base64_value(in[i + k]);
            if (v[k] < 0) return false;
        }
        uint32_t bits = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) | ((uint32_t)v[2] << 6) |
                        (uint32_t)v[3];
        out[o++] = (unsigned char)(bits >> 16);
        if (pad < 2) out[o++] = (unsigned char)(bits >> 8);
        if (pad < 1) out[o++] = (unsigned char)bits;
    }
    *len = o;
    return true;
}

/* One "token rank" line into entries (the token's bytes into store). */
static attn_status read_tiktoken_line(attn_ctx *ctx, const char *path, size_t line_no,
                                      const unsigned char *line, size_t len, byte_store *store,
                                      raw_entries *entries, unsigned char *scratch) {
    size_t span[4];
    char shown[QUOTED_CHARS];
    if (!split_merge_line(line, len, span))
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s:%zu: expected a base64 token and its rank, not \"%s\" (a tiktoken "
                         "file)", path, line_no, quoted(shown, line, len));
    size_t bytes;
    if (!base64_decode(line + span[0], span[1] - span[0], scratch, &bytes))
        return attn_fail(ctx, ATTN_ERR_FORMAT, "%s:%zu: \"%s\" is not base64", path, line_no,
                         quoted(shown, line + span[0], span[1] - span[0]));
    long long rank = 0;
    for (size_t i = span[2]; i < span[3]; i++) {
        if (line[i] < '0' || line[i] > '9')
            return attn_fail(ctx, ATTN_ERR_FORMAT, "%s:%zu: the rank \"%s\" is not a number",
                             path, line_no, quoted(shown, line + span[2], span[3] - span[2]));
        rank = rank * 10 + (line[i] - '0');
        if (rank > INT32_MAX - LLAMA3_SPECIALS)
            return attn_fail(ctx, ATTN_ERR_FORMAT, "%s:%zu: the rank is too large", path, line_no);
    }
    raw_entry e = {.where = line_no, .len = (uint32_t)bytes, .id = (int32_t)rank};
    if (!byte_store_append(store, scratch, bytes, &e.offset) || !raw_entries_push(entries, e))
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "no memory to read %s", path);
    return ATTN_OK;
}

/* Llama 3's special tokens after the ranks: their names by id. */
static attn_status add_llama3_specials(attn_tokenizer *t, const char *path) {
    size_t base = t->tokens.count;
    for (unsigned k = 0; k < LLAMA3_SPECIALS; k++) {
        char name[32] = "";
        for (size_t j = 0; j < sizeof(llama3_named_specials) / sizeof(llama3_named_specials[0]); j++)
            if (llama3_named_specials[j].offset == k)
                snprintf(name, sizeof(name), "%s", llama3_named_specials[j].name);
        if (!name[0]) snprintf(name, sizeof(name), "<|reserved_%u|>", k - 2);
        size_t at;
        if (!byte_store_append(&t->tokens, name, strlen(name), &at))
            return attn_fail(t->ctx, ATTN_ERR_NO_MEMORY, "no memory for %s's tokens", path);
        t->tokens.start[base + k] = at;
        t->tokens.len[base + k] = (uint32_t)strlen(name);
    }
    t->tokens.count = base + LLAMA3_SPECIALS;
    return ATTN_OK;
}

static attn_status load_tiktoken(attn_tokenizer *t, const char *path) {
    attn_ctx *ctx = t->ctx;
    raw_entries entries = {0};
    unsigned char *file = NULL, *scratch = NULL;
    size_t n;
    attn_status st = read_file(ctx, path, &file, &n);
    if (st) goto done;
    scratch = attn_malloc(n / 4 * 3 + 3);
    if (!scratch) {
        st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "no memory to read %s", path);
        goto done;
    }
    size_t line_no = 0;
    for (size_t begin = 0; begin < n;) {
        size_t end = begin;
        while (end < n && file[end] != '\n') end++;
        const unsigned char *line = file + begin;
        size_t len = end - begin;
        begin = end + 1;
        line_no++;
        if (len && line[len - 1] == '\r') len--;
        if (len == 0) continue;
        st = read_tiktoken_line(ctx, path, line_no, line, len, &t->tokens, &entries, scratch);
        if (st) goto done;
    }
    if (entries.count == 0) {
        st = attn_fail(ctx, ATTN_ERR_FORMAT, "%s: no tokens (a tiktoken file has a base64 token "
                       "and its rank per line)", path);
        goto done;
    }
    byte_store *store = &t->tokens;
    if ((st = index_entries(ctx, path, file, true, &entries, store, &t->by_bytes))) goto done;
    for (unsigned b = 0; b < 256; b++) {
        unsigned char byte = (unsigned char)b;
        t->byte_token[b] = id_table_find(&t->by_bytes, store, &byte, 1);
        if (t->byte_token[b] < 0) {
            st = attn_fail(ctx, ATTN_ERR_FORMAT, "%s: no token for the byte 0x%02X: a byte-level "
                           "BPE file has all 256", path, b);
            goto done;
        }
    }
    if ((st = add_llama3_specials(t, path))) goto done;
    t->vocab_size = t->tokens.count;
done:
    attn_free(file);
    attn_free(scratch);
    attn_free(entries.at);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Finding the files                                                         */
/* ------------------------------------------------------------------------ */

/* Whether path opens and reads (a directory opens on some systems, but
 * reading it fails). */
static bool file_readable(const char *path, bool *opens) {
    FILE *f = attn_file_open_read(path);
    if (opens) *opens = f != NULL;
    if (!f) return false;
    int probe = fgetc(f);
    bool readable = probe != EOF || !ferror(f);
    fclose(f);
    return readable;
}

static bool file_exists(const char *path) { return file_readable(path, NULL); }

/* dir + "/" + name, or NULL when out of memory. */
static char *path_join(const char *dir, size_t dir_len, const char *name) {
    size_t name_len = strlen(name);
    char *p = attn_malloc(dir_len + 1 + name_len + 1);
    if (!p) return NULL;
    memcpy(p, dir, dir_len);
    p[dir_len] = '/';
    memcpy(p + dir_len + 1, name, name_len + 1);
    return p;
}

static size_t dir_length(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? (size_t)(slash - path) : 1;
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The GPT-2 file pairs by their names: the vocabulary, then the merges. */
static const char *const gpt2_pairs[][2] = {{"encoder.json", "vocab.bpe"},
                                            {"vocab.json", "merges.txt"}};

/* Whether the file at path starts (after white space) with '{'. */
static bool looks_like_json(const char *path) {
    FILE *f = attn_file_open_read(path);
    if (!f) return false;
    int ch;
    while ((ch = fgetc(f)) == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {}
    fclose(f);
    return ch == '{';
}

static attn_status load_from_path(attn_tokenizer *t, const char *path) {
    attn_ctx *ctx = t->ctx;
    char *vocab = NULL, *merges = NULL;
    attn_status st = ATTN_OK;
    size_t path_len = strlen(path);
    /* a directory: the first pair it holds, else tokenizer.model */
    for (size_t k = 0; k < 2 && !vocab; k++) {
        vocab = path_join(path, path_len, gpt2_pairs[k][0]);
        merges = path_join(path, path_len, gpt2_pairs[k][1]);
        if (!vocab || !merges) goto no_memory;
        if (!file_exists(vocab)) {
            attn_free(vocab);
            attn_free(merges);
            vocab = merges = NULL;
        }
    }
    if (!vocab) {
        vocab = path_join(path, path_len, "tokenizer.model");
        if (!vocab) goto no_memory;
        if (file_exists(vocab)) {
            t->kind = TOKENIZER_TIKTOKEN;
            st = load_tiktoken(t, vocab);
            goto done;
        }
        attn_free(vocab);
        vocab = NULL;
    }
    /* a file: one of a GPT-2 pair (the other beside it), or tiktoken's */
    if (!vocab) {
        const char *name = base_name(path);
        size_t dir = dir_length(path);
        const char *dir_path = strrchr(path, '/') ? path : ".";
        for (size_t k = 0; k < 2 && !vocab; k++) {
            if (strcmp(name, gpt2_pairs[k][1]) == 0) {
                vocab = path_join(dir_path, dir, gpt2_pairs[k][0]);
                merges = attn_malloc(path_len + 1);
                if (!vocab || !merges) goto no_memory;
                memcpy(merges, path, path_len + 1);
            }
        }
        if (!vocab && looks_like_json(path)) {
            size_t k = strcmp(name, gpt2_pairs[0][0]) == 0 ? 0 : 1;
            merges = path_join(dir_path, dir, gpt2_pairs[k][1]);
            vocab = attn_malloc(path_len + 1);
            if (!vocab || !merges) goto no_memory;
            memcpy(vocab, path, path_len + 1);
        }
    }
    bool opens;
    if (vocab) {
        t->kind = TOKENIZER_GPT2;
        st = load_gpt2(t, vocab, merges);
    } else if (!file_readable(path, &opens) && opens) {
        st = attn_fail(ctx, ATTN_ERR_IO, "%s: a directory holds encoder.json + vocab.bpe, "
                       "vocab.json + merges.txt or tokenizer.model, and this one none", path);
    } else {
        t->kind = TOKENIZER_TIKTOKEN;
        st = load_tiktoken(t, path);
    }
    goto done;
no_memory:
    st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "no memory for the paths beside %s", path);
done:
    attn_free(vocab);
    attn_free(merges);
    return st;
}

/* ------------------------------------------------------------------------ */
/* The API                                                                   */
/* ------------------------------------------------------------------------ */

void attn_tokenizer_free(attn_tokenizer *t) {
    if (!t) return;
    byte_store_free(&t->tokens);
    attn_free(t->by_bytes.slot);
    pair_table_free(&t->merges);
    attn_free(t);
}

attn_status attn_tokenizer_load(attn_ctx *ctx, const char *path, attn_tokenizer **out) {
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_tokenizer_load: path is NULL");
    attn_tokenizer *t = attn_calloc(1, sizeof(*t));
    if (!t) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "no memory for a tokenizer");
    t->ctx = ctx;
    attn_status st = load_from_path(t, path);
    if (st) {
        attn_tokenizer_free(t);
        return st;
    }
    *out = t;
    return ATTN_OK;
}

size_t attn_tokenizer_vocab_size(const attn_tokenizer *t) { return t ? t->vocab_size : 0; }

/* The end of the pre-tokenizer's piece of s[0, length) that starts at i:
 * GPT-2's pattern or Llama 3's, by the tokenizer's kind. */
static size_t piece_end(const attn_tokenizer *t, const unsigned char *s, size_t length,
                        size_t i) {
    return t->kind == TOKENIZER_GPT2 ? gpt2_piece_end(s, length, i)
                                     : llama3_piece_end(s, length, i);
}

attn_status attn_tokenizer_encode(attn_tokenizer *t, const char *text, size_t length,
                                  int32_t *ids, size_t capacity, size_t *count) {
    if (!t) return ATTN_ERR_NULL;
    attn_ctx *ctx = t->ctx;
    attn_clear_error(ctx);
    if (!count) return attn_fail(ctx, ATTN_ERR_NULL, "attn_tokenizer_encode: count is NULL");
    if (!text && length)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_tokenizer_encode: text is NULL (length %zu)",
                         length);
    if (!ids && capacity)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_tokenizer_encode: ids is NULL (capacity %zu)",
                         capacity);
    const unsigned char *s = (const unsigned char *)text;
    token_sink sink = {.ids = ids, .capacity = capacity};
    bpe_work work = {0};
    /* the merge space of the longest piece, in hand before an id is
     * written: a failure leaves ids and *count as they were */
    size_t longest = 0;
    for (size_t i = 0, end; i < length; i = end) {
        end = piece_end(t, s, length, i);
        if (end - i > longest) longest = end - i;
    }
    if (longest > 1 && !bpe_work_reserve(&work, longest))
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "attn_tokenizer_encode: no memory to merge a piece of %zu bytes",
                         longest);
    for (size_t i = 0; i < length;) {
        size_t end = piece_end(t, s, length, i);
        if (!encode_piece(t, s + i, end - i, &work, &sink)) {
            bpe_work_free(&work);
            return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                             "no memory to merge a piece of %zu bytes (at byte %zu)", end - i, i);
        }
        i = end;
    }
    bpe_work_free(&work);
    *count = sink.count;
    if (sink.count > capacity)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "the text (%zu bytes) has %zu tokens, more than capacity %zu: the first "
                         "%zu are written", length, sink.count, capacity, capacity);
    return ATTN_OK;
}

attn_status attn_tokenizer_decode(attn_tokenizer *t, const int32_t *ids, size_t n, char *text,
                                  size_t capacity, size_t *length) {
    if (!t) return ATTN_ERR_NULL;
    attn_ctx *ctx = t->ctx;
    attn_clear_error(ctx);
    if (!length) return attn_fail(ctx, ATTN_ERR_NULL, "attn_tokenizer_decode: length is NULL");
    if (!ids && n)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_tokenizer_decode: ids is NULL (n %zu)", n);
    if (!text && capacity)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_tokenizer_decode: text is NULL (capacity %zu)",
                         capacity);
    for (size_t i = 0; i < n; i++) { /* every id checked before a byte is written */
        int32_t id = ids[i];
        if (id < 0 || (size_t)id >= t->tokens.count || t->tokens.len[id] == 0)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "ids[%zu] = %d is not a token (vocab_size %zu)", i, (int)id,
                             t->vocab_size);
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = t->tokens.len[ids[i]];
        if (total < capacity) {
            size_t fit = capacity - total < len ? capacity - total : len;
            memcpy(text + total, t->tokens.data + t->tokens.start[ids[i]], fit);
        }
        total += len;
    }
    *length = total;
    if (total > capacity)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "the %zu ids decode to %zu bytes, more than capacity %zu: the first %zu "
                         "are written", n, total, capacity, capacity);
    return ATTN_OK;
}
