#!/usr/bin/env bash
# FlashAttention-4 on the GPU machine, whose one call carries at most 64 MiB: the CUDA 13 library (.fa4x, 59 MB)
# and the wheels (.fa4w) travel in two calls back to back (bench/README.md, "fa4").
#
#   here, once:        bash ../shared/tools/fa4-wheels.sh && bash scripts/fa4-site.sh split
#   call 1 (carry .fa4xa .fa4w):  bash scripts/fa4-site.sh stage && <GPU work without FA4>
#   call 2 (carry .fa4xb), within the 30 s the machine stays warm:
#                      . scripts/fa4-site.sh finish && python3 scripts/ab.py ... --peer fa4
#
# `finish` is sourced: it exports PYTHONPATH with FA4 and the checkout on it.

_fa4_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"  # .gitignore lists the .fa4* folders
_fa4_half="${FA4_FIRST_BYTES:-30000000}"  # the tarball's bytes in call 1 (with 8 MB of wheels and the tree: < 64 MiB)

_fa4_split() {
  local tarball="$_fa4_root/.fa4x/cu13.tar.xz"
  [ -f "$tarball" ] || { echo "fa4-site: no $tarball; run ../shared/tools/fa4-wheels.sh first" >&2; return 1; }
  mkdir -p "$_fa4_root/.fa4xa" "$_fa4_root/.fa4xb"
  head -c "$_fa4_half" "$tarball" > "$_fa4_root/.fa4xa/p"
  tail -c +"$((_fa4_half + 1))" "$tarball" > "$_fa4_root/.fa4xb/p"
  echo "fa4-site: .fa4xa/p and .fa4xb/p written; carry .fa4xa and .fa4w in call 1, .fa4xb in call 2"
}

_fa4_stage() {
  [ -f "$_fa4_root/.fa4xa/p" ] || { echo "fa4-site: no .fa4xa/p: carry .fa4xa in this call" >&2; return 1; }
  mkdir -p "$_fa4_root/.fa4site"
  cp "$_fa4_root/.fa4xa/p" "$_fa4_root/.fa4site/partA"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$_fa4_root/.fa4wheels" "$_fa4_root"/.fa4w/*.whl
}

_fa4_finish() {
  local site="$_fa4_root/.fa4site"
  if [ ! -f "$site/partA" ] && [ ! -d "$site/nvidia_cutlass_dsl" ]; then
    echo "fa4-site: nothing staged (a fresh machine?): run stage in the call before, on this machine" >&2
    return 1
  fi
  if [ -f "$site/partA" ]; then
    [ -f "$_fa4_root/.fa4xb/p" ] || { echo "fa4-site: no .fa4xb/p: carry .fa4xb in this call" >&2; return 1; }
    cat "$site/partA" "$_fa4_root/.fa4xb/p" | tar -C "$site" -xJf - || return 1
    rm "$site/partA"
    cp -r "$_fa4_root/.fa4wheels/." "$site/"
  fi
  export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages:$_fa4_root"
  echo "fa4-site: FA4 on PYTHONPATH ($site)"
}

case "${1:-}" in
  split) _fa4_split ;;
  stage) _fa4_stage ;;
  finish) _fa4_finish ;;
  *) echo "usage: fa4-site.sh split | stage | . fa4-site.sh finish" >&2; false ;;
esac
