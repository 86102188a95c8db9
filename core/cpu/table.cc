// This instruction set's kernel table (kernel_table.h), compiled with the kernels.
#include "core/cpu/kernel_table.h"

#define TW_CAT_(a, b) a##b
#define TW_CAT(a, b) TW_CAT_(a, b)

namespace towerflow::cpu::TW_ISA {
// The kernels, defined in this namespace by conv.cc, pool.cc, batch_norm.cc, gemm.cc and elementwise.cc.
#define TW_KERNEL_DECLARATION(name) decltype(cpu::name) name;
TW_CPU_KERNELS(TW_KERNEL_DECLARATION)
#undef TW_KERNEL_DECLARATION
}  // namespace towerflow::cpu::TW_ISA

extern "C" const towerflow::cpu::KernelTable TW_CAT(towerflow_cpu_kernels_, TW_ISA) = {
#define TW_KERNEL_ENTRY(name) .name = &towerflow::cpu::TW_ISA::name,
    TW_CPU_KERNELS(TW_KERNEL_ENTRY)
#undef TW_KERNEL_ENTRY
};
