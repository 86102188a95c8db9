#!/usr/bin/env bash
# Runs a test binary with the CPU kernels forced to one instruction set; exit 77 (skipped) when
# this CPU cannot run it.
#   run_on_isa.sh ISA TOWERFLOW_DEVICES_BIN TEST_BIN [args...]
set -euo pipefail
isa=$1 devices=$2; shift 2
json=$("$devices" --json | tr -d ' \n')
if ! grep -q "\"supported\":\[[^]]*\"$isa\"" <<< "$json"; then
  echo "SKIPPED: this CPU cannot run the $isa kernels ($(grep -o '"cpu_features":"[^"]*"' <<< "$json"))"
  exit 77
fi
TOWERFLOW_CPU_ISA=$isa exec "$@"
