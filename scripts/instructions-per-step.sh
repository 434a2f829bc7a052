#!/usr/bin/env bash
# Instructions one training step executes, counted by callgrind: a measure of the engine's
# per-op cost that depends far less on how busy the machine is (wall-clock ratios on a shared
# machine swing by tenths between runs of one binary). These counts still spread by about 0.5%
# between runs of one binary: Burn's autodiff keeps hash maps with a random seed, and an
# asynchronous engine's evictions depend on timing. REPS=n runs each mode n times and prints the
# median too; to compare two builds, alternate them, or compare per-function self costs
# (callgrind_annotate), which do not move.
#
#   scripts/instructions-per-step.sh [model] [modes...]
#   scripts/instructions-per-step.sh transformer plain none 200 30
#
# Each mode is a `step_profile` budget (`plain`, `none`, or a percentage of the plain peak).
# Runs 20 and 60 steps and prints the difference over 40, so that start-up, calibration and the
# first steps' planning are left out. Divide by the "ops in the last recorded step" that
# `step_profile` prints for a cost per op. Needs valgrind (`apt-get install -y valgrind`).
# STEP_PROFILE=path runs another build of the bench (an older commit's, for a comparison).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-transformer}
shift || true
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(plain none 200)
command -v valgrind >/dev/null || { echo "valgrind is needed: apt-get install -y valgrind" >&2; exit 1; }
bin=${STEP_PROFILE:-}
if [ -z "$bin" ]; then
  cargo bench --bench step_profile --no-run -q 2>/dev/null
  bin=$(ls -t target/release/deps/step_profile-* | grep -v '\.d$' | head -1)
fi
count() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$model" "$1" "$2" 2>&1 \
    | awk '/Collected/ { gsub(",", "", $4); print $4 }'
}
reps=${REPS:-1}
for mode in "${modes[@]}"; do
  runs=()
  for _ in $(seq "$reps"); do
    short=$(count "$mode" 20)
    long=$(count "$mode" 60)
    runs+=($(( (long - short) / 40 )))
  done
  if [ "$reps" -eq 1 ]; then
    echo "$model $mode: ${runs[0]} instructions per step"
  else
    median=$(printf '%s\n' "${runs[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    echo "$model $mode: $median instructions per step (median of $reps: ${runs[*]})"
  fi
done
