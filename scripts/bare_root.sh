#!/usr/bin/env bash
# Runs a command in a bare Debian 12: a fresh copy of `debootstrap --variant=minbase bookworm`,
# with nothing installed but what the command installs. The source tree (its tracked files and
# the untracked ones git does not ignore) is copied to /src, the command runs there as root, and
# the root is deleted afterwards. CI builds and tests in one (.ci/run), so that a package the
# scripts forget to install fails CI instead of a user's first build.
#
#   scripts/bare_root.sh COMMAND [ARGS...]       e.g. scripts/bare_root.sh scripts/build.sh
#
# What the bare root shares with this machine, and nothing else:
# - the CUDA toolkit: /usr/local/cuda (where it exists), bind-mounted read-only, so that the CUDA
#   code is compiled there as here;
# - the network's settings: /etc/resolv.conf, the proxy variables, pip's index variables, and the
#   certificate authorities this machine trusts, for pip (PIP_CERT) on networks that inspect TLS;
# - /proc, /sys, /dev and a fresh /dev/shm (Open MPI's shared memory), in a mount namespace of
#   its own, so that nothing stays mounted when the command ends, however it ends;
# - the CI variable; TOWERFLOW_BARE_ROOT=1 tells the command where it runs.
# Needs root, debootstrap (installed here if missing) and Debian's package mirror.
#
# Environment:
#   TOWERFLOW_BARE_ROOT_CACHE   the debootstrap result, kept between runs (default
#                               /var/cache/towerflow/debian12-minbase.tar; only a bare Debian is
#                               cached, never the project's dependencies). Delete it to refresh.
#   TOWERFLOW_DEBIAN_MIRROR     default http://deb.debian.org/debian
#   TOWERFLOW_BARE_ROOT_KEEP=1  keep the root afterwards (its path is printed)
#   TOWERFLOW_BARE_ROOT_CARRY   paths in the source tree that git ignores, copied to /src too
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || { sed -n '2,9p' "$0"; exit 2; }
if [ "$(id -u)" -ne 0 ]; then
  echo "bare_root: needs root (debootstrap, chroot and mounts); run it with sudo" >&2
  exit 2
fi
cache=${TOWERFLOW_BARE_ROOT_CACHE:-/var/cache/towerflow/debian12-minbase.tar}
mirror=${TOWERFLOW_DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [ ! -s "$cache" ]; then
  if ! command -v debootstrap > /dev/null; then
    echo "bare_root: installing debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
  fi
  t0=$(date +%s)
  tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/towerflow-debootstrap.XXXXXX")
  echo "bare_root: debootstrap --variant=minbase bookworm from $mirror (once; cached in $cache)"
  debootstrap --variant=minbase bookworm "$tmp" "$mirror" > "$tmp.log" 2>&1 ||
    { tail -20 "$tmp.log" >&2; echo "bare_root: debootstrap failed (log: $tmp.log)" >&2; exit 1; }
  # A Debian 12 as installed: its updates and security suites beside the release.
  security=${mirror%/debian}/debian-security
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
    "$mirror" "$mirror" "$security" > "$tmp/etc/apt/sources.list"
  rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp.log"
  mkdir -p "$(dirname "$cache")"
  tar -C "$tmp" -cf "$cache.part" . && mv "$cache.part" "$cache"
  rm -rf --one-file-system "$tmp"
  echo "bare_root: minimal Debian 12 made in $(( $(date +%s) - t0 )) s"
fi

root=$(mktemp -d "${TMPDIR:-/var/tmp}/towerflow-bare-root.XXXXXX")
chmod 755 "$root"  # a root file system: its users (apt's _apt) must reach it
cleanup() {
  # The mounts lived in the namespace below and ended with it; refuse to delete through one anyway.
  if grep -q " $root/" /proc/self/mountinfo; then
    echo "bare_root: $root still has mounts; not deleting it" >&2
  elif [ "${TOWERFLOW_BARE_ROOT_KEEP:-0}" = 1 ]; then
    echo "bare_root: kept $root"
  else
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT
tar -C "$root" -xf "$cache"
mkdir -p "$root/src"
if git -C "$src" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  git -C "$src" ls-files -z --cached --others --exclude-standard |
    (cd "$src" && tar --null --no-recursion -T - -cf -) | tar -C "$root/src" -xf -
else  # a source tree without git: all of it but build folders
  tar -C "$src" --exclude='./build*' --exclude=./.venv -cf - . | tar -C "$root/src" -xf -
fi
for extra in ${TOWERFLOW_BARE_ROOT_CARRY:-}; do
  (cd "$src" && tar -cf - "$extra") | tar -C "$root/src" -xf -
done
cp /etc/resolv.conf "$root/etc/resolv.conf"
env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
     TERM=dumb DEBIAN_FRONTEND=noninteractive TOWERFLOW_BARE_ROOT=1)
for v in CI http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY PIP_INDEX_URL \
         PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT; do
  [ -n "${!v:-}" ] && env+=("$v=${!v}")
done
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/host-ca-certificates.crt"
  env+=(PIP_CERT=/etc/host-ca-certificates.crt)
fi
cuda=""
[ -d /usr/local/cuda/bin ] && cuda=$(readlink -f /usr/local/cuda)

# The command's arguments travel as positional parameters, not through a quoted string.
unshare --mount --propagation private -- bash -euc '
  root=$1 cuda=$2; shift 2
  mount -t proc proc "$root/proc"
  mount -t sysfs sysfs "$root/sys"
  mount --bind /dev "$root/dev"
  mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts" 2> /dev/null || mount --bind /dev/pts "$root/dev/pts"
  mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
  if [ -n "$cuda" ]; then
    mkdir -p "$root/usr/local/cuda"
    mount --bind "$cuda" "$root/usr/local/cuda"
    mount -o remount,bind,ro "$root/usr/local/cuda"
  fi
  exec chroot "$root" /usr/bin/env -i "$@"
' bare_root "$root" "$cuda" "${env[@]}" bash -c 'cd /src && exec "$@"' command "$@"
