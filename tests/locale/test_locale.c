/*
 * test_locale.c — the file formats under a comma-decimal locale: a program
 * that calls setlocale(LC_ALL, "") in such a locale (de_DE) gets the same
 * numbers from JSON configs and writes the same model metadata as in the C
 * locale. Run by test_locale.sh, which compiles de_DE.UTF-8 into a temporary
 * LOCPATH; without a comma locale the test fails, as it would test nothing.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include "attn.h"
#include "check.h"
#include "io/json.h"

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

int main(void) {
    setlocale(LC_ALL, "");
    char half[16];
    snprintf(half, sizeof half, "%.1f", 0.5);
    CHECK(strcmp(half, "0,5") == 0);
    if (strcmp(half, "0,5") != 0) {
        fprintf(stderr, "test_locale: printf writes %s: no comma locale (run test_locale.sh)\n",
                half);
        return check_summary();
    }
    attn_ctx *ctx = NULL;
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) return 1;
    char dir[] = "/tmp/attn_test_locale_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[128], saved[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(saved, sizeof saved, "%s/model.safetensors", dir);

    /* JSON's numbers read with '.' as the point */
    char buf[32];
    attn_json_format_double(buf, sizeof buf, 1.5);
    CHECK(strcmp(buf, "1.5") == 0);
    attn_json_format_double(buf, sizeof buf, -2.5e-300);
    CHECK(strcmp(buf, "-2.5e-300") == 0);
    write_text(path, "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                     "\"vocab_size\": 11, \"intermediate_size\": 24, \"max_position_embeddings\": "
                     "8, \"rms_norm_eps\": 0.00001, \"rope_theta\": 12345.75, \"rope_scaling\": "
                     "{\"rope_type\": \"llama3\", \"factor\": 8.5, \"low_freq_factor\": 1.5, "
                     "\"high_freq_factor\": 4.25, \"original_max_position_embeddings\": 8}}");
    attn_lm_config c;
    CHECK_STATUS(attn_lm_config_read(ctx, path, &c), ATTN_OK);
    CHECK(c.norm_eps == 0.00001 && c.rope_base == 12345.75 && c.rope_factor == 8.5 &&
          c.rope_low_freq_factor == 1.5 && c.rope_high_freq_factor == 4.25);

    /* a model's metadata written as JSON, and loaded back */
    attn_llama3_config l = {.vocab_size = 11, .context_length = 8, .emb_dim = 8, .n_heads = 2,
                            .n_layers = 1, .hidden_dim = 12, .n_kv_groups = 1,
                            .rope_base = 500000.5, .rope_factor = 8.5,
                            .rope_low_freq_factor = 1.5, .rope_high_freq_factor = 4.25,
                            .rope_original_context_length = 4};
    attn_rng *rng = NULL;
    attn_model *m = NULL, *back = NULL;
    CHECK_STATUS(attn_rng_new(ctx, 7, &rng), ATTN_OK);
    CHECK_STATUS(attn_model_new_llama3(ctx, &l, rng, &m), ATTN_OK);
    CHECK_STATUS(attn_model_new_llama3(ctx, &l, rng, &back), ATTN_OK);
    CHECK_STATUS(attn_model_save(m, saved), ATTN_OK);
    attn_safetensors *file = NULL;
    CHECK_STATUS(attn_safetensors_open(ctx, saved, &file), ATTN_OK);
    const char *freq = file ? attn_safetensors_metadata_get(file, "rope_freq") : NULL;
    const char *base = file ? attn_safetensors_metadata_get(file, "rope_base") : NULL;
    CHECK(freq && strstr(freq, "\"factor\": 8.5, \"low_freq_factor\": 1.5, "
                               "\"high_freq_factor\": 4.25"));
    CHECK(base && strcmp(base, "500000.5") == 0);
    attn_safetensors_free(file);
    CHECK_STATUS(attn_model_load(back, saved), ATTN_OK);
    /* and read as its config by the generation loader */
    attn_lm *lm = NULL;
    CHECK_STATUS(attn_lm_load(ctx, saved, NULL, NULL, &lm), ATTN_OK);
    if (lm) {
        c = attn_lm_get_config(lm);
        CHECK(c.rope_base == 500000.5 && c.rope_factor == 8.5 &&
              c.rope_low_freq_factor == 1.5 && c.rope_high_freq_factor == 4.25);
    }
    attn_lm_free(lm);

    attn_model_free(back);
    attn_model_free(m);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    remove(path);
    remove(saved);
    rmdir(dir);
    printf("test_locale: de_DE's comma: JSON configs read and model metadata written with '.'\n");
    return check_summary();
}
