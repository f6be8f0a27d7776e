/*
 * cmd_heatmap.c — attn heatmap: the attention weights of one forward pass,
 * drawn as a PNG (through libpng) or in the terminal (24-bit colour).
 *
 * The weights are those the module traces as "attn_weights", (B, H, T, T)
 * per attention call (the wrapper's heads each trace their own), joined
 * along the head axis; batch element --batch is drawn. Text input is split
 * on whitespace and embedded as documented in the help below.
 */
#include "cli.h"
#include "heatmap_render.h"
#include "module_options.h"
#include "outputs.h"
#include "png_write.h"
#include "weights.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char heatmap_help_head[] =
    "usage: attn heatmap --module simple|sa1|sa2|causal|mha-wrapper|mha|gpt2|\n"
    "                             gqa|mla|swa\n"
    "                    (--input x.npy | --text \"...\") [--head N | --all-heads]\n"
    "                    (--output weights.png | --terminal) [--batch N]\n"
    "                    [--save-weights w.npy] [module options as for forward]\n"
    "                    [--weights FILE.safetensors [--layer N]]\n"
    "\n"
    "Draws the attention weights of one forward pass: one panel per head (all\n"
    "heads unless --head N), row i the weights query i gives to every key, a\n"
    "colour scale from the smallest to the largest weight drawn, token labels on\n"
    "both axes (positions for .npy input), and the masked future of causal\n"
    "modules hatched in grey. --output writes a PNG (through libpng; docs/cli.md\n"
    "gives its size), --terminal prints the same with 24-bit ANSI colours.\n"
    "  --text T     whitespace-separated words. When every word is one of the\n"
    "               seeds' sentence \"Your journey starts with one step\" (any case)\n"
    "               and --d-in is 3 or not given, the seeds' 3-d embeddings are\n"
    "               used; otherwise word w's embedding is torch.randn(d_in) after\n"
    "               torch.manual_seed(FNV-1a-64(w)), the same vector wherever w\n"
    "               appears (--d-in default 16)\n"
    "  --batch N    which batch element of an (B, T, d_in) input to draw (default 0)\n"
    "  --head N     draw head N only\n"
    "  --save-weights F  also write the drawn weights, (panels, T, T), as .npy\n"
    "  --seed S     the module's weights: torch.manual_seed(S) (default 123)\n";

/* The seeds' inputs for "Your journey starts with one step" (section 3.3). */
static const char *const seed_words[6] = {"your", "journey", "starts", "with", "one", "step"};
static const float seed_embeddings[6][3] = {{0.43f, 0.15f, 0.89f}, {0.55f, 0.87f, 0.66f},
                                            {0.57f, 0.85f, 0.64f}, {0.22f, 0.58f, 0.33f},
                                            {0.77f, 0.25f, 0.10f}, {0.05f, 0.80f, 0.55f}};

typedef struct heatmap_options {
    const char *text, *output, *save_weights;
    size_t head, batch;
    bool have_head, all_heads, terminal;
    cli_weights_options weights;
} heatmap_options;

static int take_option(void *user, const char *opt, const char *value) {
    heatmap_options *h = user;
    int taken = cli_weights_option(opt, value, &h->weights);
    if (taken) return taken == CLI_USAGE ? CLI_USAGE : CLI_OK;
    if (strcmp(opt, "--all-heads") == 0) h->all_heads = true;
    else if (strcmp(opt, "--terminal") == 0) h->terminal = true;
    else if (strcmp(opt, "--text") == 0) h->text = value;
    else if (strcmp(opt, "--output") == 0) h->output = value;
    else if (strcmp(opt, "--save-weights") == 0) h->save_weights = value;
    else {
        size_t *target = strcmp(opt, "--head") == 0 ? &h->head : &h->batch;
        if (!cli_parse_size(value, target))
            return cli_usage_error("%s: expected a non-negative integer, got '%s'", opt, value);
        if (target == &h->head) h->have_head = true;
    }
    return CLI_OK;
}

/* ---- the traced weights -------------------------------------------------- */

typedef struct collected {
    float *data;       /* per trace: (B, H, T, T), appended */
    size_t floats, capacity;
    size_t batch, tokens, heads; /* heads summed over traces */
    size_t *trace_heads;         /* H of each trace */
    size_t traces, trace_capacity;
    bool failed;       /* out of memory, or inconsistent shapes */
} collected;

static void on_trace(void *user, const char *module, const char *name, size_t ndim,
                     const size_t *shape, const float *data) {
    (void)module;
    collected *c = user;
    if (c->failed || strcmp(name, "attn_weights") != 0 || ndim != 4 || !data) return;
    size_t B = shape[0], H = shape[1], T = shape[2];
    if (shape[3] != T || (c->traces && (B != c->batch || T != c->tokens))) {
        c->failed = true;
        return;
    }
    size_t n = B * H * T * T; /* the forward has checked these sizes */
    if (c->floats + n > c->capacity) {
        size_t cap = c->capacity ? c->capacity : 1024;
        while (cap < c->floats + n) cap *= 2;
        float *grown = realloc(c->data, cap * sizeof *grown);
        if (!grown) {
            c->failed = true;
            return;
        }
        c->data = grown;
        c->capacity = cap;
    }
    if (c->traces == c->trace_capacity) {
        size_t cap = c->trace_capacity ? 2 * c->trace_capacity : 8;
        size_t *grown = realloc(c->trace_heads, cap * sizeof *grown);
        if (!grown) {
            c->failed = true;
            return;
        }
        c->trace_heads = grown;
        c->trace_capacity = cap;
    }
    memcpy(c->data + c->floats, data, n * sizeof *data);
    c->floats += n;
    c->trace_heads[c->traces++] = H;
    c->batch = B;
    c->tokens = T;
    c->heads += H;
}

/* ---- text input ---------------------------------------------------------- */

typedef struct words {
    char **items;
    size_t count;
} words;

static void free_words(words *w) {
    for (size_t i = 0; i < w->count; i++) free(w->items[i]);
    free(w->items);
    *w = (words){0};
}

static bool split_words(const char *text, words *out) {
    *out = (words){0};
    size_t cap = 0;
    for (const char *p = text; *p;) {
        while (*p && isspace((unsigned char)*p)) p++;
        const char *start = p;
        while (*p && !isspace((unsigned char)*p)) p++;
        if (p == start) break;
        if (out->count == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(out->items, cap * sizeof *grown);
            if (!grown) return false;
            out->items = grown;
        }
        size_t n = (size_t)(p - start);
        char *word = malloc(n + 1);
        if (!word) return false;
        memcpy(word, start, n);
        word[n] = '\0';
        out->items[out->count++] = word;
    }
    return true;
}

static int seed_word_index(const char *word) {
    for (int k = 0; k < 6; k++) {
        const char *a = word, *b = seed_words[k];
        while (*a && *b && tolower((unsigned char)*a) == *b) a++, b++;
        if (!*a && !*b) return k;
    }
    return -1;
}

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3u;
    return h;
}

/* x (T, d_in) for the words; *d_in is 0 when not given. */
static int embed_words(attn_ctx *ctx, const words *w, size_t *d_in, float **x) {
    bool seeds = *d_in == 0 || *d_in == 3;
    for (size_t i = 0; i < w->count && seeds; i++) seeds = seed_word_index(w->items[i]) >= 0;
    if (*d_in == 0) *d_in = seeds ? 3 : 16;
    if (w->count > (size_t)-1 / sizeof(float) / *d_in)
        return cli_usage_error("--text: %zu words of width %zu are too many", w->count, *d_in);
    *x = calloc(w->count * *d_in, sizeof **x);
    if (!*x) return cli_usage_error("--text: out of memory for %zu words", w->count);
    attn_rng *rng = NULL;
    if (!seeds && attn_rng_new(ctx, 0, &rng) != ATTN_OK) return cli_library_error(ctx, "--text");
    for (size_t i = 0; i < w->count; i++) {
        float *row = *x + i * *d_in;
        if (seeds) {
            memcpy(row, seed_embeddings[seed_word_index(w->items[i])], 3 * sizeof *row);
        } else if (attn_rng_manual_seed(rng, fnv1a64(w->items[i])) != ATTN_OK ||
                   attn_rng_randn(rng, row, *d_in) != ATTN_OK) {
            attn_rng_free(rng);
            return cli_library_error(ctx, "--text");
        }
    }
    attn_rng_free(rng);
    return CLI_OK;
}

/* ---- the command --------------------------------------------------------- */

static bool is_causal(const cli_module_options *m) {
    attn_module_kind kind;
    if (!cli_module_kind(m->module, &kind)) return false;
    bool masked = kind == ATTN_MODULE_CAUSAL || kind == ATTN_MODULE_MHA_WRAPPER ||
                  kind == ATTN_MODULE_MHA;
    /* GPT-2 and the book's chapter-4 modules always mask the future with -inf */
    bool always = kind == ATTN_MODULE_GPT2 || kind == ATTN_MODULE_GQA ||
                  kind == ATTN_MODULE_MLA || kind == ATTN_MODULE_SWA;
    return always || (masked && m->mask != ATTN_MASK_NONE);
}

static void print_more_help(FILE *out) {
    fputs(cli_run_options_help, out);
    fputs(cli_weights_help, out);
}

static const char *const heatmap_value_options[] = {CLI_RUN_VALUE_OPTIONS, "--text", "--output",
                                                    "--head", "--batch", "--save-weights",
                                                    "--weights", "--layer", NULL};

typedef struct heatmap_args {
    cli_run_options o;
    heatmap_options h;
} heatmap_args;

static int parse_args(int argc, char **argv, heatmap_args *a) {
    *a = (heatmap_args){.o = cli_run_defaults()};
    cli_run_options *o = &a->o;
    heatmap_options *h = &a->h;
    static const char *const own[] = {"--text",  "--output", "--head",    "--batch",
                                      "--save-weights", "--weights", "--layer", NULL};
    static const char *const flags[] = {"--all-heads", "--terminal", NULL};
    cli_extra_options extra = {.options = own, .flags = flags, .take = take_option, .user = h};
    if (cli_parse_run_options(argc, argv, o, &extra) != CLI_OK) return CLI_USAGE;
    for (int i = 1; i < argc; i++)
        h->weights.have_heads = h->weights.have_heads || strcmp(argv[i], "--heads") == 0;
    if (!o->module.module)
        return cli_usage_error("heatmap: --module is required (try 'attn heatmap --help')");
    if (!o->input == !h->text)
        return cli_usage_error("heatmap: give exactly one of --input and --text");
    if (!h->output && !h->terminal)
        return cli_usage_error("heatmap: give --output FILE.png, --terminal, or both");
    if (h->have_head && h->all_heads)
        return cli_usage_error("heatmap: --head and --all-heads exclude each other");
    if (cli_weights_check(&h->weights, o->module.module) != CLI_OK) return CLI_USAGE;
    return CLI_OK;
}

static int parse_heatmap(int argc, char **argv) {
    heatmap_args a;
    return parse_args(argc, argv, &a);
}

static int run_heatmap(int argc, char **argv) {
    heatmap_args a;
    int parsed = parse_args(argc, argv, &a);
    if (parsed != CLI_OK) return parsed;
    cli_run_options o = a.o;
    heatmap_options h = a.h;
    if (h.output && !cli_png_available()) {
        fputs("attn: heatmap: PNG output is unavailable: this attn was built without libpng "
              "(install libpng-dev and rebuild); --terminal works\n", stderr);
        return CLI_FAILED;
    }

    collected col = {0};
    attn_ctx *ctx = NULL;
    attn_rng *rng = NULL;
    attn_module *m = NULL;
    attn_npy x = {0};
    words w = {0};
    float *text_x = NULL, *y = NULL, *panels = NULL;
    size_t *heads = NULL;
    char **labels = NULL;
    unsigned char *rgb = NULL;
    int rc = CLI_OK;
    if ((rc = cli_ctx_new(&(attn_ctx_config){.num_threads = o.threads, .trace = on_trace,
                                             .trace_user = &col},
                          &ctx)) != CLI_OK)
        return rc;
    cli_outputs out;
    cli_outputs_init(&out, ctx);
    size_t png_at = 0, weights_at = 0;
    if ((h.save_weights &&
         (rc = cli_outputs_add(&out, "--save-weights", h.save_weights, &weights_at)) != CLI_OK) ||
        (h.output && (rc = cli_outputs_add(&out, "--output", h.output, &png_at)) != CLI_OK) ||
        (rc = cli_outputs_not_input(&out, "--input", o.input)) != CLI_OK ||
        (rc = cli_outputs_not_input(&out, "--weights", h.weights.path)) != CLI_OK)
        goto done;

    const float *xdata;
    size_t batch, tokens, width;
    if (h.text) {
        if (!split_words(h.text, &w)) {
            rc = cli_usage_error("--text: out of memory");
            goto done;
        }
        if (w.count == 0) {
            rc = cli_usage_error("--text: no words in '%s'", h.text);
            goto done;
        }
        width = o.module.d_in;
        if ((rc = embed_words(ctx, &w, &width, &text_x)) != CLI_OK) goto done;
        xdata = text_x;
        batch = 1;
        tokens = w.count;
    } else {
        if (attn_npy_read(ctx, o.input, &x) != ATTN_OK) {
            rc = cli_library_error(ctx, "--input");
            goto done;
        }
        if (x.ndim != 2 && x.ndim != 3) {
            rc = cli_usage_error("--input: expected shape (B, T, d_in) or (T, d_in), got %zu "
                                 "dimensions", x.ndim);
            goto done;
        }
        batch = x.ndim == 3 ? x.shape[0] : 1;
        tokens = x.shape[x.ndim - 2];
        width = x.shape[x.ndim - 1];
        xdata = x.data;
        if (batch == 0 || tokens == 0) {
            rc = cli_usage_error("--input: empty shape (batch %zu, tokens %zu)", batch, tokens);
            goto done;
        }
    }
    if (h.batch >= batch) {
        rc = cli_usage_error("--batch: %zu is out of range: the input has %zu batch element%s",
                             h.batch, batch, batch == 1 ? "" : "s");
        goto done;
    }
    if ((rc = cli_module_resolve(&o.module, width, tokens)) != CLI_OK) goto done;
    if (attn_rng_new(ctx, o.seed, &rng) != ATTN_OK ||
        attn_rng_set_bernoulli_method(rng, o.bernoulli) != ATTN_OK ||
        cli_build_module(ctx, rng, &o.module, &m) != ATTN_OK) {
        rc = cli_library_error(ctx, o.module.module);
        goto done;
    }
    if ((rc = cli_load_weights(ctx, m, o.module.module, &h.weights)) != CLI_OK) goto done;
    if (attn_module_set_training(m, o.train) != ATTN_OK ||
        attn_module_set_grad_enabled(m, false) != ATTN_OK) {
        rc = cli_library_error(ctx, o.module.module);
        goto done;
    }
    y = calloc(batch * tokens, attn_module_d_out(m) * sizeof *y);
    if (!y) {
        rc = cli_usage_error("out of memory for the output");
        goto done;
    }
    if (attn_module_forward(m, xdata, batch, tokens, y, rng) != ATTN_OK) {
        rc = cli_library_error(ctx, "forward");
        goto done;
    }
    if (col.failed || col.heads == 0) {
        rc = cli_usage_error(col.failed ? "heatmap: out of memory for the attention weights"
                                        : "heatmap: the module traced no attention weights");
        goto done;
    }

    /* Batch element h.batch of every traced head, in order. */
    size_t T = col.tokens, first = 0, count = col.heads;
    if (h.have_head) {
        if (h.head >= col.heads) {
            rc = cli_usage_error("--head: %zu is out of range: the module has %zu head%s", h.head,
                                 col.heads, col.heads == 1 ? "" : "s");
            goto done;
        }
        first = h.head;
        count = 1;
    }
    panels = malloc(count * T * T * sizeof *panels);
    heads = malloc(count * sizeof *heads);
    labels = calloc(T, sizeof *labels);
    if (!panels || !heads || !labels) {
        rc = cli_usage_error("out of memory for %zu panels", count);
        goto done;
    }
    size_t head = 0, offset = 0;
    for (size_t t = 0; t < col.traces; t++) {
        size_t H = col.trace_heads[t];
        for (size_t k = 0; k < H; k++, head++)
            if (head >= first && head < first + count) {
                memcpy(panels + (head - first) * T * T,
                       col.data + offset + ((h.batch * H) + k) * T * T, T * T * sizeof *panels);
                heads[head - first] = head;
            }
        offset += col.batch * H * T * T;
    }
    for (size_t i = 0; i < T; i++) {
        char number[24];
        snprintf(number, sizeof number, "%zu", i);
        const char *text = h.text ? w.items[i] : number;
        labels[i] = malloc(strlen(text) + 1);
        if (!labels[i]) {
            rc = cli_usage_error("out of memory for the labels");
            goto done;
        }
        strcpy(labels[i], text);
    }
    char title[160];
    snprintf(title, sizeof title, "%s, batch %zu, %s mode", attn_module_class_name(m), h.batch,
             o.train ? "train" : "eval");
    hm_spec spec = {.panels = count, .tokens = T, .weights = panels, .heads = heads,
                    .labels = (const char *const *)labels, .causal = is_causal(&o.module),
                    .title = title};
    if (h.save_weights) {
        size_t shape[3] = {count, T, T};
        if ((rc = cli_outputs_npy(&out, weights_at, panels, 3, shape)) != CLI_OK) goto done;
    }
    if (h.terminal && !hm_print_terminal(stdout, &spec)) {
        rc = CLI_FAILED; /* the one line saying so is cli_finish's */
        goto done;
    }
    hm_layout layout = {0};
    if (h.output) {
        if (!hm_compute_layout(&spec, &layout)) {
            rc = cli_usage_error("heatmap: %zu panels of %zu tokens make too large an image",
                                 count, T);
            goto done;
        }
        rgb = malloc(layout.width * layout.height * 3);
        if (!rgb) {
            rc = cli_usage_error("out of memory for a %zu x %zu image", layout.width,
                                 layout.height);
            goto done;
        }
        hm_render(&spec, &layout, rgb);
        char err[512], summary[64];
        snprintf(summary, sizeof summary, "%zu x %zu PNG", layout.width, layout.height);
        if (!cli_png_write(ctx, cli_outputs_file(&out, png_at, summary), h.output, rgb,
                           layout.width, layout.height, err, sizeof err)) {
            rc = cli_failure("--output: %s", err);
            goto done;
        }
    }
    /* The report below says the files are written: they are complete first,
     * and go in place once it is out, with everything printed. */
    if ((rc = cli_outputs_close(&out)) != CLI_OK) goto done;
    if (h.output && !h.terminal)
        printf("wrote %s: %zu panel%s, %zu x %zu pixels, cell %zu, colour scale %.4f to %.4f\n",
               h.output, count, count == 1 ? "" : "s", layout.width, layout.height, layout.cell,
               (double)layout.vmin, (double)layout.vmax);
    rc = cli_outputs_commit(&out, true);
done:
    cli_outputs_free(&out);
    for (size_t i = 0; labels && i < col.tokens; i++) free(labels[i]);
    free(labels);
    free(heads);
    free(panels);
    free(rgb);
    free(y);
    free(text_x);
    free_words(&w);
    free(col.data);
    free(col.trace_heads);
    attn_module_free(m);
    attn_rng_free(rng);
    attn_npy_free(&x);
    attn_ctx_free(ctx);
    return rc;
}

const cli_command cli_heatmap_command = {
    .name = "heatmap",
    .summary = "attention weights as a PNG heat map or in the terminal",
    .help = heatmap_help_head,
    .more_help = print_more_help,
    .value_options = heatmap_value_options,
    .parse = parse_heatmap,
    .run = run_heatmap,
};
