#!/usr/bin/env bash
# D=256's open A/B for #22 in one device call (bench/LOG.md v44 and "Session 53"): the PV split of an 80-key block
# in short slots (scripts/ab.py), then v44 (no rescale vote) against main, per tree in turn, in short slots and at
# the cap (scripts/clocks.py). Make the v44 copy first, here (bench/wip/README.md says how), as .scratch/p44:
#     run: bash bench/wip/d256-ab.sh [short]      carry: [".scratch/p44"]
# `short` (~150 s on the GPU) keeps one split run and one v44 pair; the full run takes ~5 min.
set -u
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
copy=$PWD/.scratch/p44
[ -d "$copy" ] || { echo "no $copy: make the v44 copy first (bench/wip/README.md)"; exit 2; }
out=${OUT:-/tmp}
shapes="--shape 2,4096,16,256 --shape 4,2048,16,256"
# run TREE SCRIPT ARGS...: TREE is main (this checkout) or p44 (the copy); each run's output also lands in $OUT/log.txt
# (ab.py writes $OUT/ab.json; each run's is kept as ab-N.json)
n=0
run() { local d=$PWD; [ "$1" = p44 ] && d=$copy; shift; n=$((n + 1))
        (cd "$d" && PYTHONPATH=$d timeout 90 python3 "$@" 2>&1 | tee -a "$out/log.txt" | tail -7)
        [ -f "$out/ab.json" ] && mv "$out/ab.json" "$out/ab-$n.json"; echo "(run $n)" | tee -a "$out/log.txt"; }
pairs="main p44 main p44"; splits=2
[ "${1:-}" = short ] && { pairs="main p44"; splits=1; }
for ((r = 1; r <= splits; r++)); do
    echo "-- PV split, short slots ($(date +%T))"
    run main scripts/ab.py $shapes --variant base: --variant s80:pv_split=80 --variant s32:pv_split=32+48 \
        --variant s64:pv_split=64+16
done
for t in $pairs; do echo "-- v44 $t, short slots ($(date +%T))"; run $t scripts/ab.py $shapes --shape 2,4096,16,192 --variant base:; done
for t in $pairs; do echo "-- v44 $t, at the cap ($(date +%T))"; run $t scripts/clocks.py --shape 2,4096,16,256 --dtype bf16 --seconds 1.5 --rounds 1; done
echo "done $(date +%T)"
