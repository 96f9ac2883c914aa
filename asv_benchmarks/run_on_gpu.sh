#!/usr/bin/env bash
# Record asv results on a GPU machine that has no network and no git history (see docs/benchmarks.md).
#
#   On the development machine:  git bundle create .gpu/fastmm.bundle --all
#   On the GPU machine:          source .gpu/env.sh && asv_benchmarks/run_on_gpu.sh MACHINE OUTDIR [COMMIT...]
#
# asv runs in a clone made from the bundle (asv needs the history to date and order commits). Each commit's
# fastmm is checked out into its own worktree and put first on the benchmarks' path (ASV_PYTHONPATH), so the
# current benchmark suite measures that commit's code in the machine's own Python (--python=same), and the
# result is recorded under that commit (--set-commit-hash). BENCH (a regex, default: every benchmark) limits
# what runs. The results directory is copied to OUTDIR/results.
set -euo pipefail
machine=${1:?machine name}; outdir=${2:?output directory}; shift 2
bundle=${BUNDLE:-.gpu/fastmm.bundle}
bench=${BENCH:-.}
site=${SITE:-/tmp/site}
clone=$(mktemp -d /tmp/fastmm-asv-XXXX)
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
    ASV_PYTHONPATH="$wt:$site" python3 -m asv run --python=same --set-commit-hash "$hash" \
        --machine "$machine" --bench "$bench" --show-stderr || echo "asv run for $hash reported failures"
    mkdir -p "$outdir" && cp -r asv_benchmarks/results "$outdir/"  # after each commit: a timeout keeps the rest
done
