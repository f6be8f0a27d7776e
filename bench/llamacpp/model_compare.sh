#!/usr/bin/env bash
# Whole-model generation, attn generate against llama.cpp's llama-bench, on
# the same random Llama-3-shaped weights (make_model.py: hidden 2048, 32/8
# heads, head_dim 64, intermediate 8192, vocab 32000, 8 layers), saved by
# transformers and converted by the vendored convert_hf_to_gguf.py to f32
# and f16 GGUF (convert_random.py).
#
#   bench/llamacpp/build.sh && bench/llamacpp/model_compare.sh
#   DEPTHS="0 4096" THREADS="1 2" REPS=3 bench/llamacpp/model_compare.sh
#
# 1. Greedy ids: attn generate and llama_greedy (llama.h) on the same
#    prompt ids must print the same new ids from the f32 weights (the
#    script stops otherwise); the f16 GGUF's ids are printed beside them.
# 2. Speed, per thread count and weight type, the sides alternating:
#    decode tok/s at each depth d (llama-bench -n NGEN -d d -r REPS: the
#    median of its samples; attn: one run with a prompt of max(d,1) ids,
#    then REPS blocks of NGEN tokens timed as they stream, attn_tokens.py:
#    their median) and prefill tok/s of PP tokens (llama-bench -p PP; attn:
#    PP ids and one new token, PP / (prefill + first token), REPS runs).
#    llama.cpp runs flash attention (-fa 1) with an f16 KV cache (llama-bench
#    takes no f32 cache type); attn reads the f32 safetensors and holds them
#    as the row's type: f32 weights and cache in the f32 rows, f16 weights
#    (--weights-dtype f16) and an f16 cache (--kv-dtype f16) in the f16 rows,
#    float32 accumulation in both. TYPES may add bf16: a bf16 GGUF for
#    llama.cpp, and for attn bf16 weights, cache and products
#    (--matmul-dtype bf16: the activations rounded to bf16 as llama.cpp
#    rounds them to its weights' type); with f16 in TYPES too, a last table
#    sets attn's bf16 rows beside llama.cpp's f16 ones.
# Writes bench/results/llamacpp-model-<llama.cpp commit>-attn-<attn commit>-<machine>.txt (RESULTS=-:
# stdout only).
set -euo pipefail
source "$(dirname "$0")/common.sh"
need_build
build_attn

DEPTHS=${DEPTHS:-0 4096 16384}
THREADS=${THREADS:-1 2}
TYPES=${TYPES:-f32 f16 bf16}
REPS=${REPS:-5}
NGEN=${NGEN:-32}
PP=${PP:-512}
CHECK_NEW=${CHECK_NEW:-16}
MODEL=${MODEL_DIR:-$OUTDIR/model}
BENCH=$LC_BIN/llama-bench
ATTN=$ROOT/build/attn
[ -x "$BENCH" ] || die "no $BENCH (bench/llamacpp/build.sh builds it)"
[ -x "$ATTN" ] || die "no $ATTN (make build)"

# Python with torch, transformers and safetensors: the repo's .venv when it
# has them, else a venv under build/llamacpp/ with pinned versions.
PY=${PYTHON:-$ROOT/.venv/bin/python}
if ! "$PY" -c 'import torch, transformers, safetensors, numpy, yaml, tqdm' 2>/dev/null; then
  PY=$OUTDIR/venv/bin/python
  if ! "$PY" -c 'import torch, transformers, safetensors' 2>/dev/null; then
    echo "== making $OUTDIR/venv (torch, transformers, safetensors pinned)" >&2
    python3 -m venv "$OUTDIR/venv"
    "$PY" -m pip install -q torch==2.5.1 transformers==4.46.3 safetensors==0.4.5 \
      numpy==1.26.4 pyyaml==6.0.2 tqdm==4.67.1 sentencepiece==0.2.0 ||
      die "pip could not install the model's Python packages into $OUTDIR/venv"
  fi
fi

# 1. The weights, made once.
if [ ! -f "$MODEL/hf/model.safetensors" ]; then
  echo "== make_model.py $MODEL/hf" >&2
  "$PY" "$ROOT/bench/llamacpp/make_model.py" "$MODEL/hf" >&2
fi
for t in $TYPES; do
  if [ ! -f "$MODEL/$t.gguf" ]; then
    echo "== convert_hf_to_gguf.py --outtype $t" >&2
    "$PY" "$ROOT/bench/llamacpp/convert_random.py" "$LC_SRC" "$MODEL/hf" \
      --outfile "$MODEL/$t.gguf.part" --outtype "$t" >"$MODEL/convert-$t.log" 2>&1 ||
      { tail -20 "$MODEL/convert-$t.log"; die "conversion to $t failed"; }
    mv "$MODEL/$t.gguf.part" "$MODEL/$t.gguf"
  fi
done

ids() { # n -> n token ids, comma separated, the same on every run
  awk -v n="$1" 'BEGIN{s=12345; for(i=0;i<n;i++){s=(s*1103515245+12345)%2147483648; printf "%s%d", (i?",":""), 3+s%31997}}'
}

RESULTS=${RESULTS:-$(results_name llamacpp-model)}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s)

# 2. Greedy ids.
prompt=$(ids 16)
tmax=$(echo $THREADS | tr ' ' '\n' | sort -n | tail -1)
attn_ids=$("$ATTN" generate --weights "$MODEL/hf" --prompt-ids "$prompt" \
           --max-new-tokens "$CHECK_NEW" --threads "$tmax" | tail -1)
{
  echo "greedy ids, prompt $prompt:"
  echo "  attn generate (f32 safetensors): $attn_ids"
  for t in $TYPES; do
    l=$("$HB/llama_greedy" --model "$MODEL/$t.gguf" --prompt-ids "$prompt" \
        --max-new-tokens "$CHECK_NEW" --threads "$tmax")
    same=$([ "$l" = "$attn_ids" ] && echo same || echo DIFFERENT)
    echo "  llama.cpp ($t GGUF):              $l ($same)"
    [ "$t" != f32 ] || [ "$same" = same ] || echo "f32 MISMATCH" >"$work/mismatch"
  done
} | tee "$work/greedy" >&2
[ ! -f "$work/mismatch" ] || [ "${ALLOW_MISMATCH:-0}" = 1 ] ||
  die "attn and llama.cpp disagree on the f32 greedy ids: speeds of different computations are not compared (ALLOW_MISMATCH=1 to go on)"

# 3. Speeds. llama-bench: one call per (type, threads), REPS repetitions, its
# samples' median; attn: REPS runs per test. The side that goes first flips
# from one configuration to the next.
llama_run() { # type T -> lines "pp|tg depth tok/s(median)"
  local t=$1 T=$2 d
  d=$(echo $DEPTHS | tr ' ' ',')
  # Two calls, so that the prefill is timed from an empty cache only.
  { "$BENCH" -m "$MODEL/$t.gguf" -t "$T" -p "$PP" -n 0 -r "$REPS" -fa 1 \
      -ctk f16 -ctv f16 -o jsonl 2>"$work/llama-bench.err" &&
    "$BENCH" -m "$MODEL/$t.gguf" -t "$T" -p 0 -n "$NGEN" -d "$d" -r "$REPS" -fa 1 \
      -ctk f16 -ctv f16 -o jsonl 2>>"$work/llama-bench.err"; } |
    "$PY" -c '
import json, statistics, sys
for line in sys.stdin:
    if not line.strip().startswith("{"): continue
    r = json.loads(line)
    kind = "pp" if r["n_prompt"] > 0 else "tg"
    print(kind, r["n_depth"], "%.3f" % statistics.median(r["samples_ts"]))
' || { cat "$work/llama-bench.err" >&2; die "llama-bench failed ($t, $T threads)"; }
}
attn_run() { # type T -> lines "pp|tg depth tok/s(median)"
  local t=$1 T=$2 d n s
  local opts=(--weights-dtype "$t" --kv-dtype "$t")
  # bf16: the products on bf16 inputs as well (the CPU's bf16 instructions)
  [ "$t" != bf16 ] || opts+=(--matmul-dtype bf16)
  # One run per depth: the prompt is prefilled once, then REPS blocks of NGEN
  # tokens are timed as they stream (attn_tokens.py).
  for d in $DEPTHS; do
    n=$d; [ "$n" -gt 0 ] || n=1
    "$PY" "$ROOT/bench/llamacpp/attn_tokens.py" --blocks "$REPS" --block "$NGEN" -- \
      "$ATTN" generate --weights "$MODEL/hf" "${opts[@]}" --prompt-ids "$(ids "$n")" \
      --threads "$T" --stream |
      sed -n "s/^tg tok_s=\([0-9.]*\).*/tg $d \1/p"
  done
  for ((r = 0; r < REPS; r++)); do
    s=$("$ATTN" generate --weights "$MODEL/hf" "${opts[@]}" --prompt-ids "$(ids "$PP")" \
        --max-new-tokens 1 --threads "$T" --stats 2>&1 >/dev/null |
        sed -n 's/.*prefill + first token \([0-9.]*\) ms.*/\1/p')
    awk -v ms="$s" -v n="$PP" 'BEGIN{printf "%.3f\n", n / ms * 1e3}'
  done | median | sed 's/^/pp 0 /'
}

i=0
for T in $THREADS; do
  for t in $TYPES; do
    if ((i % 2)); then echo "  attn $t, $T threads ..." >&2; attn_run "$t" "$T" >"$work/attn-$t-$T"; fi
    echo "  llama.cpp $t, $T threads ..." >&2
    llama_run "$t" "$T" >"$work/llama-$t-$T"
    if ! ((i % 2)); then echo "  attn $t, $T threads ..." >&2; attn_run "$t" "$T" >"$work/attn-$t-$T"; fi
    i=$((i + 1))
  done
done
secs=$(( $(date +%s) - start ))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

get() { awk -v k="$2" -v d="$3" '$1==k && $2==d {print $3}' "$1"; }
{
  echo "\$ DEPTHS=\"$DEPTHS\" THREADS=\"$THREADS\" TYPES=\"$TYPES\" REPS=$REPS NGEN=$NGEN PP=$PP bench/llamacpp/model_compare.sh"
  machine_lines
  echo "llama-bench: llama-bench -m <type>.gguf -t T -p $PP -n 0 -r $REPS -fa 1 -ctk f16 -ctv f16 -o jsonl, then -p 0 -n $NGEN -d $(echo $DEPTHS | tr ' ' ',')"
  echo "model: $(cat "$MODEL/hf/config.json" | "$PY" -c 'import json,sys; c=json.load(sys.stdin); print("LlamaForCausalLM hidden %d, heads %d/%d, head_dim %d, intermediate %d, vocab %d, %d layers, random weights (make_model.py, seed 0)" % (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"]//c["num_attention_heads"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]))')"
  echo "load average before: $load_before; after: $load_after; $secs s; the machine is shared: other work may have run at the same time"
  echo
  cat "$work/greedy"
  echo
  echo "tok/s, medians of $REPS (llama-bench: its $REPS samples; attn: $REPS blocks of one run, or $REPS runs for pp); x = attn / llama.cpp (above 1: attn faster)"
  echo "  tg@d: $NGEN new tokens after a context of d tokens (attn: a prompt of max(d,1) ids, then $REPS blocks of $NGEN tokens after the first new one)"
  echo "  pp: a prompt of $PP tokens from an empty cache (attn: prefill + first token)"
  echo "  llama.cpp: weights of the GGUF type, KV cache f16; attn: weights and KV cache of the row's type (--weights-dtype, --kv-dtype)"
  printf "%-8s %3s %-5s | %12s %12s %6s\n" test thr type llama.cpp attn x
  for T in $THREADS; do for t in $TYPES; do
    for d in $DEPTHS; do
      l=$(get "$work/llama-$t-$T" tg "$d"); a=$(get "$work/attn-$t-$T" tg "$d")
      x=$(awk -v a="${a:-0}" -v l="${l:-0}" 'BEGIN{if (a>0 && l>0) printf "%.2f", a/l; else print "-"}')
      printf "%-8s %3s %-5s | %12s %12s %6s\n" "tg@$d" "$T" "$t" "${l:--}" "${a:--}" "$x"
    done
    l=$(get "$work/llama-$t-$T" pp 0); a=$(get "$work/attn-$t-$T" pp 0)
    x=$(awk -v a="${a:-0}" -v l="${l:-0}" 'BEGIN{if (a>0 && l>0) printf "%.2f", a/l; else print "-"}')
    printf "%-8s %3s %-5s | %12s %12s %6s\n" "pp$PP" "$T" "$t" "${l:--}" "${a:--}" "$x"
  done; done
  # the issue's comparison: attn's bf16 row against llama.cpp's f16
  if [[ " $TYPES " == *" bf16 "* && " $TYPES " == *" f16 "* ]]; then
    echo
    echo "attn bf16 (weights, cache and products) against llama.cpp f16:"
    printf "%-8s %3s | %12s %12s %6s\n" test thr "llama f16" "attn bf16" x
    for T in $THREADS; do
      for d in $DEPTHS pp; do
        if [ "$d" = pp ]; then k=pp; dd=0; name=pp$PP; else k=tg; dd=$d; name=tg@$d; fi
        l=$(get "$work/llama-f16-$T" "$k" "$dd"); a=$(get "$work/attn-bf16-$T" "$k" "$dd")
        x=$(awk -v a="${a:-0}" -v l="${l:-0}" 'BEGIN{if (a>0 && l>0) printf "%.2f", a/l; else print "-"}')
        printf "%-8s %3s | %12s %12s %6s\n" "$name" "$T" "${l:--}" "${a:--}" "$x"
      done
    done
  fi
} >"$work/table"
cat "$work/table"
if [ "$RESULTS" != - ]; then
  mkdir -p "$(dirname "$RESULTS")"
  cp "$work/table" "$RESULTS"
  echo "written: ${RESULTS#$ROOT/}" >&2
fi
