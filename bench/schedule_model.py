#!/usr/bin/env python3
"""A model of how the causal lane forward's work items share out among threads.

The forward cuts each head's query rows into blocks (lane_rows in
src/kernels/flash/flash_lanes.h: FBR = 288 rows at least, 1056 at most on a
2 MiB L2, at least 4 blocks a thread) and hands the (head, block) items out
one at a time to whichever thread is free (attn_pool_dynamic). Here an
item costs the (row, key) pairs it computes, a row i seeing keys 0..i, and
the span is that of greedy list scheduling in the given order, over the
ideal (all the work / threads). Two orders:
  per head: each head's blocks in turn, its last (heaviest) block first;
  blocks outer: the last block of every head first (flash_forward's
    blocks_outer, taken where a part has fewer than 16 items).

  python3 bench/schedule_model.py [--heads 12] [--threads 2,4,8,16] [--tokens 1024,4096,16384]
"""
import argparse
import heapq

FBR, FBR_MAX, LANE_GROUP = 288, 1056, 48


def lane_rows(tokens, heads, threads):
    """Rows per query block, as lane_rows on a 2 MiB L2 (head_dim 64)."""
    if tokens <= FBR:
        return FBR
    blocks = max(-(-tokens // FBR_MAX), -(-4 * threads // heads))
    rows = -(-(-(-tokens // blocks)) // LANE_GROUP) * LANE_GROUP
    return max(rows, FBR)


def block_costs(tokens, rows):
    costs = []
    for r0 in range(0, tokens, rows):
        r1 = min(tokens, r0 + rows)
        costs.append((r0 + 1 + r1) * (r1 - r0) // 2)  # sum of i + 1 over the rows
    return costs


def span(costs, threads):
    free_at = [0] * threads
    for c in costs:
        heapq.heappush(free_at, heapq.heappop(free_at) + c)
    return max(free_at)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--threads", default="2,4,8,16")
    ap.add_argument("--tokens", default="1024,4096,16384")
    a = ap.parse_args()
    print(f"causal forward, {a.heads} heads: span over the ideal")
    print("     T threads  rows items | per head  blocks outer")
    for threads in map(int, a.threads.split(",")):
        for tokens in map(int, a.tokens.split(",")):
            rows = lane_rows(tokens, a.heads, threads)
            blocks = block_costs(tokens, rows)
            ideal = a.heads * sum(blocks) / threads
            per_head = [c for _ in range(a.heads) for c in reversed(blocks)]
            outer = [c for c in reversed(blocks) for _ in range(a.heads)]
            print(f"{tokens:6} {threads:7} {rows:5} {len(per_head):5} | "
                  f"{span(per_head, threads) / ideal:8.3f}  {span(outer, threads) / ideal:12.3f}")


if __name__ == "__main__":
    main()
