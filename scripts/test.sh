#!/usr/bin/env bash
# The test command: the whole suite on Flex and on wgpu (CubeCL, unfused and fused), with the
# data-parallel test over burn-collective and the remote tier's tests against a real
# redis-server. Without a GPU, wgpu runs on Mesa's lavapipe Vulkan
# driver (on the CPU); it is installed here, by package name, when no Vulkan driver is present.
# Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

have_vulkan() {
    compgen -G "/usr/share/vulkan/icd.d/*.json" >/dev/null &&
        { compgen -G "/usr/lib/*/libvulkan.so.1" >/dev/null || [ -e /usr/lib/libvulkan.so.1 ]; }
}

if ! have_vulkan; then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=""
        if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
        echo "scripts/test.sh: installing Mesa's lavapipe Vulkan driver for the wgpu tests"
        $sudo apt-get update -qq
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1
    else
        echo "scripts/test.sh: no Vulkan driver and no apt-get: the wgpu tests will skip"
    fi
fi

# The remote cold tier's tests start a real redis-server; without one they skip, saying so.
if ! command -v redis-server >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=""
        if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
        echo "scripts/test.sh: installing redis-server for the remote tier's tests"
        $sudo apt-get update -qq
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
    else
        echo "scripts/test.sh: no redis-server and no apt-get: the remote tier's tests will skip"
    fi
fi

cargo test --features wgpu,fusion,collective,remote "$@"
