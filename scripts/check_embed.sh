#!/usr/bin/env bash
# CI check of the installed package: installs a built tree (default build/) into a temporary
# prefix, configures examples/embed against it with find_package(towerflow), builds it, and runs
# its programs: a one-epoch run, the same run resumed for a second epoch, and a custom model on
# two towers.
#   scripts/check_embed.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S examples/embed -B "$tmp/embed" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/embed" -j"$(nproc)"
(cd "$tmp" && "$tmp/embed/embed" 1) | tee "$tmp/run1.log"
grep -q "after 32 steps" "$tmp/run1.log"
(cd "$tmp" && "$tmp/embed/embed" 2) | tee "$tmp/run2.log"
grep -q "resumed .*ckpt-0000000032 (step 32)" "$tmp/run2.log"   # continued, not restarted
grep -q "after 64 steps" "$tmp/run2.log"
test -s "$tmp/embed_run/ckpt-0000000064/model.safetensors"
test "$(grep -c test_acc "$tmp/embed_run/metrics.jsonl")" -eq 2   # one evaluation per epoch, one run
(cd "$tmp" && "$tmp/embed/custom_model" 2) | tee "$tmp/custom.log"
grep -q "SmallNet on 2 towers: test accuracy" "$tmp/custom.log"
echo "check_embed: the installed package builds, trains, resumes and trains a custom model"
