#!/bin/sh
# Regenerates the heat maps in docs/images/ with the built attn (and, with
# ATTN_IMAGES_PRETRAIN=1, the loss plot of the book's pretraining run):
#   sh docs/make-images.sh [path/to/attn]     (default build/attn)
set -eu
attn=${1:-build/attn}
out=$(dirname "$0")/images
# The seeds' MultiHeadAttention(3, 4, 6, 0.0, num_heads=2) on their sentence.
"$attn" heatmap --module mha --heads 2 --d-out 4 --seed 123 \
  --text "Your journey starts with one step" --all-heads --output "$out/heatmap-seeds-mha.png"
# GPT-2's fused attention (n_embd 32, 4 heads) on 13 words, per-word embeddings.
"$attn" heatmap --module gpt2 --heads 4 --d-in 32 --seed 7 \
  --text "the quick brown fox jumps over the lazy dog while the cat sleeps" \
  --all-heads --output "$out/heatmap-gpt2-4heads.png"
# SelfAttention_v2 (no mask) on the seeds' sentence, in the terminal.
"$attn" heatmap --module sa2 --d-out 2 --text "Your journey starts with one step" --terminal
# The book's chapter-5 run (GPT-2 124M, 10 epochs: minutes) and its figure 5.12.
if [ "${ATTN_IMAGES_PRETRAIN:-0}" = 1 ]; then
  "$attn" pretrain --text "$(dirname "$0")/../data/the-verdict.txt" \
    --tokenizer "$(dirname "$0")/../data/gpt2-bpe" --plot "$out/pretrain-losses.png" >/dev/null
fi
