#!/usr/bin/env bash
# Runs a test as on an older CPU: TOWERFLOW_MAX_CPU_ISA=LEVEL hides the instructions above LEVEL
# from towerflow and oneDNN (core/cpu/isa.h), so the test's expectations, derived from what the
# CPU reports, are those of that CPU. Exit 77 (skipped) where this CPU does not reach LEVEL.
#   run_as_cpu.sh LEVEL TOWERFLOW_DEVICES_BIN TEST [args...]
# LEVEL: baseline (x86-64-v2), avx2, avx512 (Ice Lake), avx512_bf16 (Zen 4), amx (Sapphire Rapids).
set -euo pipefail
level=$1 devices=$2; shift 2
report() {  # the JSON of towerflow_devices, one line
  "$devices" --json | tr -d '\n'
}
json=$(env -u TOWERFLOW_MAX_CPU_ISA -u ONEDNN_MAX_CPU_ISA -u TOWERFLOW_CPU_ISA -u TOWERFLOW_BF16_KERNELS "$devices" --json | tr -d '\n')
features=$(grep -o '"cpu_features": *"[^"]*"' <<< "$json")
supported=$(grep -o '"supported": *\[[^]]*\]' <<< "$json")
has() { grep -qw -- "$1" <<< "$features"; }
case "$level" in
  baseline) reach=$(grep -c '"baseline"' <<< "$supported" || true) ;;
  avx2) reach=$(grep -c '"avx2"' <<< "$supported" || true) ;;
  avx512) reach=$(grep -c '"avx512"' <<< "$supported" || true) ;;
  avx512_bf16) reach=0; grep -q '"avx512"' <<< "$supported" && has avx512_bf16 && reach=1 ;;
  amx) reach=0; grep -q '"avx512"' <<< "$supported" && has amx_tile && has amx_bf16 && reach=1 ;;
  *) echo "run_as_cpu.sh: unknown level $level" >&2; exit 2 ;;
esac
if [ "$reach" = 0 ]; then
  echo "SKIPPED: this CPU does not reach $level (its features: ${features#*:})"
  exit 77
fi
export TOWERFLOW_MAX_CPU_ISA=$level
unset ONEDNN_MAX_CPU_ISA TOWERFLOW_CPU_ISA TOWERFLOW_BF16_KERNELS
# The level holds: no hidden feature shows, and oneDNN stays below it too.
held=$(report)
held_features=$(grep -o '"cpu_features": *"[^"]*"' <<< "$held")
onednn=$(grep -o '"onednn_isa": *"[^"]*"' <<< "$held" | cut -d'"' -f4)
hidden=()
case "$level" in
  baseline) hidden=(avx avx2 fma avx512f avx512_bf16 amx_tile) ;;
  avx2) hidden=(avx512f avx512_bf16 amx_tile) ;;
  avx512) hidden=(avx512_bf16 amx_tile) ;;
  avx512_bf16) hidden=(amx_tile) ;;
esac
for f in "${hidden[@]}"; do
  if grep -qw -- "$f" <<< "$held_features"; then
    echo "FAILED: TOWERFLOW_MAX_CPU_ISA=$level still shows $f: ${held_features#*:}"; exit 1
  fi
done
case "$level:$onednn" in
  baseline:avx* | avx2:avx512* | avx512:avx512_core_bf16 | avx512:avx512_core_amx | avx512_bf16:avx512_core_amx)
    echo "FAILED: TOWERFLOW_MAX_CPU_ISA=$level left oneDNN at $onednn"; exit 1 ;;
esac
echo "held to $level: features ${held_features#*:}; oneDNN ${onednn:-none}"
exec "$@"
