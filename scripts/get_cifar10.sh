#!/usr/bin/env bash
# Downloads CIFAR-10 (or CIFAR-100) in its official binary form, checks the archive's published
# MD5, unpacks it and prints the --data_dir to give cifar10_train.
#   scripts/get_cifar10.sh [--cifar100] [--url URL] [--md5 SUM] [DIR]      (DIR default: data)
# An interrupted download resumes where it stopped when run again (DIR/<archive>.part).
# TOWERFLOW_CIFAR_URL and TOWERFLOW_CIFAR_MD5 (or --url, --md5) replace the official address and
# checksum: a mirror, or a file:// URL of an archive already on this machine.
set -euo pipefail

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

name=cifar10
url=${TOWERFLOW_CIFAR_URL:-}
md5=${TOWERFLOW_CIFAR_MD5:-}
dir=
while [ $# -gt 0 ]; do
  case $1 in
    --cifar100) name=cifar100 ;;
    --cifar10) name=cifar10 ;;
    --url) [ $# -ge 2 ] || usage; url=$2; shift ;;
    --url=*) url=${1#--url=} ;;
    --md5) [ $# -ge 2 ] || usage; md5=$2; shift ;;
    --md5=*) md5=${1#--md5=} ;;
    -h|--help) usage ;;
    -*) echo "error: unknown option $1" >&2; usage ;;
    *) [ -z "$dir" ] || usage; dir=$1 ;;
  esac
  shift
done
dir=${dir:-data}

# The official archives and the MD5 sums published on https://www.cs.toronto.edu/~kriz/cifar.html
if [ "$name" = cifar10 ]; then
  archive=cifar-10-binary.tar.gz
  official_md5=c32a1d4ab5d03f1284b67883e8d87530
  folder=cifar-10-batches-bin
  files="data_batch_1.bin data_batch_2.bin data_batch_3.bin data_batch_4.bin data_batch_5.bin test_batch.bin"
else
  archive=cifar-100-binary.tar.gz
  official_md5=03b5dce01913d631647c71ecec9e9cb8
  folder=cifar-100-binary
  files="train.bin test.bin"
fi
url=${url:-https://www.cs.toronto.edu/~kriz/$archive}
md5=${md5:-$official_md5}

mkdir -p "$dir"
target=$dir/$archive
part=$target.part

have_all() { for f in $files; do [ -s "$dir/$folder/$f" ] || return 1; done; }

if have_all && [ ! -e "$part" ]; then
  echo "$dir/$folder already holds $name" >&2
else
  if [ ! -e "$target" ]; then
    echo "downloading $url" >&2
    rc=0
    if command -v curl > /dev/null; then
      # -C -: continue from the end of the partial file; --fail: an HTTP error is an error.
      progress=-sS
      [ -t 2 ] && progress=-#
      curl --fail --location --retry 3 --connect-timeout 20 "$progress" -C - -o "$part" "$url" || rc=$?
    elif command -v wget > /dev/null; then
      wget --continue --tries=3 --timeout=20 --no-verbose -O "$part" "$url" || rc=$?
    else
      echo "error: neither curl nor wget is installed; install one (apt-get install curl)" >&2
      exit 1
    fi
    if [ "$rc" -ne 0 ]; then
      size=$(stat -c %s "$part" 2> /dev/null || echo 0)
      [ "$size" -gt 0 ] || rm -f "$part"
      {
        echo "error: could not download $url (exit status $rc)."
        echo "  Is this machine offline, or is the address wrong? $size bytes are in $part;"
        echo "  run the same command again to resume. Without internet, download $archive"
        echo "  elsewhere and run: scripts/get_cifar10.sh$( [ "$name" = cifar100 ] && echo ' --cifar100') --url file:///path/to/$archive $dir"
      } >&2
      exit 1
    fi
    mv "$part" "$target"
  fi
  actual=$(md5sum "$target" | cut -d' ' -f1)
  if [ "$actual" != "$md5" ]; then
    {
      echo "error: checksum mismatch for $target:"
      echo "  expected MD5 $md5"
      echo "  actual   MD5 $actual"
      echo "  The download is corrupt or is not $archive. Delete it and download it again:"
      echo "  rm $target && scripts/get_cifar10.sh$( [ "$name" = cifar100 ] && echo ' --cifar100') $dir"
      [ "$url" = "https://www.cs.toronto.edu/~kriz/$archive" ] ||
        echo "  (An archive from another address than the official one may need its own sum: --md5 SUM.)"
    } >&2
    exit 1
  fi
  echo "MD5 $actual matches; unpacking into $dir/$folder" >&2
  tar -xzf "$target" -C "$dir"
  if ! have_all; then
    echo "error: $target did not hold $folder/{$(echo $files | tr ' ' ,)}; is it the binary version?" >&2
    exit 1
  fi
fi
echo "ready: train with --data_dir $dir/$folder" >&2
echo "$dir/$folder"
