/*
 * fuzz_json.c — libFuzzer target for the JSON reader (io/json.c) and the
 * configuration files read through it.
 *
 * Each input is parsed into a tree (attn_json_parse), whose every node is
 * then walked: counts match the items, keys are C strings, a key's lookup
 * finds an item of that key (the last of its name), and the accessors agree
 * with the node's type. The same bytes are then read as a model's config
 * (attn_lm_config_read, from a memfd): a text the tree parser rejects must
 * be rejected there with the same status. The token reader underneath is
 * fuzzed by its other users too (fuzz_safetensors, fuzz_tokenizer).
 */
#define _GNU_SOURCE
#include "attn.h"
#include "io/json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static attn_ctx *ctx;

static void walk(const attn_json *v, size_t depth) {
    if (depth > ATTN_JSON_MAX_DEPTH) abort();
    double d;
    size_t n;
    bool b;
    if (attn_json_as_double(v, &d) != (v->type == ATTN_JSON_NUMBER)) abort();
    if (attn_json_as_bool(v, &b) != (v->type == ATTN_JSON_BOOL)) abort();
    if ((attn_json_as_string(v) != NULL) != (v->type == ATTN_JSON_STRING)) abort();
    if (attn_json_as_size(v, &n) && (double)n != v->number) abort();
    if (v->type != ATTN_JSON_ARRAY && v->type != ATTN_JSON_OBJECT) return;
    if (v->count && !v->items) abort();
    for (size_t i = 0; i < v->count; i++) {
        walk(&v->items[i], depth + 1);
        if (v->type != ATTN_JSON_OBJECT) continue;
        const attn_json *found = attn_json_get(v, v->keys[i]);
        if (!found) abort();
        size_t at = (size_t)(found - v->items);
        if (at < i || strcmp(v->keys[at], v->keys[i]) != 0) abort();
    }
}

static int memfd_with(const void *bytes, size_t size, char path[64]) {
    int fd = memfd_create("fuzz_json", 0);
    if (fd < 0) return -1;
    const unsigned char *p = bytes;
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, p + done, size - done);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx && attn_ctx_new(&(attn_ctx_config){.num_threads = 1}, &ctx) != ATTN_OK) abort();
    attn_json *root = (attn_json *)1;
    attn_status parsed = attn_json_parse(ctx, (const char *)data, size, "fuzz.json", &root);
    if (parsed != ATTN_OK) {
        if (root != NULL) abort();
        if (!strstr(attn_ctx_last_error(ctx), "fuzz.json")) abort();
    } else {
        if (!root) abort();
        walk(root, 0);
        attn_json_free(root);
    }
    char path[64];
    int fd = memfd_with(data, size, path);
    if (fd < 0) return 0;
    attn_lm_config cfg;
    attn_status read = attn_lm_config_read(ctx, path, &cfg);
    close(fd);
    if (parsed != ATTN_OK && read != parsed) abort();
    return 0;
}
