#pragma once
// The bf16 kernels of bf16.h built on AMX tiles (tdpbf16ps; private to core/cpu; Note [bf16 AMX
// kernels] in bf16_amx.cc). bf16_amx.cc is compiled twice, into objects of their own as the
// kernel tables of kernel_table.h are: with AMX-TILE and AMX-BF16 (towerflow_bf16_amx), and for
// AVX-512F alone with the tiles emulated (towerflow_bf16_amx_emulated). The build defines
// TW_HAVE_BF16_AMX where it compiles them (x86-64 with a compiler that knows -mamx-bf16).
//
// Contract: bf16.h's, for the kernels it names; callers have checked the CPU (cpu_has_amx_bf16()
// for the first table, which also asks Linux for the tile permission; AVX-512F, BW, DQ and VL for
// both).

#include "core/cpu/bf16_pairs.h"

#if defined(TW_HAVE_BF16_AMX)
extern "C" const towerflow::cpu::Bf16KernelTable towerflow_bf16_amx;
extern "C" const towerflow::cpu::Bf16KernelTable towerflow_bf16_amx_emulated;
#endif
