/*
 * text_data.c — the book's text data for pretraining (ch02's GPTDatasetV1
 * and create_dataloader_v1, ch05's split), index for index with PyTorch:
 *
 *   split     gpt_train.py cuts the text at the character (code point)
 *             index int(train_ratio * len(text)); each part is tokenized
 *             on its own, so the cut is found in characters, not bytes.
 *   dataset   windows i = 0, stride, 2 stride, ... < len(ids) - max_length:
 *             input ids[i .. i + max_length), target one token further on.
 *   loader    DataLoader(dataset, batch_size, shuffle, drop_last,
 *             num_workers=0). Every iter(loader) draws a 64-bit _base_seed
 *             from the global generator (unused without workers, but
 *             drawn); with shuffle, the first next() then has
 *             RandomSampler draw a seed from the global generator and take
 *             torch.randperm(n) from a fresh generator seeded with it. A
 *             for loop over the loader always makes that first next(), so
 *             one "pass" here makes both draws, in that order.
 */
#include "internal.h"
#include "train/text_data.h"
#include "utf8.h"

#include <string.h>

/* ---- the split ----------------------------------------------------------- */

attn_status attn_text_split(attn_ctx *ctx, const char *text, size_t length, double train_ratio,
                            size_t *split) {
    attn_clear_error(ctx);
    if ((!text && length > 0) || !split)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_text_split: %s is NULL",
                         !split ? "split" : "text");
    char number[ATTN_NUMBER_CHARS];
    if (!(train_ratio >= 0.0 && train_ratio <= 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "attn_text_split: train_ratio %s must be in [0, 1]",
                         attn_number_text(train_ratio, number));
    /* Python reads no text that is not UTF-8: its characters would be
     * counted here in no way Python can match */
    size_t bad = attn_utf8_invalid_at((const unsigned char *)text, length);
    if (bad < length)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_text_split: text is not UTF-8: byte %zu (0x%02x) of %zu starts no "
                         "character",
                         bad, (unsigned)(unsigned char)text[bad], length);
    /* Python's len counts code points: every byte but UTF-8's
     * continuation bytes (10xxxxxx) starts one. */
    size_t chars = 0;
    for (size_t i = 0; i < length; i++) chars += ((unsigned char)text[i] & 0xc0u) != 0x80u;
    /* int(train_ratio * len(text)): a double product, truncated */
    size_t cut = (size_t)(train_ratio * (double)chars);
    if (cut > chars) cut = chars;
    size_t seen = 0, at = 0;
    for (; at < length; at++) {
        if (((unsigned char)text[at] & 0xc0u) == 0x80u) continue;
        if (seen == cut) break;
        seen++;
    }
    *split = at;
    return ATTN_OK;
}

/* ---- the dataset ------------------------------------------------------------ */

struct attn_text_dataset {
    attn_ctx *ctx;
    int32_t *ids;
    size_t n_ids, max_length, stride, windows;
};

/* len(range(0, n_ids - max_length, stride)) */
static size_t window_count(size_t n_ids, size_t max_length, size_t stride) {
    if (n_ids <= max_length) return 0;
    size_t span = n_ids - max_length;
    return span / stride + (span % stride != 0);
}

static attn_status check_window_args(attn_ctx *ctx, const char *fn, size_t max_length,
                                     size_t stride, attn_text_dataset **out) {
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "%s: out is NULL", fn);
    *out = NULL;
    if (max_length == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: max_length is 0 (windows of no tokens)", fn);
    if (stride == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: stride is 0 (range() step must not be 0)",
                         fn);
    return ATTN_OK;
}

/* Takes ids (allocated with attn_malloc) into a new dataset. */
static attn_status dataset_take(attn_ctx *ctx, const char *fn, int32_t *ids, size_t n_ids,
                                size_t max_length, size_t stride, attn_text_dataset **out) {
    attn_text_dataset *d = attn_calloc(1, sizeof *d);
    if (!d) {
        attn_free(ids);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    d->ctx = ctx;
    d->ids = ids;
    d->n_ids = n_ids;
    d->max_length = max_length;
    d->stride = stride;
    d->windows = window_count(n_ids, max_length, stride);
    *out = d;
    return ATTN_OK;
}

attn_status attn_text_dataset_new(attn_ctx *ctx, const int32_t *ids, size_t n_ids,
                                  size_t max_length, size_t stride, attn_text_dataset **out) {
    const char *fn = "attn_text_dataset_new";
    attn_clear_error(ctx);
    attn_status st = check_window_args(ctx, fn, max_length, stride, out);
    if (st != ATTN_OK) return st;
    if (!ids && n_ids > 0) return attn_fail(ctx, ATTN_ERR_NULL, "%s: ids is NULL", fn);
    size_t bytes;
    if (!attn_mul_size(n_ids ? n_ids : 1, sizeof(int32_t), &bytes))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: n_ids (%zu) ids overflow size_t", fn,
                         n_ids);
    int32_t *copy = attn_malloc(bytes);
    if (!copy)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: no memory for %zu ids", fn, n_ids);
    if (n_ids > 0) memcpy(copy, ids, n_ids * sizeof(int32_t));
    return dataset_take(ctx, fn, copy, n_ids, max_length, stride, out);
}

#define ENDOFTEXT "<|endoftext|>"

int32_t attn_endoftext_id(attn_tokenizer *tok) {
    size_t v = attn_tokenizer_vocab_size(tok);
    if (v == 0 || v - 1 > (size_t)INT32_MAX) return -1;
    int32_t id = (int32_t)(v - 1);
    char name[sizeof ENDOFTEXT];
    size_t len = 0;
    if (attn_tokenizer_decode(tok, &id, 1, name, sizeof name, &len) != ATTN_OK) return -1;
    return len == sizeof ENDOFTEXT - 1 && memcmp(name, ENDOFTEXT, len) == 0 ? id : -1;
}

attn_status attn_encode_with_endoftext(attn_ctx *ctx, const char *fn, attn_tokenizer *tok,
                                       const char *text, size_t length, int32_t *ids,
                                       size_t capacity, size_t *n_out) {
    const size_t name_len = sizeof ENDOFTEXT - 1;
    int32_t special = -2; /* looked up at the first occurrence */
    size_t n = 0, at = 0;
    while (at < length) {
        size_t end = at;
        while (end < length &&
               !(length - end >= name_len && memcmp(text + end, ENDOFTEXT, name_len) == 0))
            end++;
        size_t count = 0;
        if (end > at) {
            attn_status st =
                attn_tokenizer_encode(tok, text + at, end - at, ids + n, capacity - n, &count);
            if (st == ATTN_ERR_NO_MEMORY)
                return attn_fail(ctx, st, "%s: no memory to encode bytes %zu .. %zu of the text",
                                 fn, at, end);
            if (st != ATTN_OK)
                return attn_fail(ctx, st, "%s: encoding bytes %zu .. %zu of the text failed", fn,
                                 at, end);
            n += count;
        }
        if (end < length) {
            if (special == -2) special = attn_endoftext_id(tok);
            if (special < 0)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: the text names " ENDOFTEXT " at byte %zu but the "
                                 "tokenizer's last id is not that token",
                                 fn, end);
            if (n == capacity)
                return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: the text has more than %zu ids", fn,
                                 capacity);
            ids[n++] = special;
            end += name_len;
        }
        at = end;
    }
    *n_out = n;
    return ATTN_OK;
}

attn_status attn_text_dataset_encode(attn_ctx *ctx, attn_tokenizer *tok, const char *text,
                                     size_t length, size_t max_length, size_t stride,
                                     attn_text_dataset **out) {
    const char *fn = "attn_text_dataset_encode";
    attn_clear_error(ctx);
    attn_status st = check_window_args(ctx, fn, max_length, stride, out);
    if (st != ATTN_OK) return st;
    if (!tok || (!text && length > 0))
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", fn, !tok ? "tok" : "text");
    /* A byte-level BPE token covers at least one byte, and <|endoftext|>
     * thirteen: the text has at most length ids. */
    size_t capacity = length ? length : 1, bytes;
    if (!attn_mul_size(capacity, sizeof(int32_t), &bytes))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: length (%zu) ids overflow size_t", fn,
                         length);
    int32_t *ids = attn_malloc(bytes);
    if (!ids) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: no memory for %zu ids", fn, length);
    size_t n = 0;
    st = attn_encode_with_endoftext(ctx, fn, tok, text, length, ids, capacity, &n);
    if (st != ATTN_OK) {
        attn_free(ids);
        return st;
    }
    return dataset_take(ctx, fn, ids, n, max_length, stride, out);
}

void attn_text_dataset_free(attn_text_dataset *d) {
    if (!d) return;
    attn_free(d->ids);
    attn_free(d);
}

size_t attn_text_dataset_len(const attn_text_dataset *d) { return d ? d->windows : 0; }

size_t attn_text_dataset_num_ids(const attn_text_dataset *d) { return d ? d->n_ids : 0; }

const int32_t *attn_text_dataset_ids(const attn_text_dataset *d) { return d ? d->ids : NULL; }

size_t attn_text_dataset_max_length(const attn_text_dataset *d) {
    return d ? d->max_length : 0;
}

/* Window index's input and target (max_length each); index checked. */
static void copy_window(const attn_text_dataset *d, size_t index, int32_t *input,
                        int32_t *target) {
    const int32_t *from = d->ids + index * d->stride;
    memcpy(input, from, d->max_length * sizeof(int32_t));
    memcpy(target, from + 1, d->max_length * sizeof(int32_t));
}

attn_status attn_text_dataset_get(const attn_text_dataset *d, size_t index, int32_t *input,
                                  int32_t *target) {
    if (!d) return ATTN_ERR_NULL;
    attn_clear_error(d->ctx);
    if (!input || !target)
        return attn_fail(d->ctx, ATTN_ERR_NULL, "attn_text_dataset_get: %s is NULL",
                         !input ? "input" : "target");
    if (index >= d->windows)
        return attn_fail(d->ctx, ATTN_ERR_INVALID,
                         "attn_text_dataset_get: index %zu is past the %zu windows", index,
                         d->windows);
    copy_window(d, index, input, target);
    return ATTN_OK;
}

/* ---- the loader -------------------------------------------------------------- */

struct attn_data_loader {
    attn_ctx *ctx;
    size_t n, batch_size, batches;
    bool shuffle, drop_last, begun;
    int64_t *order;   /* this pass's dataset indices, in the sampler's order */
    attn_rng *sampler; /* RandomSampler's own generator, made here so that a
                        * pass cannot fail once it has drawn */
};

attn_status attn_data_loader_new(attn_ctx *ctx, size_t dataset_len, size_t batch_size,
                                 bool shuffle, bool drop_last, attn_data_loader **out) {
    const char *fn = "attn_data_loader_new";
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "%s: out is NULL", fn);
    *out = NULL;
    if (batch_size == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: batch_size is 0 (BatchSampler needs a positive batch_size)", fn);
    if (shuffle && dataset_len == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: shuffle over an empty dataset (RandomSampler needs num_samples "
                         "> 0)",
                         fn);
    if (dataset_len > (size_t)INT64_MAX)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: dataset_len %zu does not fit int64", fn,
                         dataset_len);
    size_t bytes;
    if (!attn_mul_size(dataset_len ? dataset_len : 1, sizeof(int64_t), &bytes))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: dataset_len (%zu) indices overflow size_t",
                         fn, dataset_len);
    attn_data_loader *l = attn_calloc(1, sizeof *l);
    int64_t *order = attn_malloc(bytes);
    attn_rng *sampler = NULL;
    attn_status st = attn_rng_new(NULL, 0, &sampler);
    if (!l || !order || st != ATTN_OK) {
        attn_free(l);
        attn_free(order);
        attn_rng_free(sampler);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: no memory for %zu indices", fn,
                         dataset_len);
    }
    l->ctx = ctx;
    l->n = dataset_len;
    l->batch_size = batch_size;
    l->shuffle = shuffle;
    l->drop_last = drop_last;
    l->order = order;
    l->sampler = sampler;
    l->batches = drop_last ? dataset_len / batch_size
                           : dataset_len / batch_size + (dataset_len % batch_size != 0);
    *out = l;
    return ATTN_OK;
}

void attn_data_loader_free(attn_data_loader *l) {
    if (!l) return;
    attn_free(l->order);
    attn_rng_free(l->sampler);
    attn_free(l);
}

size_t attn_data_loader_len(const attn_data_loader *l) { return l ? l->batches : 0; }

attn_status attn_data_loader_begin(attn_data_loader *l, attn_rng *rng) {
    if (!l) return ATTN_ERR_NULL;
    attn_clear_error(l->ctx);
    if (!rng)
        return attn_fail(l->ctx, ATTN_ERR_NULL,
                         "attn_data_loader_begin: rng (the global generator) is NULL");
    int64_t base_seed = 0, seed = 0;
    /* _BaseDataLoaderIter.__init__: _base_seed, drawn even without workers */
    attn_status st = attn_rng_random_int64(rng, &base_seed);
    if (st == ATTN_OK && l->shuffle) st = attn_rng_random_int64(rng, &seed);
    if (st != ATTN_OK) return attn_fail(l->ctx, st, "attn_data_loader_begin: drawing failed");
    if (l->shuffle) {
        /* RandomSampler: randperm from torch.Generator().manual_seed(seed) */
        st = attn_rng_manual_seed(l->sampler, (uint64_t)seed);
        if (st == ATTN_OK) st = attn_rng_randperm(l->sampler, l->n, l->order);
        if (st != ATTN_OK)
            return attn_fail(l->ctx, st,
                             "attn_data_loader_begin: the sampler's randperm of %zu failed",
                             l->n);
    } else {
        for (size_t i = 0; i < l->n; i++) l->order[i] = (int64_t)i;
    }
    l->begun = true;
    return ATTN_OK;
}

/* Checks batch b of a begun pass; *first and *rows its span of order. */
static attn_status batch_span(const attn_data_loader *l, const char *fn, size_t b, size_t *first,
                              size_t *rows) {
    if (!l->begun)
        return attn_fail(l->ctx, ATTN_ERR_INVALID,
                         "%s: no pass begun (call attn_data_loader_begin first)", fn);
    if (b >= l->batches)
        return attn_fail(l->ctx, ATTN_ERR_INVALID, "%s: batch %zu is past the loader's %zu", fn,
                         b, l->batches);
    *first = b * l->batch_size;
    size_t left = l->n - *first;
    *rows = left < l->batch_size ? left : l->batch_size;
    return ATTN_OK;
}

attn_status attn_data_loader_batch(const attn_data_loader *l, size_t b, size_t *indices,
                                   size_t *count) {
    if (!l) return ATTN_ERR_NULL;
    attn_clear_error(l->ctx);
    if (!indices || !count)
        return attn_fail(l->ctx, ATTN_ERR_NULL, "attn_data_loader_batch: %s is NULL",
                         !indices ? "indices" : "count");
    size_t first = 0, rows = 0;
    attn_status st = batch_span(l, "attn_data_loader_batch", b, &first, &rows);
    if (st != ATTN_OK) return st;
    for (size_t i = 0; i < rows; i++) indices[i] = (size_t)l->order[first + i];
    *count = rows;
    return ATTN_OK;
}

attn_status attn_text_dataset_batch(const attn_text_dataset *d, const attn_data_loader *l,
                                    size_t b, int32_t *inputs, int32_t *targets, size_t *rows) {
    const char *fn = "attn_text_dataset_batch";
    if (!d || !l) return ATTN_ERR_NULL;
    attn_clear_error(l->ctx);
    if (!inputs || !targets || !rows)
        return attn_fail(l->ctx, ATTN_ERR_NULL, "%s: %s is NULL", fn,
                         !inputs ? "inputs" : !targets ? "targets" : "rows");
    if (l->n != d->windows)
        return attn_fail(l->ctx, ATTN_ERR_SHAPE,
                         "%s: the loader covers %zu items but the dataset has %zu windows", fn,
                         l->n, d->windows);
    size_t first = 0, count = 0;
    attn_status st = batch_span(l, fn, b, &first, &count);
    if (st != ATTN_OK) return st;
    for (size_t r = 0; r < count; r++)
        copy_window(d, (size_t)l->order[first + r], inputs + r * d->max_length,
                    targets + r * d->max_length);
    *rows = count;
    return ATTN_OK;
}
