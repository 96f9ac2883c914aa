#!/usr/bin/env bash
# Record asv results on a GPU host that has no network access (see docs/benchmarks.md for the whole recipe).
#
#   On a machine with network access:  git bundle create fastmm.bundle --all   (and wheels for asv)
#   On the GPU host, from the root of the copied checkout:
#       asv_benchmarks/run_on_gpu.sh MACHINE RESULTS_DIR [COMMIT...]
#
# asv runs in a clone made from the bundle (asv needs the history to date and order commits). Each commit's
# fastmm is checked out into its own worktree and put first on the benchmarks' path (ASV_PYTHONPATH, ahead of
# $PYTHONPATH), so the current benchmark suite measures that commit's code in the host's own Python
# (--python=same), and the result is recorded under that commit (--set-commit-hash). Without COMMITs it
# measures the bundle's main. BUNDLE (default fastmm.bundle) names the bundle; BENCH (a regex, default: every
# benchmark) limits what runs. The results directory is copied to RESULTS_DIR/results after each commit.
set -euo pipefail
machine=${1:?machine name}; outdir=${2:?output directory}; shift 2
bundle=$(realpath "${BUNDLE:-fastmm.bundle}")
outdir=$(realpath -m "$outdir")
bench=${BENCH:-.}
clone=$(mktemp -d -t fastmm-asv-XXXX)
git clone -q "$bundle" "$clone"
git -C "$clone" checkout -q "${HEAD_COMMIT:-main}"
cd "$clone"
python3 -m asv machine --machine "$machine" --yes >/dev/null
commits=("$@")
[ ${#commits[@]} -gt 0 ] || commits=("$(git rev-parse HEAD)")
for c in "${commits[@]}"; do
    hash=$(git rev-parse "$c")
    wt="$clone-wt-${hash:0:8}"
    git worktree add -q --detach "$wt" "$hash"
    echo "== asv run for ${hash:0:8}: $(git log -1 --format=%s "$hash")"
    ASV_PYTHONPATH="$wt${PYTHONPATH:+:$PYTHONPATH}" python3 -m asv run --python=same --set-commit-hash "$hash" \
        --machine "$machine" --bench "$bench" --show-stderr || echo "asv run for $hash reported failures"
    mkdir -p "$outdir" && cp -r asv_benchmarks/results "$outdir/"  # after each commit: a timeout keeps the rest
done
