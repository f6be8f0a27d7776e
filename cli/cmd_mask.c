/* cmd_mask.c — attn mask: builds the block map that attn sdpa's mask options
 * (and causal, window) make, and draws it: as text, a character per tile
 * (BlockMask.to_string), with its counts and sparsity, or as a PNG. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "mask_options.h"
#include "outputs.h"
#include "png_write.h"
#include "raster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char mask_help[] =
    "usage: attn mask --q-len T [--kv-len S] [--batch B] [--heads H] [--block-size N]\n"
    "                 [--causal] [--offset N] [--window L,R] [--prefix-lm N]\n"
    "                 [--doc-ids F.npy] [--chunk N] [--mask F.npy]\n"
    "                 [--block-topk F.npy] [--b I] [--h J] [--show] [--png FILE.png]\n"
    "\n"
    "Builds the block map of a mask as 'attn sdpa' does (attn_block_mask_*) and\n"
    "draws the map of sequence I, head J: a line per query block, a character per\n"
    "key block ('#' every element visible, '~' some, '.' none: skipped), then one\n"
    "line with the block size, the full, partial and skipped tiles of the whole\n"
    "map and its sparsity (the percent of tiles skipped).\n"
    "\n"
    "  --q-len T, --kv-len S  the queries and keys (S defaults to T)\n"
    "  --batch B, --heads H   the sequences and heads the map covers (default 1)\n"
    "  --causal        hides key j from query i when j > pos_i\n"
    "  --offset N      pos_i = i + N (default S - T: bottom-right, as attn sdpa)\n"
    "  --window L,R    query i sees keys pos_i - L .. pos_i + R, -1 unbounded\n" CLI_MASK_HELP
    "                  (--causal and --window are ANDed into every map here)\n"
    "  --b I, --h J    the sequence and head drawn (default 0, 0)\n"
    "  --show          print the drawing (the default without --png)\n"
    "  --png FILE.png  write the map as an image (through libpng): a cell per tile,\n"
    "                  full dark, partial grey, skipped white, on a thin grid, under\n"
    "                  a title line with the sizes and the sparsity; cell c =\n"
    "                  clamp(512 / max(QB, KB), 2, 32) pixels, width 16 + max(KB c +\n"
    "                  1, title), height 32 + QB c (docs/cli.md)\n";

static const char *const mask_value_options[] = {
    "--q-len", "--kv-len", "--batch", "--heads", "--offset", "--window",
    "--b",     "--h",      "--png",   CLI_MASK_VALUE_OPTIONS, NULL};

typedef struct mask_cmd_options {
    cli_mask_options map;
    size_t q_len, kv_len, batch, heads, b, h;
    bool kv_given, offset_given, causal, window, show;
    long long offset, window_left, window_right;
    const char *png;
} mask_cmd_options;

static int take_value(mask_cmd_options *o, const char *opt, const char *value) {
    bool taken;
    int rc = cli_mask_take(&o->map, opt, value, &taken);
    if (taken) return rc;
    if (strcmp(opt, "--png") == 0) {
        o->png = value;
    } else if (strcmp(opt, "--window") == 0) {
        o->window = true;
        return cli_parse_window(opt, value, &o->window_left, &o->window_right);
    } else if (strcmp(opt, "--offset") == 0) {
        o->offset_given = true;
        return cli_parse_offset(opt, value, &o->offset);
    } else {
        size_t *n = strcmp(opt, "--q-len") == 0    ? &o->q_len
                    : strcmp(opt, "--kv-len") == 0 ? &o->kv_len
                    : strcmp(opt, "--batch") == 0  ? &o->batch
                    : strcmp(opt, "--heads") == 0  ? &o->heads
                    : strcmp(opt, "--b") == 0      ? &o->b
                                                   : &o->h;
        bool index = n == &o->b || n == &o->h;
        if (!cli_parse_size(value, n) || (!index && *n == 0))
            return cli_usage_error("%s: expected a %s integer, got '%s'", opt,
                                   index ? "non-negative" : "positive", value);
        if (n == &o->kv_len) o->kv_given = true;
    }
    return CLI_OK;
}

static int parse_args(int argc, char **argv, mask_cmd_options *o) {
    *o = (mask_cmd_options){.batch = 1, .heads = 1};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--causal") == 0 || strcmp(argv[i], "--show") == 0) {
            *(strcmp(argv[i], "--causal") == 0 ? &o->causal : &o->show) = true;
            continue;
        }
        const char *value = cli_option_value(argc, argv, &i, mask_value_options);
        if (!value || take_value(o, argv[i - 1], value) != CLI_OK) return CLI_USAGE;
    }
    if (!o->q_len) return cli_usage_error("mask: --q-len is required (try 'attn mask --help')");
    if (!o->kv_given) o->kv_len = o->q_len;
    if (o->offset_given && !o->causal && !o->window && !o->map.chunk_given)
        return cli_usage_error("mask: --offset places the queries for --causal, --window and "
                               "--chunk: give one of them");
    if (o->b >= o->batch)
        return cli_usage_error("--b: sequence %zu is not below --batch %zu", o->b, o->batch);
    if (o->h >= o->heads)
        return cli_usage_error("--h: head %zu is not below --heads %zu", o->h, o->heads);
    if (!o->png) o->show = true;
    return cli_mask_check(&o->map);
}

static int parse_mask(int argc, char **argv) {
    mask_cmd_options o;
    return parse_args(argc, argv, &o);
}

/* ---- the image ------------------------------------------------------------- */

#define MASK_MARGIN 8
#define MASK_TITLE_H (RASTER_CHAR_HEIGHT + 8)

/* The cell of a tile in pixels: the map about 512 pixels across its longer
 * side, a tile never below 2 pixels (one of colour beside the grid line). */
static size_t cell_size(size_t q_blocks, size_t kv_blocks) {
    size_t longer = q_blocks > kv_blocks ? q_blocks : kv_blocks;
    size_t c = 512 / longer;
    return c < 2 ? 2 : c > 32 ? 32 : c;
}

/* drawing: the to_string text, QB lines of KB characters. */
static unsigned char *render_png(const char *drawing, size_t q_blocks, size_t kv_blocks,
                                 const char *title, size_t *width, size_t *height) {
    size_t c = cell_size(q_blocks, kv_blocks);
    size_t grid_w = kv_blocks * c + 1, title_w = raster_text_width(strlen(title), 1);
    *width = 2 * MASK_MARGIN + (grid_w > title_w ? grid_w : title_w);
    *height = 2 * MASK_MARGIN + MASK_TITLE_H + q_blocks * c + 1;
    if (*width > 16384 || *height > 16384) return NULL;
    raster cv = {malloc(*width * *height * 3), *width, *height};
    if (!cv.rgb) return NULL;
    memset(cv.rgb, 255, *width * *height * 3);
    static const unsigned char ink[3] = {0, 0, 0}, full[3] = {40, 40, 40},
                               partial[3] = {150, 150, 150}, grid[3] = {200, 200, 200};
    raster_text(&cv, MASK_MARGIN, MASK_MARGIN, title, strlen(title), 1, false, ink);
    size_t gx = MASK_MARGIN, gy = MASK_MARGIN + MASK_TITLE_H;
    const char *line = drawing;
    for (size_t i = 0; i < q_blocks; i++) {
        for (size_t j = 0; j < kv_blocks; j++) {
            const unsigned char *colour = line[j] == '#' ? full : line[j] == '~' ? partial : NULL;
            if (colour) raster_fill(&cv, gx + j * c, gy + i * c, c, c, colour);
        }
        const char *next = strchr(line, '\n');
        line = next ? next + 1 : line + strlen(line);
    }
    for (size_t j = 0; j <= kv_blocks; j++) raster_fill(&cv, gx + j * c, gy, 1, q_blocks * c + 1, grid);
    for (size_t i = 0; i <= q_blocks; i++) raster_fill(&cv, gx, gy + i * c, kv_blocks * c + 1, 1, grid);
    return cv.rgb;
}

/* The most characters of a text drawing (4096 x 4096 tiles). */
#define MASK_MOST_TEXT ((size_t)1 << 24)

/* The usage error's hint where the drawing is too large: blocks go up to
 * 256, past which only shorter lengths draw. */
static const char *larger_blocks(size_t block) {
    return block < 256 ? "; a larger --block-size (up to 256) draws fewer"
                       : "; shorter --q-len and --kv-len draw them";
}

/* Whether the drawing of q_blocks x kv_blocks tiles can be made, checked
 * before the map is built: building one for lengths of billions would take
 * minutes and gigabytes before the drawing were refused. */
static int drawable(const mask_cmd_options *o, size_t block) {
    size_t q_blocks = o->q_len / block + (o->q_len % block != 0);
    size_t kv_blocks = o->kv_len / block + (o->kv_len % block != 0);
    if (o->png) {
        size_t c = cell_size(q_blocks, kv_blocks);
        if (kv_blocks > (16384 - 2 * MASK_MARGIN - 1) / c ||
            q_blocks > (16384 - 2 * MASK_MARGIN - MASK_TITLE_H - 1) / c)
            return cli_usage_error("--png: --q-len %zu and --kv-len %zu in blocks of %zu are %zu "
                                   "x %zu tiles, past a 16384-pixel image at %zu pixels a tile%s",
                                   o->q_len, o->kv_len, block, q_blocks, kv_blocks, c,
                                   larger_blocks(block));
    }
    if (o->show && (kv_blocks + 1 > MASK_MOST_TEXT || q_blocks > MASK_MOST_TEXT / (kv_blocks + 1)))
        return cli_usage_error("--show: --q-len %zu and --kv-len %zu in blocks of %zu are %zu x "
                               "%zu tiles, past a drawing of %zu characters%s",
                               o->q_len, o->kv_len, block, q_blocks, kv_blocks, MASK_MOST_TEXT,
                               larger_blocks(block));
    return CLI_OK;
}

/* ---- running ---------------------------------------------------------------- */

static int run_mask(int argc, char **argv) {
    mask_cmd_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc != CLI_OK) return rc;
    if (o.png && !cli_png_available()) {
        fputs("attn: mask: PNG output is unavailable: this attn was built without libpng "
              "(install libpng-dev and rebuild); --show works\n",
              stderr);
        return CLI_FAILED;
    }
    if ((rc = drawable(&o, o.map.block_size ? o.map.block_size : 64)) != CLI_OK) return rc;
    attn_ctx *ctx = NULL;
    if ((rc = cli_ctx_new(&(attn_ctx_config){.num_threads = cli_default_threads()}, &ctx)) !=
        CLI_OK)
        return rc;
    cli_outputs out;
    cli_outputs_init(&out, ctx);
    cli_mask_built built = {0};
    attn_mask *all = NULL;
    char *drawing = NULL;
    unsigned char *rgb = NULL;
    size_t png_at = 0;
    if (o.png && (rc = cli_outputs_add(&out, "--png", o.png, &png_at)) != CLI_OK) goto done;
    const char *in_opts[3], *in_paths[3];
    size_t inputs;
    cli_mask_inputs(&o.map, in_opts, in_paths, &inputs);
    for (size_t i = 0; i < inputs; i++)
        if ((rc = cli_outputs_not_input(&out, in_opts[i], in_paths[i])) != CLI_OK) goto done;

    int64_t offset = o.offset_given ? (int64_t)o.offset : (int64_t)o.kv_len - (int64_t)o.q_len;
    cli_mask_geometry g = {.batch = o.batch, .heads = o.heads, .q_len = o.q_len,
                           .kv_len = o.kv_len, .offset = offset, .causal = o.causal,
                           .window = o.window, .window_left = o.window_left,
                           .window_right = o.window_right};
    if ((rc = cli_mask_build(ctx, &o.map, &g, &built)) != CLI_OK) goto done;
    if (!built.map) { /* nothing asked: every key */
        attn_block_mask_config cfg = {.batch = 1, .heads = 1, .q_len = o.q_len,
                                      .kv_len = o.kv_len, .block_q = o.map.block_size,
                                      .block_kv = o.map.block_size};
        if (attn_mask_new_all(ctx, &all) != ATTN_OK ||
            attn_block_mask_from_mask(ctx, &cfg, all, &built.map) != ATTN_OK) {
            rc = cli_library_error(ctx, "mask");
            goto done;
        }
    }
    attn_block_mask_info info;
    size_t needed = 0;
    if (attn_block_mask_get_info(built.map, &info) != ATTN_OK) {
        rc = cli_library_error(ctx, "mask");
        goto done;
    }
    /* a map the same for every sequence (head) holds one: draw that */
    size_t b = o.b < info.config.batch ? o.b : 0, h = o.h < info.config.heads ? o.h : 0;
    if (attn_block_mask_to_string(built.map, b, h, NULL, 0, &needed) != ATTN_OK ||
        !(drawing = malloc(needed)) ||
        attn_block_mask_to_string(built.map, b, h, drawing, needed, NULL) != ATTN_OK) {
        rc = drawing || !needed ? cli_library_error(ctx, "mask")
                                : cli_failure("out of memory for the drawing (%zu bytes)", needed);
        goto done;
    }
    size_t tiles = info.config.batch * info.config.heads * info.q_blocks * info.kv_blocks;
    size_t skipped = tiles - info.full_blocks - info.partial_blocks;
    char title[256];
    snprintf(title, sizeof title, "T %zu x S %zu, block %zux%zu, b %zu h %zu, sparsity %.2f%%",
             o.q_len, o.kv_len, info.config.block_q, info.config.block_kv, o.b, o.h,
             info.sparsity);
    if (o.png) {
        size_t width, height;
        rgb = render_png(drawing, info.q_blocks, info.kv_blocks, title, &width, &height);
        if (!rgb) {
            rc = cli_failure("--png: cannot draw a %zu x %zu image", width, height);
            goto done;
        }
        char err[512], summary[64];
        snprintf(summary, sizeof summary, "%zu x %zu PNG", width, height);
        if (!cli_png_write(ctx, cli_outputs_file(&out, png_at, summary), o.png, rgb, width,
                           height, err, sizeof err)) {
            rc = cli_failure("--png: %s", err);
            goto done;
        }
    }
    if (o.show) {
        fputs(drawing, stdout);
        if (needed > 1 && drawing[needed - 2] != '\n') fputc('\n', stdout);
        printf("block %zux%zu: %zu full, %zu partial, %zu skipped of %zu tiles (map batch %zu, "
               "heads %zu, %zu x %zu blocks), sparsity %.2f%%\n",
               info.config.block_q, info.config.block_kv, info.full_blocks, info.partial_blocks,
               skipped, tiles, info.config.batch, info.config.heads, info.q_blocks,
               info.kv_blocks, info.sparsity);
    }
    /* the PNG in place once the drawing is out (cli_outputs_commit checks
     * stdout): a command whose printing failed leaves no file new or changed */
    if (o.png) rc = cli_outputs_commit(&out, false);
done:
    cli_outputs_free(&out);
    free(rgb);
    free(drawing);
    attn_mask_free(all);
    cli_mask_built_free(&built);
    attn_ctx_free(ctx);
    return rc;
}

const cli_command cli_mask_command = {
    .name = "mask",
    .summary = "a block map of masks (causal, documents, top-k...) drawn or as PNG",
    .help = mask_help,
    .value_options = mask_value_options,
    .parse = parse_mask,
    .run = run_mask,
};
