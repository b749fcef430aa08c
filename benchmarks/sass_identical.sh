#!/bin/bash
# Is a header refactor free of device-code change?  Builds the split kernel of every example
# schedule (generated/hopper_*/split.cu) with each planted fault 0-3, from REV and from the
# working tree, to sm_90a cubins with the JIT's flags (less -lineinfo, whose line table moves
# with any edit), and compares them byte for byte.  Needs nvcc only (no GPU, no cuobjdump).
#   bash benchmarks/sass_identical.sh [REV]     (REV defaults to HEAD)
# Exit 0: every cubin identical; 1: some differ (listed); 2: a build failed.
set -u
rev=${1:-HEAD}
root=$(git rev-parse --show-toplevel) || exit 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/base" "$work/out/base" "$work/out/tree"
git -C "$root" archive "$rev" generated templates/hopper | tar xf - -C "$work/base" || exit 2

# the JIT's own flags (mlagen.backends.hopper.FLAGS), so that this check cannot drift from them
flags=$(PYTHONPATH=$root python3 -c "from mlagen.backends.hopper import FLAGS
print(' '.join(f for f in FLAGS if f != '-lineinfo'))") || exit 2

build() {  # tree outdir
  local n=0
  for src in "$1"/generated/hopper_*/split.cu; do
    local v; v=$(basename "$(dirname "$src")")
    for f in 0 1 2 3; do
      sed "s/^#define MLAGEN_FAULT 0$/#define MLAGEN_FAULT $f/" "$src" > "$2/$v.$f.cu"
      nvcc $flags -I "$1/templates/hopper/include" -cubin -o "$2/$v.$f.cubin" "$2/$v.$f.cu" \
        2> "$2/$v.$f.log" &
      n=$((n + 1))
      if (( n % $(nproc) == 0 )); then wait; fi
    done
  done
  wait
}
build "$work/base" "$work/out/base"
build "$root" "$work/out/tree"

status=0
for b in "$work"/out/base/*.cubin; do
  name=$(basename "$b")
  t="$work/out/tree/$name"
  if [[ ! -s $b || ! -s $t ]]; then
    echo "build failed: $name"; cat "${b%.cubin}.log" "${t%.cubin}.log" | grep -i error | head -5
    status=2
  elif ! cmp -s "$b" "$t"; then
    echo "differs: $name"; [[ $status == 0 ]] && status=1
  fi
done
count=$(ls "$work"/out/base/*.cubin 2>/dev/null | wc -l)
[[ $status == 0 ]] && echo "identical: $count cubins (examples x faults 0-3) against $rev"
exit $status
