#!/usr/bin/env bash
# The CubeCL checks on an NVIDIA GPU, in one short run (under 8 minutes once built):
#  1. exactness: tests/cubecl.rs on `SpillBackend<Cuda>`, unfused and fused (random op
#     programs under budgets; a CNN and a Transformer trained at 30% under every policy,
#     asynchronous and synchronous; strided views; the allocator's figures), bit for bit
#     against plain burn-cuda; and tests/cubecl_unmarked.rs (victims dropped and rebuilt in
#     steps without markers);
#  2. the examples with --verify on CUDA at their default sizes, whose table shows the
#     allocator's peak reserved bytes for plain and spilled.
#
#   scripts/gpu-check.sh               # build, then run on the GPU; the log in target/gpu-check.log
#   scripts/gpu-check.sh --build-only  # build only (works without a GPU or a CUDA toolkit)
#   scripts/gpu-check.sh --bundle DIR  # build, then put the binaries and a run.sh in DIR, for a
#                                      # GPU machine with no Rust toolchain (`bash DIR/run.sh`
#                                      # from a checkout of this repository there)
#
# A test that finds no CUDA device skips (CI has none); here a skip is a failure.
#
# Exit codes: 0 when the build (and, without --build-only, every check) succeeded; 1 when there is
# no GPU to run on (nvidia-smi missing or listing none) or a check failed; 2 on bad arguments.
# The budgets comparison at GPU sizes is scripts/gpu-bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
bundle=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --build-only) build_only=1 ;;
        --bundle)
            bundle="${2:-}"
            if [[ -z "$bundle" ]]; then
                echo "error: --bundle needs a directory" >&2
                exit 2
            fi
            shift
            ;;
        -h | --help)
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
            exit 0
            ;;
        *)
            echo "error: unknown argument '$1'; accepted: --build-only, --bundle DIR" >&2
            exit 2
            ;;
    esac
    shift
done

features=(--no-default-features --features flex,cuda,fusion)
echo "== building with ${features[*]} (release)"
cargo test --release "${features[@]}" --test cubecl --test cubecl_unmarked --no-run
cargo build --release "${features[@]}" --example resnet --example transformer

if [[ -n "$bundle" ]]; then
    mkdir -p "$bundle"
    for test in cubecl cubecl_unmarked; do
        test_binary=$(cargo test --release "${features[@]}" --test "$test" --no-run --message-format json 2>/dev/null |
            sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
        if [[ -z "$test_binary" || ! -x "$test_binary" ]]; then
            echo "error: --bundle: cargo named no test binary for tests/$test.rs; run" \
                "cargo test --release ${features[*]} --test $test --no-run to see why" >&2
            exit 1
        fi
        strip -o "$bundle/$test" "$test_binary"
    done
    strip -o "$bundle/resnet" target/release/examples/resnet
    strip -o "$bundle/transformer" target/release/examples/transformer
    # The same checks as below, from the bundle (run from the repository's root).
    cat >"$bundle/run.sh" <<'RUN'
#!/usr/bin/env bash
# A failing test must fail its pipeline through tee.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# NVRTC, which CubeCL compiles kernels with, from the CUDA toolkit (never its stubs).
for lib in $(find /usr/local/cuda*/ -name 'libnvrtc.so*' 2>/dev/null | grep -v -e builtins -e stubs); do
    export LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}"
done
status=0
"$here/cubecl" cuda_ --test-threads 1 2>&1 | tee "$here/cubecl.log" || status=1
"$here/cubecl_unmarked" cuda_ --test-threads 1 2>&1 | tee -a "$here/cubecl.log" || status=1
if grep -q SKIPPED "$here/cubecl.log"; then
    echo "error: the CUDA tests skipped: no CUDA device opened" >&2
    status=1
fi
"$here/resnet" --backend cuda --verify || status=1
"$here/transformer" --backend cuda --verify || status=1
exit $status
RUN
    chmod +x "$bundle/run.sh"
    echo "== bundled in $bundle (run.sh runs it)"
    exit 0
fi

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
run cargo test --release "${features[@]}" --test cubecl_unmarked cuda_ -- --test-threads 1
if grep -q SKIPPED "$log"; then
    echo "error: the CUDA tests skipped: no CUDA device opened" | tee -a "$log" >&2
    status=1
fi
run cargo run --release "${features[@]}" --example resnet -- --backend cuda --verify
run cargo run --release "${features[@]}" --example transformer -- --backend cuda --verify
echo "== log in $log"
exit $status
