#!/usr/bin/env bash
# Issue 15's comparison in one table: the dry-run planner's predicted overhead for swap only,
# recompute only and both, at 50%, 33% and 25% of each recorded step's peak (cost_aware,
# prefetch window 512, the state moved as the engine moves it), for every tape in target/plan/
# (`scripts/plan-gpu-scale.sh` records ResNet-50 and the GPT there; the examples' `--save-tape`
# records others). A planner change is judged on this table before and after: the predictions
# are deterministic, so any difference is the change's.
#
#   scripts/plan-modes.sh [DEVICE] [extra arguments for the plan example]
set -euo pipefail
cd "$(dirname "$0")/.."
device="${1:-h200-pcie5}"
shift || true
cargo build --release --example plan -q
shopt -s nullglob
tapes=(target/plan/*.json)
if [ ${#tapes[@]} -eq 0 ]; then
    echo "scripts/plan-modes.sh: no tapes in target/plan/ (run scripts/plan-gpu-scale.sh first)" >&2
    exit 2
fi

# The overheads of a sweep's budget rows: the first field after the fraction that ends in `%`.
overheads() {
    awk '$3 ~ /%$/ { for (i = 4; i <= NF; i++) if ($i ~ /%$/) { printf "%s%s", sep, $i; sep = " / "; break } }
         END { print "" }'
}

echo "predicted overhead on $device at 50 / 33 / 25% of the peak (cost_aware, window 512)"
echo "| tape | swap | recompute | both |"
echo "|---|---|---|---|"
for tape in "${tapes[@]}"; do
    row="| $(basename "$tape" .json)"
    for mode in swap recompute both; do
        cells=$(./target/release/examples/plan "$tape" --device "$device" --sweep \
            --fractions 50,33,25 --preset transformer --policy cost_aware --prefetch-window 512 \
            --recompute "$mode" --svg /dev/null "$@" | overheads)
        row="$row | $cells"
    done
    echo "$row |"
done
