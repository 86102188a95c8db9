#pragma once
// Which instructions the CPU kernels use: chosen once, at run time, from what the CPU and the
// operating system support, so that one portable build trains at the speed of the machine it
// runs on (as oneDNN, OpenBLAS and PyTorch do).
//
// The kernels of conv.h, pool.h, batch_norm.h and gemm.h are compiled once per instruction set
// (kernel_table.h): on x86-64
//   baseline  x86-64-v2: SSE4.2 and POPCNT (every x86-64 CPU since about 2009)
//   avx2      x86-64-v3: AVX2, FMA, BMI1/2, F16C, MOVBE, LZCNT (Intel Haswell, AMD Zen and later)
//   avx512    x86-64-v4: AVX-512 F, BW, CD, DQ and VL (Intel Skylake-SP, AMD Zen 4 and later)
// (those -DTOWERFLOW_CPU_ISAS lists, all three by default) and elsewhere once, as "generic".
// The best set that is built, that CPUID reports and whose register state the OS saves
// (XGETBV) is used, unless TOWERFLOW_CPU_ISA=baseline|avx2|avx512 asks for a lower one. A CPU without even the baseline set gets DeviceError naming the missing
// instructions at the first kernel call, never an illegal instruction.
//
// TOWERFLOW_MAX_CPU_ISA=baseline|avx2|avx512|avx512_bf16|amx hides the instructions above that
// level from every function here, as if the CPU had no more (Note [Holding the CPU to a lower
// level] in isa.cc), and holds oneDNN to the same level unless ONEDNN_MAX_CPU_ISA names its own:
// towerflow then behaves as on an older CPU. InvalidArgument from active_isa() for another value.
//
// A build made with -DTOWERFLOW_NATIVE=ON compiles the rest of the library for the building
// machine; started on a CPU that lacks those instructions, it stops before main() with a message
// naming them (and the portable build as the fix).

#include <optional>
#include <string>
#include <vector>

namespace towerflow::cpu {

enum class Isa { Generic, Baseline, Avx2, Avx512 };

const char* isa_name(Isa isa);                 // "generic", "baseline", "avx2", "avx512"
std::vector<Isa> built_isas();                 // in this build, lowest first
// The instruction sets this CPU and OS can run, among the built ones, lowest first.
std::vector<Isa> supported_isas();
// The one the kernels use (the environment is read once, at the first call). DeviceError when
// none is supported; InvalidArgument for a TOWERFLOW_CPU_ISA that names no built set.
Isa active_isa();
// For the start-up block and towerflow_devices: "avx512 (the best this CPU supports)" or
// "avx2 (TOWERFLOW_CPU_ISA=avx2; the CPU supports avx512)".
std::string describe_active_isa();
// Whether the CPU has AVX512-BF16 (vdpbf16ps) with the AVX-512 registers saved by the OS: the bf16
// pair kernels of bf16.h run there. False where the build does not target x86-64.
bool cpu_has_avx512_bf16();
// Whether AMX-BF16 tiles can run here: the CPU has AMX-TILE and AMX-BF16 (Intel Sapphire Rapids
// and later), the OS saves the tile state, and Linux granted this process the tile data (asked
// once, at the first call: Note [AMX permission] in isa.cc). The AMX kernels of bf16.h run there.
bool cpu_has_amx_bf16();
// Why not, e.g. "this CPU has no AMX-BF16"; empty where cpu_has_amx_bf16().
std::string amx_unavailable();
// The instruction-set features the CPU reports, e.g. "sse4.2 avx avx2 fma avx512f avx512bw ...".
std::string cpu_features();
// The level TOWERFLOW_MAX_CPU_ISA holds the CPU to ("baseline", "avx2", "avx512", "avx512_bf16",
// "amx"), or empty where it is unset or names no level (active_isa() raises for that).
std::string max_cpu_isa();

// Tests: use this set (InvalidArgument when it is not built or not supported here), or go back
// to the automatic choice with nullopt. Not thread-safe with running kernels.
void force_isa_for_testing(std::optional<Isa> isa);

}  // namespace towerflow::cpu
