#!/usr/bin/env python3
"""bench/suite.py's choice of the second bf16 kernels (second_bf16_kernels) for the CPUs it must
handle: a CPU with AMX-BF16 or AVX512-BF16 where oneDNN's kernels are the automatic choice, one
where they are not, and --bf16-also given by name or turned off. Exit status 0 when all hold."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import suite  # noqa: E402

ONEDNN_AMX = {"bf16_kernels": "oneDNN 2.6.3, avx512_core_amx (AMX tiles; the best this CPU has)"}
ONEDNN_BF16 = {"bf16_kernels": "oneDNN 2.6.3, avx512_core_bf16 (AVX512-BF16 vdpbf16ps; the best this CPU has)"}
EMULATED = {"bf16_kernels": "emulated (this CPU has no AVX512-BF16 or AMX): operands rounded to bf16 ..."}
SAPPHIRE_RAPIDS = ["avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]
ZEN4 = ["avx512f", "avx512_bf16"]
ICE_LAKE = ["avx512f", "avx512_vnni"]

CASES = [
    ("auto", ONEDNN_AMX, SAPPHIRE_RAPIDS, "amx"),
    ("auto", ONEDNN_BF16, ZEN4, "avx512bf16"),
    ("auto", EMULATED, ICE_LAKE, None),
    ("auto", EMULATED, ZEN4, None),  # towerflow's own kernels are the automatic choice already
    ("none", ONEDNN_AMX, SAPPHIRE_RAPIDS, None),
    ("avx512bf16", ONEDNN_AMX, SAPPHIRE_RAPIDS, "avx512bf16"),
    ("amx-emulated", EMULATED, ICE_LAKE, "amx-emulated"),
]


def main():
    failures = 0
    for bf16_also, limits, extensions, want in CASES:
        got = suite.second_bf16_kernels(argparse.Namespace(bf16_also=bf16_also), limits, extensions)
        ok = got == want
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} --bf16-also {bf16_also}, {limits['bf16_kernels'][:40]}..., "
              f"{' '.join(extensions)}: {got!r} (want {want!r})")
    print(f"{len(CASES)} cases, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
