#!/usr/bin/env bash
# Gathers what a GPU build of towerflow needs that a CUDA image lacks, for a GPU node with no
# package registry (tests/gpu/run_gpu_checks.sh --bundle OUT; docs/gpus.md). Run it on a Debian 12
# machine that reaches Debian's packages; it writes OUT/ (about 24 MiB) and OUT.tar.xz (about
# 3 MiB), either of which travels.
#
#   scripts/gpu_bundle.sh OUT
#
# What it holds: Debian 12's packages unpacked into OUT/usr (their CMake configs are relocatable):
# Eigen, nlohmann-json, CLI11 and Catch2 2 (header-only), protobuf's headers, shared libraries
# and protoc, libjpeg, libpng and zlib (the data module reads image folders), and the part of
# Boost's headers that Boost.CRC includes (found by the compiler), with Boost's CMake config for
# its headers. What it leaves out: the CUDA toolkit, cuDNN and NCCL (the node's own, or its
# Python's nvidia-* wheels), and what the GPU checks do not build with (oneDNN, Open MPI, Google
# Benchmark: each optional).
#
# Debian 12's shared libraries (protobuf's) need glibc 2.34 and GCC 11's libstdc++ (GLIBCXX_3.4.29)
# or newer: measured, protoc runs in Debian 13 (glibc 2.41) and fails in Debian 11 (glibc 2.31);
# Ubuntu 22.04 and 24.04 and RHEL 9 have what it needs. run_gpu_checks.sh --only probe says whether
# the node does.
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,8p' "$0"; exit 2; }
out=$(realpath -m "$1")
src=$(cd "$(dirname "$0")/.." && pwd)
packages=(libeigen3-dev nlohmann-json3-dev libcli11-dev catch2 libprotobuf-dev libprotobuf32 libprotoc32
          protobuf-compiler libboost1.74-dev libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16
          zlib1g-dev zlib1g)
for tool in apt-get dpkg-deb g++; do
  command -v $tool > /dev/null || { echo "gpu_bundle: needs $tool (a Debian 12 machine with g++)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "gpu_bundle: downloading ${packages[*]}"
if ! (cd "$tmp" && apt-get download -qq "${packages[@]}" > /dev/null 2>&1); then
  [ "$(id -u)" -eq 0 ] && apt-get update -qq
  (cd "$tmp" && apt-get download -qq "${packages[@]}")
fi
rm -rf "$out" "$out.tar.xz"
mkdir -p "$tmp/root" "$out"
for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done

# Boost: the headers <boost/crc.hpp> includes, as this compiler resolves them, all of
# boost/config (which picks its headers by compiler and library: the node's may differ), and the
# CMake package of Boost's headers.
boost=$(g++ -std=c++20 -M -I"$tmp/root/usr/include" -x c++ - <<< '#include <boost/crc.hpp>' |
        tr ' \\' '\n\n' | grep "^$tmp/root/usr/include/boost/" | sort -u)
[ -n "$boost" ] || { echo "gpu_bundle: could not list Boost.CRC's headers" >&2; exit 1; }
keep_boost=$tmp/boost-kept
mkdir -p "$keep_boost"
for h in $boost boost/version.hpp; do
  rel=${h#"$tmp/root/usr/include/"}
  mkdir -p "$keep_boost/$(dirname "$rel")"
  cp "$tmp/root/usr/include/$rel" "$keep_boost/$rel"
done
cp -r "$tmp/root/usr/include/boost/config" "$keep_boost/boost/"
rm -rf "$tmp/root/usr/include/boost"
mv "$keep_boost/boost" "$tmp/root/usr/include/boost"
lib=$tmp/root/usr/lib/x86_64-linux-gnu
find "$lib/cmake" -mindepth 1 -maxdepth 1 ! -name 'Boost-*' ! -name 'boost_headers-*' ! -name 'BoostDetectToolset-*' \
  -exec rm -rf {} +

# What the build does not read: documentation, static archives, Boost's other libraries.
rm -rf "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man" "$tmp/root/usr/share/lintian"
find "$tmp/root" \( -name '*.a' ! -name 'libCatch2*' -o -name 'libboost_*' \) -delete  # Catch2's config names its own
# Multiarch paths a Debian compiler searches by itself and another does not: zlib's library
# (under /lib) beside the others, libjpeg's jconfig.h beside its headers.
cp -a "$tmp/root"/lib/x86_64-linux-gnu/libz.so.1* "$lib/"
ln -sf libz.so.1 "$lib/libz.so"
mv "$tmp/root"/usr/include/x86_64-linux-gnu/* "$tmp/root/usr/include/"
rmdir "$tmp/root/usr/include/x86_64-linux-gnu"
find "$tmp/root/usr" -xtype l -delete  # links to packages not taken (protobuf-lite)
cp -a "$tmp/root/usr" "$out/usr"
{
  echo "towerflow GPU bundle: Debian 12 packages unpacked (see scripts/gpu_bundle.sh)"
  echo "made: $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "towerflow commit: $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  for deb in "$tmp"/*.deb; do dpkg-deb -f "$deb" Package Version | paste -sd' '; done
} > "$out/BUNDLE.txt"
tar -C "$(dirname "$out")" -cJf "$out.tar.xz" "$(basename "$out")"
echo "gpu_bundle: $out ($(du -sm "$out" | cut -f1) MiB), $out.tar.xz ($(du -k "$out.tar.xz" | awk '{printf "%.1f", $1/1024}') MiB)"
