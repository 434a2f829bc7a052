#!/usr/bin/env bash
# The budgets comparison on a GPU: burn-spill over burn-cuda against plain burn-cuda, at budgets
# of 100/75/50/30% of the plain peak, for the examples' ResNet-18 and GPT at GPU sizes. Then the
# resnet and transformer examples on CUDA with --verify (bit-identical plain and spilled runs).
#
#   scripts/gpu-bench.sh                 # build, then run on the GPU; table in target/gpu-bench.md
#   scripts/gpu-bench.sh --build-only    # build only (works without a GPU or a CUDA toolkit)
#   scripts/gpu-bench.sh --size small    # the CPU-sized models instead (quick check of a GPU box)
#   scripts/gpu-bench.sh --out FILE      # write the markdown table to FILE
#
# Exit codes: 0 when the build (and, without --build-only, the runs) succeeded; 1 when there is
# no GPU to run on (nvidia-smi missing or listing none) or a run failed; 2 on bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
size=large
out=target/gpu-bench.md
while [[ $# -gt 0 ]]; do
    case "$1" in
        --build-only) build_only=1 ;;
        --size)
            size="${2:-}"
            shift
            ;;
        --out)
            out="${2:-}"
            shift
            ;;
        -h | --help)
            # The comment block at the top of this file.
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
            exit 0
            ;;
        *)
            echo "error: unknown argument '$1'; accepted: --build-only, --size small|large, --out FILE" >&2
            exit 2
            ;;
    esac
    shift
done
if [[ "$size" != small && "$size" != large ]]; then
    echo "error: --size: '$size' is not a size; accepted: small, large" >&2
    exit 2
fi
if [[ -z "$out" ]]; then
    echo "error: --out: needs a file path" >&2
    exit 2
fi

features=(--features cuda)
echo "== building with ${features[*]} (release)"
cargo bench "${features[@]}" --bench budgets --no-run
cargo build --release "${features[@]}" --example resnet --example transformer

if [[ $build_only -eq 1 ]]; then
    echo "== built; --build-only, so nothing runs"
    exit 0
fi

# CUDA builds without a toolkit and panics at run time without a driver: look before running.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "error: no NVIDIA GPU here (nvidia-smi is missing or lists no GPU); the build succeeded;" \
        "run this script on a machine with a GPU and its driver, or pass --build-only" >&2
    exit 1
fi
nvidia-smi -L

mkdir -p "$(dirname "$out")"
log="${out%.md}.log"
echo "== budgets bench on cuda ($size models); full output in $log"
BURN_SPILL_BENCH_BACKEND=cuda BURN_SPILL_BENCH_SIZE="$size" \
    cargo bench "${features[@]}" --bench budgets 2>&1 | tee "$log"

{
    echo "# burn-spill on CUDA: step time spilled / plain"
    echo
    nvidia-smi -L
    echo
    # The bench ends with its summary: the heading line and the markdown table.
    grep -E '^(Step time, spilled|\|)' "$log"
} >"$out"

# The examples at the bench's sizes (their defaults are sized for two CPU cores).
if [[ "$size" == large ]]; then
    resnet_args=(--width 64 --batch 128 --steps 20)
    transformer_args=(--d-model 512 --layers 6 --heads 8 --seq-len 256 --vocab 256 --batch 16)
else
    resnet_args=()
    transformer_args=()
fi
report_dir="$(dirname "$out")"
for example in resnet transformer; do
    echo "== $example on cuda with --verify"
    table="$report_dir/gpu-$example.txt"
    args_name="${example}_args[@]"
    "target/release/examples/$example" --backend cuda --verify "${!args_name}" \
        --report "$report_dir/gpu-$example.json" | tee "$table"
    {
        echo
        echo "## $example example (--backend cuda --verify)"
        echo
        grep -E '^\|' "$table"
    } >>"$out"
done

echo "== table written to $out"
cat "$out"
