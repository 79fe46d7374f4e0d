"""Per-CTA timeline of the decode kernel (bench/LOG.md d16): stamps at entry, Q landed, first K block landed,
producer done, each key group's loop end, normalized, key-group merge, partial stored, merge barrier and exit.

It rewrites templates/decode_sm90/ in the current directory to write the stamps (globaltimer at entry and exit,
clock64 between, into a torch buffer whose address is compiled in), so run it only from a copy of the tree:
    mkdir /tmp/T && cp -r codegen templates layouts gen.py bench scripts pyproject.toml /tmp/T && cd /tmp/T
    FLASHGEN_PATCHED_COPY=1 PYTHONPATH=/tmp/T python3 /path/to/bench/wip/decode_timeline.py 1,2048 1,8192,16
(B,S_K[,splits]: H=32/8, D=128, bf16, full dense caches). Times are us from the launch's first CTA entry."""
import os, sys, pathlib
if os.environ.get("FLASHGEN_PATCHED_COPY") != "1" or (pathlib.Path.cwd() / ".git").exists():
    raise SystemExit("decode_timeline.py rewrites the templates it finds: run it in a copy (see its docstring)")
import torch
src = pathlib.Path.cwd()
N_SLOTS = 16
# Input sets rotated (TIMELINE_SETS, default 2): with enough of them the stamped launch finds its K/V out of L2.
N_SETS = int(os.environ.get("TIMELINE_SETS", "2"))
stamps = torch.zeros(1 << 16, N_SLOTS, dtype=torch.int64, device="cuda")
addr = stamps.data_ptr()
kt = src / "templates/decode_sm90/kernel.cu.j2"
consumers = [src / f"templates/decode_sm90/{name}.j2" for name in ("consumer", "consumer_swapped")]
common = src / "templates/decode_sm90/consumer_common.j2"
k = kt.read_text()
helper = ('static __device__ __forceinline__ void stamp(int slot, unsigned long long v = 0ull) {\n'
          '  unsigned long long t;\n'
          '  if (slot == 0 || slot == 14) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); else t = clock64();\n'
          '  const size_t cta = ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;\n'
          f'  reinterpret_cast<unsigned long long*>({addr}ull)[cta * {N_SLOTS} + slot] = slot == 1 ? v : t;\n'
          '}\n')
k = k.replace('struct BlockPages {', helper + 'struct BlockPages {', 1)
k = k.replace("  if (warpgroup > 0) copy_q(args, w, smem, warpgroup - 1, tid);",
              "  if (threadIdx.x == 0) { stamp(0); stamp(15); unsigned s; asm(\"mov.u32 %0, %%smid;\" : \"=r\"(s)); stamp(1, s); }\n  if (warpgroup > 0) copy_q(args, w, smem, warpgroup - 1, tid);")
assert "stamp(0)" in k
import re
k = re.sub(r"(      if \(j \+ 1 < w.count\) pages = read_block_pages\(table, [^;]*\);\n    }\n  }\n)}", r"\1  if (lane == 0) stamp(2);\n}", k, count=1)
assert "stamp(2)" in k
# Both consumers (plain and swapped): first K block seen, Q landed, each key group's loop end.
for path in consumers:
    c = path.read_text()
    c = c.replace("    mbar_wait(bar(bars, kBarKFull + s), ring_phase(j));\n",
                  "    mbar_wait(bar(bars, kBarKFull + s), ring_phase(j));\n    if (tid == 0 && consumer == 0 && j == 0) stamp(3);\n", 1)
    c = c.replace("  wait_q(row_group);\n", "  wait_q(row_group);\n  if (tid == 0 && consumer == 0) stamp(11);\n", 1)
    c = c.replace("  finish_rows(args,", "  if (tid == 0) stamp(4 + key_group);\n  finish_rows(args,", 1)
    assert "stamp(3)" in c and "stamp(11)" in c and "stamp(4 + key_group)" in c, path
    path.write_text(c)
# The shared end: key groups met (8), normalized (6), partial stored (9).
c = common.read_text()
first = "tid == 0 && key_group == 0 && row_group == 0"
c = c.replace("  if constexpr (cfg::kKeyGroups > 1) {\n    if (!merge_key_groups",
              f"  if ({first}) stamp(8);\n  if constexpr (cfg::kKeyGroups > 1) {{\n    if (!merge_key_groups", 1)
c = c.replace("  if (args.splits == 1) {\n    store_rows", f"  if ({first}) stamp(6);\n  if (args.splits == 1) {{\n    store_rows", 1)
c = c.replace("    store_partial(args, w, o, lse2, rows, lane);\n", f"    store_partial(args, w, o, lse2, rows, lane);\n    if ({first}) stamp(9);\n", 1)
assert "stamp(8)" in c and "stamp(6)" in c and "stamp(9)" in c
common.write_text(c)
mt = src / "templates/decode_sm90/merge.j2"; m = mt.read_text()
m = m.replace("  cluster_sync();\n  merge_rows(args, w, ctid * args.splits + w.split", "  cluster_sync();\n  if (ctid == 0) stamp(10);\n  merge_rows(args, w, ctid * args.splits + w.split")
m = m.replace("  if (!ld_shared_s32(flag)) return;\n  __threadfence();\n", "  if (!ld_shared_s32(flag)) return;\n  __threadfence();\n  if (ctid == 0) stamp(10);\n")
# The push merge (plan.push_merge): rows staged and shared (9), split 0's MergeFull complete (10).
m = m.replace("  named_barrier_sync(kMergeBarrier, cfg::kOutputThreads);\n  if (rank != 0) {",
              "  named_barrier_sync(kMergeBarrier, cfg::kOutputThreads);\n  if (ctid == 0) stamp(9);\n  if (rank != 0) {")
m = m.replace("  mbar_wait(bar(bars, kBarMergeFull), 0);\n", "  mbar_wait(bar(bars, kBarMergeFull), 0);\n  if (ctid == 0) stamp(10);\n")
assert m.count("stamp(10)") == 3 and m.count("stamp(9)") == 1
mt.write_text(m)
# The exit stamps go after consumer() returns, so that both consumers (plain and swapped) have them.
k = k.replace("  consumer(args, w, smem, bars, warpgroup - 1, tid);\n}",
              "  consumer(args, w, smem, bars, warpgroup - 1, tid);\n  if (warpgroup == 1 && tid == 0) { stamp(7); stamp(14); }\n}", 1)
assert "stamp(14)" in k
kt.write_text(k)
sys.path.insert(0, str(src))
from codegen import attention_with_kvcache
for text in sys.argv[1:]:
    parts = [int(x) for x in text.split(",")]
    B, S = parts[:2]
    kw = {"num_splits": parts[2]} if len(parts) > 2 else {}
    sets = []
    for _ in range(N_SETS):
        q = torch.randn(B, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
        kk, vv = (torch.randn(B, S, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        sets.append((q, kk, vv, lens, torch.empty_like(q)))
    for i in range(12 + N_SETS - 12 % N_SETS):
        s = sets[i % N_SETS]
        attention_with_kvcache(s[0], s[1], s[2], s[3], causal=False, out=s[4], **kw)
    torch.cuda.synchronize()
    stamps.zero_()
    s = sets[0]
    attention_with_kvcache(s[0], s[1], s[2], s[3], causal=False, out=s[4], **kw)
    torch.cuda.synchronize()
    st = stamps.cpu()
    n = int((st[:, 0] > 0).sum())
    st = st[:n].double()
    t0 = st[:, 0].min()
    ghz = float(((st[:, 7] - st[:, 15]) / (st[:, 14] - st[:, 0])).median())
    print(f"B={B} S={S} {kw}: {n} CTAs, first-to-last {float((st[:, 14].max() - t0) / 1000):.2f} us (clock {ghz:.3f} GHz)")
    q = lambda v: sorted(v.tolist())
    ent = q((st[:, 0] - t0) / 1000.0)
    print(f"  {'entry (gt)':>18}: min {ent[0]:7.2f} med {ent[len(ent)//2]:7.2f} max {ent[-1]:7.2f} us")
    for col, name in [(11, "Q landed"), (3, "first K landed"), (2, "producer done"), (4, "kg0 loop end"), (5, "kg1 loop end"), (8, "normalized"), (6, "kg merge done"), (9, "partial stored"), (10, "merge sync"), (12, "stamp 12"), (13, "stamp 13"), (7, "exit")]:
        if (st[:, col] == 0).all():
            continue
        hit = st[:, col] != 0  # a stamp only some CTAs write (split 0's MergeFull) counts those
        v = q(((st[:, col] - st[:, 15]) / ghz / 1000.0 + (st[:, 0] - t0) / 1000.0)[hit])
        print(f"  {name:>18}: min {v[0]:7.2f} p10 {v[len(v)//10]:7.2f} med {v[len(v)//2]:7.2f} p90 {v[9*len(v)//10]:7.2f} max {v[-1]:7.2f} us")
