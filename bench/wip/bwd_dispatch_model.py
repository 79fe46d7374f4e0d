"""A list-scheduling model of the backward's launch order under a causal mask (bench/LOG.md, "b11"): one CTA per
(key block, K/V head, sequence), dispatched in order to the first free SM (one CTA per SM); a CTA's time is the
query blocks its key block sees (times the query heads of its group) plus one for loading K and V and storing dK
and dV. Compares sections of 1, 2, 4, ... pairs (the key block slowest within a section; 1 is today's order:
a pair's CTAs together, longest first) by their makespan as a fraction of the lower bound (total work / SMs, or
the longest CTA). Run: python3 bench/wip/bwd_dispatch_model.py
"""

import heapq

SMS = 132


def makespan(costs, sms=SMS):
    free = [0.0] * sms
    end = 0.0
    for c in costs:
        start = heapq.heappop(free)
        end = max(end, start + c)
        heapq.heappush(free, start + c)
    return end


def order(pairs, n_blocks, section):
    """(pair, key block) in launch order: sections of `section` pairs, the key block slowest within each."""
    out = []
    for first in range(0, pairs, section):
        size = min(section, pairs - first)
        out += [(first + i, n) for n in range(n_blocks) for i in range(size)]
    return out


# (label, B, H, H_kv, S, keys per CTA, queries per block, D)
CASES = [("(4,4096,32,128) causal", 4, 32, 32, 4096, 128, 64, 128),
         ("(1,16384,16,128) causal", 1, 16, 16, 16384, 128, 64, 128),
         ("(2,4096,16,256) causal", 2, 16, 16, 4096, 80, 64, 256),
         ("(1,8192,32,128) kv8 causal", 1, 32, 8, 8192, 128, 64, 128),
         ("(8,2048,16,128) causal", 8, 16, 16, 2048, 128, 64, 128)]

if __name__ == "__main__":
    for label, b, h, hkv, s, block_n, block_m, d in CASES:
        pairs, n_blocks, group = b * hkv, -(-s // block_n), h // hkv

        def cost(cta):
            return group * (s - cta[1] * block_n) / block_m + 1.0

        total = sum(cost((p, n)) for p in range(pairs) for n in range(n_blocks))
        bound = max(total / SMS, cost((0, 0)))
        shown = [f"{sec}: {bound / makespan([cost(c) for c in order(pairs, n_blocks, sec)]):.3f}"
                 for sec in (1, 2, 4, 8, 16) if sec <= pairs]
        print(f"{label:28s} {pairs * n_blocks:5d} CTAs, fraction of the bound by section: {', '.join(shown)}")
