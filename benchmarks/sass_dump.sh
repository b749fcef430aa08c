#!/bin/bash
# The SASS of a Hopper schedule's split kernel, on a machine with nvcc and no GPU: renders the
# schedule (`mlagen generate`), builds split.cu to an sm_90a cubin with the JIT's flags, and
# disassembles it.  The CPU machines' images carry no cuobjdump; the Triton wheel does, so
# one is fetched with `pip download` into ~/.cache/mlagen-tools the first time (~170 MB).
#   bash benchmarks/sass_dump.sh schedules/hopper_wgmma.toml [OUT]   (OUT: /tmp/sass-<name>;
#   from an exported tree's folder, that tree's templates)
# Writes OUT/split.sass (every kernel), OUT/ptxas.txt and OUT/digest.txt: each kernel's wgmma,
# warpgroup waits and barriers in order, a run of wgmma folded into one line with how many
# other instructions stand among them (it showed an RS P V's wgmma no sparser than the
# SS one's: docs/hopper.md, the RS rows of "What was tried"); prints ptxas's registers and spills per kernel.
# Exit 2: no schedule file, no nvcc, a failed build or no cuobjdump.
set -u
[[ $# -ge 1 && -f $1 ]] || { echo "usage: sass_dump.sh SCHEDULE.toml [OUT] (a schedule file)" >&2; exit 2; }
sched=$1
name=$(basename "$sched" .toml)
out=${2:-/tmp/sass-$name}
# the tree in this folder (an exported A/B tree too), else this checkout's
if [[ -d mlagen && -d templates/hopper ]]; then root=$PWD; else root=$(git rev-parse --show-toplevel) || exit 2; fi
command -v nvcc > /dev/null || { echo "sass_dump: no nvcc on PATH" >&2; exit 2; }

cuobjdump=$(command -v cuobjdump || true)
if [[ -z $cuobjdump ]]; then
  tools=~/.cache/mlagen-tools
  cuobjdump=$tools/triton/backends/nvidia/bin/cuobjdump
  if [[ ! -x $cuobjdump ]]; then
    mkdir -p "$tools/wheel"
    python3 -m pip download -q --no-deps -d "$tools/wheel" triton > /dev/null 2>&1
    whl=$(ls "$tools"/wheel/triton-*.whl 2> /dev/null | head -1)
    [[ -n $whl ]] && python3 -m zipfile -e "$whl" "$tools/unpacked" > /dev/null 2>&1 &&
      mkdir -p "$tools/triton/backends/nvidia" &&
      cp -r "$tools/unpacked/triton/backends/nvidia/bin" "$tools/triton/backends/nvidia/" &&
      chmod +x "$tools"/triton/backends/nvidia/bin/* && rm -rf "$tools/unpacked"
  fi
  [[ -x $cuobjdump ]] || { echo "sass_dump: no cuobjdump (none on PATH, none in a Triton wheel)" >&2; exit 2; }
fi

rm -rf "$out" && mkdir -p "$out"
PYTHONPATH=$root python3 -m mlagen.cli generate "$sched" -o "$out/src" > /dev/null || exit 2
src=$out/src/$name
flags=$(PYTHONPATH=$root python3 -c "from mlagen.backends.hopper import FLAGS
print(' '.join(FLAGS))") || exit 2
# shellcheck disable=SC2086
nvcc $flags -Xptxas -v -I "$src/include" -cubin -o "$out/split.cubin" "$src/split.cu" \
  > "$out/ptxas.txt" 2>&1 || { cat "$out/ptxas.txt" >&2; exit 2; }
"$cuobjdump" -sass "$out/split.cubin" 2> /dev/null > "$out/split.sass" || exit 2

grep -A2 "Function properties" "$out/ptxas.txt" | grep -v "^--" |
  sed 's/ptxas info    : Function properties for /kernel /; s/ptxas info    : //'
awk '
  /Function : / { flush(); print "\n" $0; next }
  / (HGMMA|WARPGROUP|BAR\.|BAR )/ {
    op = $2; if (op ~ /^@/) op = $3
    line = $0; sub(/ *\/\* 0x[0-9a-f]+ \*\/ *$/, "", line); sub(/^ +/, "", line)
    if (op == prev && op ~ /HGMMA/) { n++; gap += other; other = 0; next }
    flush(); print "  " line; prev = op; other = 0; next
  }
  /^ +\/\*[0-9a-f]+\*\// { other++ }
  # a folded run: how many other instructions stood between its wgmma (0: back to back)
  function flush() {
    if (n > 0) print "  ... " n " more " prev ", " gap " other instructions between them"
    n = 0; gap = 0; prev = ""
  }
  END { flush() }
' "$out/split.sass" > "$out/digest.txt"
echo "SASS: $out/split.sass ($(grep -c HGMMA "$out/split.sass") wgmma); digest: $out/digest.txt"
