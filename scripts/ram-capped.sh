#!/usr/bin/env bash
# "Half the hardware", made physical on this machine: the resnet example trains, one side per
# process, under a data-segment cap (RLIMIT_DATA) of half the plain run's resident peak. Plain
# Flex fails to allocate; spilled with budget 0 and host limit 0 (the disk tier) completes with
# the plain losses bit for bit. Prints both resident peaks. The same check runs in the test
# suite (`tests/examples.rs`); it skips, saying why, where the cap is not enforced.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --examples
cargo test --test examples under_half_the_memory -- --nocapture
