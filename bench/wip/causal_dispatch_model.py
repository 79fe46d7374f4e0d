"""A list-scheduling model of causal per-tile CTAs (bench/LOG.md, "v22"): tiles dispatched in order to the first
free SM (one CTA per SM), a tile's time its key blocks plus one for its start and end. Compares the dispatch order
of today's grid (each head's tiles longest first, head after head) with longest-first in L2 sections of heads
(bench/wip/fwd-causal-sections.patch; FA4's order). Run: python3 bench/wip/causal_dispatch_model.py
"""

import heapq

SMS, L2_SECTION_BYTES = 132, 50 * 1024 * 1024


def makespan(order, sms=SMS, overhead=1.0):
    free = [0.0] * sms
    end = 0.0
    for blocks in order:
        start = heapq.heappop(free)
        end = max(end, start + blocks + overhead)
        heapq.heappush(free, start + blocks + overhead)
    return end


def tile_blocks(seq, block_m=128, block_n=128):
    """Key blocks of each causal query tile."""
    return [-(-(m + 1) * block_m // block_n) for m in range(seq // block_m)]


def head_after_head(pairs, seq):
    t = tile_blocks(seq)
    return [t[m] for _ in range(pairs) for m in reversed(range(len(t)))]


def longest_first_in_sections(pairs, seq, section):
    t = tile_blocks(seq)
    order = []
    for first in range(0, pairs, section):
        for m in reversed(range(len(t))):
            order += [t[m]] * min(section, pairs - first)
    return order


if __name__ == "__main__":
    for batch, heads, seq, kv_heads, dim in [(1, 16, 16384, 16, 128), (4, 32, 4096, 32, 128), (1, 32, 8192, 8, 128)]:
        per_head = seq * dim * 2 * 2 * kv_heads / heads
        section = 1
        while 2 * section * per_head <= L2_SECTION_BYTES:
            section *= 2
        pairs = batch * heads
        a, b = makespan(head_after_head(pairs, seq)), makespan(longest_first_in_sections(pairs, seq, section))
        print(f"({batch},{seq},{heads},{dim}) kv{kv_heads}: head after head {a:.0f}, sections of {section} {b:.0f} "
              f"({a / b:.3f}x)")
