#!/usr/bin/env bash
# D=256 against FA4 for #22 (bench/LOG.md v46, v47, v48): main and three patched copies, each timed in turn with FA4
# in the same rounds (scripts/ab.py --peer fa4), causal D=256's key block (v48, a knob), then the cap (scripts/clocks.py
# --peer fa4), one device call.
#   here, first:   bash bench/wip/d256-v46-v47.sh make      (writes .scratch/p46, .scratch/p47, .scratch/p4647)
#   on the GPU:    bash bench/wip/d256-v46-v47.sh [short]   carry: [".scratch/p46", ".scratch/p47", ".scratch/p4647", ...]
# FA4 must be importable (PYTHONPATH as bench/wip/README.md's "FA4 on the GPU machine" sets it): run it in the
# second of the two FA4 calls. `short` times each tree once; the full run twice, in reverse order the second time
# (not yet run: estimated from the fa4 matrix's 45 s for 14 rows at 12 rounds, about 2 and 4 min). Everything also
# lands in $OUT/log.txt, and each ab.py table as $OUT/ab-N.json.
set -u
wip=bench/wip
copies="p46:fwd-d256-no-turns-1024-4096.patch p47:fwd-rescale-under-qk.patch p4647:fwd-d256-no-turns-1024-4096.patch,fwd-rescale-under-qk.patch"
if [ "${1:-}" = make ]; then
    for c in $copies; do  # NAME:PATCH[,PATCH]
        d=.scratch/${c%%:*} patches=${c#*:}; rm -rf "$d"; mkdir -p "$d"
        git ls-files -co --exclude-standard | grep -v "^bench/results/" | tar -cf - -T - | tar -xf - -C "$d"
        for q in ${patches//,/ }; do (cd "$d" && patch -p1 -s < "$wip/$q") || exit 1; done
        echo "made $d ($(du -sh "$d" | cut -f1))"
    done
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
python3 -c "import flash_attn.cute" || { echo "FA4 is not importable: set PYTHONPATH as bench/wip/README.md says"; exit 2; }
out=${OUT:-/tmp}; n=0
trees="main p46 p47 p4647"
[ "${1:-}" = short ] || trees="$trees p4647 p47 p46 main"
# run TREE SCRIPT ARGS...: TREE is main (this checkout) or a copy's name under .scratch
run() { local d=$PWD; [ "$1" = main ] || d=$PWD/.scratch/$1; shift; n=$((n + 1))
        [ -d "$d" ] || { echo "no $d: make the copies first"; return; }
        (cd "$d" && PYTHONPATH=$d:${PYTHONPATH:-} timeout 150 python3 "$@" 2>&1 | tee -a "$out/log.txt" | tail -6)
        [ -f "$out/ab.json" ] && mv "$out/ab.json" "$out/ab-$n.json"; echo "(run $n)" | tee -a "$out/log.txt"; }
for t in $trees; do
    echo "-- $t, short slots ($(date +%T))" | tee -a "$out/log.txt"
    run $t scripts/ab.py --shape 2,4096,16,256 --shape 4,2048,16,256 --shape 2,4096,16,192 --peer fa4 --rounds 12 \
        --variant base:
done
echo "-- main, causal D=256: 64-key blocks (the policy) against 80 (v48, FA4's) ($(date +%T))" | tee -a "$out/log.txt"
run main scripts/ab.py --causal --shape 2,4096,16,256 --shape 4,2048,16,256 --peer fa4 --rounds 12 --variant base: \
    --variant n80:block_n=80
for t in main p46 p4647; do
    echo "-- $t, at the cap ($(date +%T))" | tee -a "$out/log.txt"
    run $t scripts/clocks.py --shape 2,4096,16,256 --dtype bf16 --seconds 1.5 --rounds 1 --peer fa4
done
echo "done $(date +%T)"
