#!/usr/bin/env bash
# Each TOWERFLOW_BF16_KERNELS choice by name runs where this CPU and build can run it and is
# refused with the reason where not; the expectation is derived from what towerflow_devices
# reports of this CPU and build (its features, instruction sets, bf16 kernels built, oneDNN's
# instruction set), so the test is right on any CPU, and under TOWERFLOW_MAX_CPU_ISA.
#   check_bf16_choices.sh TOWERFLOW_DEVICES_BIN
set -uo pipefail
devices=$1
json=$(env -u TOWERFLOW_BF16_KERNELS "$devices" --json | tr -d '\n') || { echo "FAILED: $devices --json"; exit 1; }
features=$(grep -o '"cpu_features": *"[^"]*"' <<< "$json")
has_feature() { grep -qw -- "$1" <<< "$features"; }
supported=$(grep -o '"supported": *\[[^]]*\]' <<< "$json")
built=$(grep -o '"built": *\[[^]]*\]' <<< "$json" | tail -1)  # the bf16 kernels' (after the CPU's)
onednn_isa=$(grep -o '"onednn_isa": *"[^"]*"' <<< "$json" | cut -d'"' -f4)
avx512=0; grep -q '"avx512"' <<< "$supported" && avx512=1
failures=0
# expect CHOICE TEXT...: the output of towerflow_devices under the choice holds one of the TEXTs.
expect() {
  local choice=$1 out t; shift
  out=$(TOWERFLOW_BF16_KERNELS=$choice "$devices" 2>&1)
  for t in "$@"; do
    if grep -qF -- "$t" <<< "$out"; then echo "ok: $choice: $t"; return; fi
  done
  echo "FAILED: TOWERFLOW_BF16_KERNELS=$choice should say: $*"
  echo "  it said: $(grep -i 'bf16\|error' <<< "$out" | head -3)"
  failures=$((failures + 1))
}
is_built() { grep -q "\"$1\"" <<< "$built"; }
echo "this CPU: ${features#*:}; instruction sets ${supported#*:}; bf16 kernels built ${built#*:}; oneDNN: ${onednn_isa:-none}"

# refused KERNELS NAME: where this build lacks KERNELS or the CPU lacks AVX-512, the choice and its
# emulated twin are both refused, saying which; false where neither is so.
refused() {
  local kernels=$1 name=$2 why
  if ! is_built "$kernels"; then why="this build has none"
  elif [ $avx512 = 0 ]; then why="this CPU has no AVX-512"
  else return 1; fi
  expect "$kernels" "asks for towerflow's $name kernels, but $why"
  expect "$kernels-emulated" "asks for towerflow's $name kernels, but $why"
}

if ! refused avx512bf16 AVX512-BF16; then
  if has_feature avx512_bf16; then
    expect avx512bf16 "bf16 kernels (this machine): towerflow's AVX512-BF16 kernels (vdpbf16ps"
  else
    expect avx512bf16 "asks for towerflow's AVX512-BF16 kernels, but this CPU has no AVX512-BF16 (its features:"
  fi
  expect avx512bf16-emulated "bf16 kernels (this machine): towerflow's AVX512-BF16 kernels with vdpbf16ps emulated" \
                             "bf16 kernels (this machine): towerflow's AVX512-BF16 kernels with vdpbf16ps timed as one FMA"
fi

if ! refused amx AMX; then
  if has_feature amx_bf16 && has_feature amx_tile; then
    # The CPU has the tiles; whether Linux lets a process use them is the kernel's to say.
    expect amx "bf16 kernels (this machine): towerflow's AMX kernels (tdpbf16ps" \
               "Linux refused the AMX tile permission" "the operating system does not enable the AMX tile state"
  else
    expect amx "asks for towerflow's AMX kernels, but this CPU has no AMX-BF16"
  fi
  expect amx-emulated "bf16 kernels (this machine): towerflow's AMX kernels with the tiles emulated" \
                      "bf16 kernels (this machine): towerflow's AMX kernels without their tile instructions"
fi

expect emulated "bf16 kernels (this machine): emulated (TOWERFLOW_BF16_KERNELS=emulated)"
if [ -z "$onednn_isa" ]; then
  expect onednn "asks for oneDNN's bf16 kernels, but this build has no oneDNN"
elif [[ $onednn_isa == avx512_core* ]]; then
  expect onednn "bf16 kernels (this machine): oneDNN"
else
  expect onednn "asks for oneDNN's bf16 kernels, but oneDNN has only reference bf16 kernels for this CPU (its instruction set: $onednn_isa"
fi
echo "$failures failed"
[ $failures = 0 ]
