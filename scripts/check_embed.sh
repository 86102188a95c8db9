#!/usr/bin/env bash
# CI check of the installed package: installs a built tree (default build/) into a temporary
# prefix, configures examples/embed against it with find_package(towerflow), builds it, and runs
# a few seconds of training with it.
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
(cd "$tmp" && "$tmp/embed/embed" 20)
test -s "$tmp/embed_model.safetensors"
echo "check_embed: the installed package builds and trains"
