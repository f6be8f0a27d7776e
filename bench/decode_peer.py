"""The peer of `attn-bench --section decode`'s kernel rows: PyTorch's
F.scaled_dot_product_attention for one decode step against a cache of
length L, batch 1, 32 query heads over 8 KV heads, head_dim 128, float32:
q (1, 32, 1, 128) against k, v (1, 8, L, 128) from a preallocated cache (a
view of its first L positions, as the book's optimized KV cache slices
it), with enable_gqa=True where this PyTorch has it, else k and v
repeat_interleave'd to 32 heads inside the timed step (as the book's GQA
does).

  python bench/decode_peer.py --threads 1,2 --lengths 4096,16384 --runs 5

prints one line per case:
  decode_peer threads=N L=L ms=M   (median of --runs steps after a warm-up)
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def has_enable_gqa():
    q = torch.zeros(1, 4, 1, 8)
    kv = torch.zeros(1, 2, 3, 8)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--lengths", default="4096,16384,65536")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    gqa = has_enable_gqa()
    print("decode_peer torch=%s sdpa %s" % (torch.__version__,
          "enable_gqa=True" if gqa else "after repeat_interleave"), flush=True)
    torch.manual_seed(0)
    with torch.no_grad():
        for L in [int(x) for x in args.lengths.split(",")]:
            cache_k = torch.rand(1, KV_HEADS, L + 1, HEAD_DIM) * 2 - 1
            cache_v = torch.rand(1, KV_HEADS, L + 1, HEAD_DIM) * 2 - 1
            q = torch.rand(1, Q_HEADS, 1, HEAD_DIM) * 2 - 1
            k, v = cache_k[:, :, :L], cache_v[:, :, :L]

            def step():
                if gqa:
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                g = Q_HEADS // KV_HEADS
                return F.scaled_dot_product_attention(q, k.repeat_interleave(g, dim=1),
                                                      v.repeat_interleave(g, dim=1))

            for n in [int(t) for t in args.threads.split(",")]:
                torch.set_num_threads(n)
                step()  # warm-up
                times = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t0)
                print("decode_peer threads=%d L=%d ms=%.4f" % (n, L, 1e3 * statistics.median(times)),
                      flush=True)
            del cache_k, cache_v
    return 0


if __name__ == "__main__":
    sys.exit(main())
