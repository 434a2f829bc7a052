#!/usr/bin/env bash
# The dry-run planner at GPU scale, from steps recorded on this machine: ResNet-50 at 224x224
# and a GPT of about 125M parameters (12 layers, d_model 768, vocab 50257, 256 tokens), each
# recorded at batch 2 and 4 on Flex (f32) with a budget that never binds. Then, on a device
# profile (default h200-pcie5): the predicted overhead at 50%, 33% and 25% of the step's peak
# for every policy and three prefetch windows, and for swap only, recompute only and both
# (cost_aware, prefetch windows of 64 to 1024 ops); and the largest batch within 10% overhead at a budget of 40 GiB. (Not batch 1: autodiff skips the reductions over a batch of one, so the
# program differs.) Recording takes a few minutes on two cores; tapes go to target/plan/.
#
#   scripts/plan-gpu-scale.sh [DEVICE]
set -euo pipefail
cd "$(dirname "$0")/.."
device="${1:-h200-pcie5}"
out=target/plan
mkdir -p "$out"
cargo build --release --example resnet --example transformer --example plan

record() {
    local name="$1" batch="$2"; shift 2
    local tape="$out/$name-b$batch.json"
    if [ ! -s "$tape" ]; then
        "./target/release/examples/$name" "$@" --batch "$batch" --steps 3 --budget 1000% \
            --save-tape "$tape" > "$out/$name-b$batch.log" 2>&1
    fi
}
resnet50=(--depth 50 --width 64 --image-size 224 --classes 1000)
gpt125m=(--layers 12 --d-model 768 --heads 12 --seq-len 256 --vocab 50257)
for batch in 2 4; do
    record resnet "$batch" "${resnet50[@]}"
    record transformer "$batch" "${gpt125m[@]}"
done

for model in resnet transformer; do
    preset=cnn
    [ "$model" = transformer ] && preset=transformer
    echo "## $model (recorded at batch 2) on $device: overhead at 50%, 33%, 25% of the step's peak"
    for policy in lru next_use cost_aware; do
        for window in preset 64 512; do
            flags=(--preset "$preset" --policy "$policy")
            [ "$window" != preset ] && flags+=(--prefetch-window "$window")
            printf '%-10s window %-6s ' "$policy" "$window"
            ./target/release/examples/plan "$out/$model-b2.json" --device "$device" --sweep \
                --fractions 50,33,25 --svg "$out/$model-$policy-$window.svg" "${flags[@]}" \
                | awk 'NR>=3 && NR<=5 { n = 0; for (i = 1; i <= NF; i++) if ($i ~ /%$/) p[++n] = $i;
                                         printf "%s: %s  ", p[1], p[2] } END { print "" }'
        done
    done
    echo "## $model on $device: swap only, recompute only and both (cost_aware, by prefetch window)"
    for window in 64 128 256 512 1024; do
        for mode in swap recompute both; do
            printf 'window %-5s %-10s ' "$window" "$mode"
            ./target/release/examples/plan "$out/$model-b2.json" --device "$device" --sweep \
                --fractions 50,33,25 --svg "$out/$model-$mode-$window.svg" --preset "$preset" \
                --policy cost_aware --prefetch-window "$window" --recompute "$mode" \
                | awk 'NR>=3 && NR<=5 { n = 0; for (i = 1; i <= NF; i++) if ($i ~ /%$/) p[++n] = $i;
                                         printf "%s: %s (%s rebuilds)  ", p[1], p[2], $(NF-2) } END { print "" }'
        done
    done
    echo "## $model: the largest batch within 10% overhead at 40 GiB (cost_aware, window 512)"
    ./target/release/examples/plan "$out/$model-b2.json" "$out/$model-b4.json" --batches 2,4 \
        --device "$device" --budget 40GiB --max-batch --overhead 10% \
        --preset "$preset" --policy cost_aware --prefetch-window 512 | tail -4
done
