/*
 * llama_greedy.c — greedy ids from a GGUF model through llama.cpp's public
 * API (llama.h), to check that llama.cpp and attn generate read the same
 * weights the same way before their speeds are compared:
 *
 *   llama_greedy --model M.gguf --prompt-ids 1,2,3 --max-new-tokens N [--threads T]
 *
 * The prompt is decoded in one batch, then each new token is the argmax of
 * the last logits (the first of equal maxima, as attn generate's greedy
 * choice) and is fed back. Prints the new ids on one line, comma separated,
 * as attn generate does; llama.cpp's own log goes to stderr only on errors.
 */
#include <llama.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_IDS = 65536 };

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int usage(void) {
    fprintf(stderr, "usage: llama_greedy --model M.gguf --prompt-ids 1,2,3 --max-new-tokens N "
                    "[--threads T]\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *ids_text = NULL;
    long max_new = -1, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model_path = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt-ids")) ids_text = argv[i + 1];
        else if (!strcmp(argv[i], "--max-new-tokens")) max_new = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--threads")) threads = strtol(argv[i + 1], NULL, 10);
        else return usage();
    }
    if (argc % 2 == 0 || !model_path || !ids_text || max_new <= 0 || threads <= 0) return usage();

    static llama_token ids[MAX_IDS];
    int n_prompt = 0;
    for (const char *p = ids_text; *p && n_prompt < MAX_IDS;) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p) {
            fprintf(stderr, "llama_greedy: bad --prompt-ids near '%s'\n", p);
            return 2;
        }
        ids[n_prompt++] = (llama_token)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (n_prompt + max_new > MAX_IDS) {
        fprintf(stderr, "llama_greedy: prompt %d + new %ld tokens pass %d\n", n_prompt, max_new,
                MAX_IDS);
        return 2;
    }

    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(model_path, llama_model_default_params());
    if (!model) {
        fprintf(stderr, "llama_greedy: could not load %s\n", model_path);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + max_new);
    cp.n_batch = (uint32_t)n_prompt;
    cp.n_ubatch = (uint32_t)n_prompt;
    cp.n_threads = cp.n_threads_batch = (int32_t)threads;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama_greedy: could not make a context of %u tokens\n", cp.n_ctx);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch batch = llama_batch_get_one(ids, n_prompt);
    for (long step = 0; step < max_new; step++) {
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama_greedy: llama_decode failed at step %ld\n", step);
            return 1;
        }
        const float *logits = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int t = 1; t < n_vocab; t++)
            if (logits[t] > logits[best]) best = t;
        llama_token *next = &ids[n_prompt + step];
        *next = best;
        printf("%s%d", step ? "," : "", best);
        batch = llama_batch_get_one(next, 1);
    }
    printf("\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
