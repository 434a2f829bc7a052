#!/usr/bin/env bash
# The CubeCL checks on an NVIDIA GPU, in one short run (under 8 minutes once built):
#  1. exactness: tests/cubecl.rs on `SpillBackend<Cuda>`, unfused and fused (random op
#     programs under budgets; a CNN and a Transformer trained at 30% under every policy,
#     asynchronous and synchronous; strided views; the allocator's figures), bit for bit
#     against plain burn-cuda;
#  2. the examples with --verify on CUDA at their default sizes, whose table shows the
#     allocator's peak reserved bytes for plain and spilled.
#
#   scripts/gpu-check.sh               # build, then run on the GPU; the log in target/gpu-check.log
#   scripts/gpu-check.sh --build-only  # build only (works without a GPU or a CUDA toolkit)
#
# Exit codes: 0 when the build (and, without --build-only, every check) succeeded; 1 when there is
# no GPU to run on (nvidia-smi missing or listing none) or a check failed; 2 on bad arguments.
# The budgets comparison at GPU sizes is scripts/gpu-bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --build-only) build_only=1 ;;
        -h | --help)
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
            exit 0
            ;;
        *)
            echo "error: unknown argument '$1'; accepted: --build-only" >&2
            exit 2
            ;;
    esac
    shift
done

features=(--no-default-features --features flex,cuda,fusion)
echo "== building with ${features[*]} (release)"
cargo test --release "${features[@]}" --test cubecl --no-run
cargo build --release "${features[@]}" --example resnet --example transformer

if [[ $build_only -eq 1 ]]; then
    echo "== built; --build-only, so nothing ran (no GPU was used)"
    exit 0
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "error: no NVIDIA GPU here (nvidia-smi missing or listing none); nothing ran" >&2
    exit 1
fi

log=target/gpu-check.log
: >"$log"
status=0
run() {
    echo "== $*" | tee -a "$log"
    if ! "$@" 2>&1 | tee -a "$log"; then
        status=1
    fi
}
run cargo test --release "${features[@]}" --test cubecl cuda_ -- --test-threads 1
run cargo run --release "${features[@]}" --example resnet -- --backend cuda --verify
run cargo run --release "${features[@]}" --example transformer -- --backend cuda --verify
echo "== log in $log"
exit $status
