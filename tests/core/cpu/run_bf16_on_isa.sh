#!/usr/bin/env bash
# Runs the bf16 kernel tests with oneDNN held to one instruction set (ONEDNN_MAX_CPU_ISA); exit 77
# (skipped) when oneDNN cannot use that set here (an older CPU, or a build without oneDNN).
#   run_bf16_on_isa.sh ISA TOWERFLOW_DEVICES_BIN TEST_BIN [args...]
# ISA is oneDNN's name in lower case: avx512_core_amx, avx512_core_bf16 or avx512_core.
set -euo pipefail
isa=$1 devices=$2; shift 2
json=$(ONEDNN_MAX_CPU_ISA=${isa^^} "$devices" --json | tr -d ' \n')
if ! grep -q "\"onednn_isa\":\"$isa\"" <<< "$json"; then
  echo "SKIPPED: oneDNN cannot use $isa here ($(grep -o '"onednn_isa":"[^"]*"' <<< "$json"))"
  exit 77
fi
ONEDNN_MAX_CPU_ISA=${isa^^} exec "$@"
