// Compiled for the baseline instruction set whatever the build's flags (core/cpu/CMakeLists.txt):
// it runs before anything else to decide what may run.
#include "core/cpu/isa.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>

#include "core/cpu/kernel_table.h"
#include "core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

// The kernel tables of the instruction sets this build compiled (table.cc): on x86-64 those
// TOWERFLOW_CPU_ISAS names, all three by default (core/cpu/CMakeLists.txt).
#if defined(TW_CPU_ISAS_X86)
#if defined(TW_CPU_ISA_BUILT_BASELINE)
extern "C" const towerflow::cpu::KernelTable towerflow_cpu_kernels_baseline;
#endif
#if defined(TW_CPU_ISA_BUILT_AVX2)
extern "C" const towerflow::cpu::KernelTable towerflow_cpu_kernels_avx2;
#endif
#if defined(TW_CPU_ISA_BUILT_AVX512)
extern "C" const towerflow::cpu::KernelTable towerflow_cpu_kernels_avx512;
#endif
#else
extern "C" const towerflow::cpu::KernelTable towerflow_cpu_kernels_generic;
#endif

namespace towerflow::cpu {
namespace detail {
extern const bool kBuiltForAvx2, kBuiltForFma, kBuiltForAvx512f, kBuiltForAvx512bw, kBuiltForAvx512vl;
}
namespace {

struct Features {
  bool sse42 = false, popcnt = false, ssse3 = false, sse41 = false, cx16 = false;
  bool avx = false, avx2 = false, fma = false, bmi1 = false, bmi2 = false, f16c = false, movbe = false, lzcnt = false;
  bool avx512f = false, avx512bw = false, avx512cd = false, avx512dq = false, avx512vl = false;
  bool avx512_bf16 = false, amx_tile = false, amx_bf16 = false;
  bool os_avx = false, os_avx512 = false, os_amx = false;  // XGETBV: the OS saves the registers
};

Features detect() {
  Features f;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.sse41 = c & (1u << 19);
  f.sse42 = c & (1u << 20);
  f.ssse3 = c & (1u << 9);
  f.cx16 = c & (1u << 13);
  f.popcnt = c & (1u << 23);
  f.fma = c & (1u << 12);
  f.movbe = c & (1u << 22);
  f.f16c = c & (1u << 29);
  f.avx = c & (1u << 28);
  const bool osxsave = c & (1u << 27);
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.os_avx = (lo & 0x6) == 0x6;      // XMM and YMM state
    f.os_avx512 = (lo & 0xe6) == 0xe6; // and opmask, ZMM_Hi256, Hi16_ZMM
    f.os_amx = (lo & 0x60000) == 0x60000;  // XTILECFG and XTILEDATA
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.bmi1 = b & (1u << 3);
    f.avx2 = b & (1u << 5);
    f.bmi2 = b & (1u << 8);
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512cd = b & (1u << 28);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.amx_bf16 = d & (1u << 22);
    f.amx_tile = d & (1u << 24);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = a & (1u << 5);
  if (__get_cpuid(0x80000001, &a, &b, &c, &d)) f.lzcnt = c & (1u << 5);
#endif
  return f;
}

// out += ", " + text, with no separator first (written out: GCC 12's -Wrestrict misreads
// the inlined `"..." + std::string` here).
void append(std::string& out, const char* separator, const char* text) {
  if (!out.empty()) out += separator;
  out += text;
}

// Note [Holding the CPU to a lower level]
// TOWERFLOW_MAX_CPU_ISA=baseline|avx2|avx512|avx512_bf16|amx makes towerflow see this CPU as one
// with at most that level's instructions, as ONEDNN_MAX_CPU_ISA does for oneDNN: baseline is an
// x86-64-v2 CPU, avx2 one without AVX-512, avx512 one without AVX512-BF16 (Intel Ice Lake),
// avx512_bf16 one without AMX (AMD Zen 4). Every choice that reads the features (the CPU kernels,
// the bf16 kernels) follows, and so does every test that derives its expectation from them: the
// suite runs under each level the CPU reaches (tests/CMakeLists.txt), so one machine checks the
// expectations of the lower ones. A value that names no level is reported by active_isa().
constexpr const char* kLevels[] = {"baseline", "avx2", "avx512", "avx512_bf16", "amx"};

// The level TOWERFLOW_MAX_CPU_ISA asks for (an index into kLevels), -1 for none, -2 for a bad value.
int max_level() {
  const char* env = std::getenv("TOWERFLOW_MAX_CPU_ISA");
  if (!env || !*env) return -1;
  for (int i = 0; i < int(std::size(kLevels)); ++i)
    if (std::strcmp(env, kLevels[i]) == 0) return i;
  return -2;
}

Features held_to(Features f, int level) {
  if (level < 0) return f;
  if (level < 4) f.amx_tile = f.amx_bf16 = false;
  if (level < 3) f.avx512_bf16 = false;
  if (level < 2) f.avx512f = f.avx512bw = f.avx512cd = f.avx512dq = f.avx512vl = false;
  if (level < 1) f.avx = f.avx2 = f.fma = f.bmi1 = f.bmi2 = f.f16c = f.movbe = f.lzcnt = false;
  return f;
}

const Features& features() {
  static const Features f = held_to(detect(), max_level());
  return f;
}

// The instructions an instruction set needs that this CPU or OS lacks, e.g. "AVX2, FMA".
std::string missing(Isa isa) {
  const Features& f = features();
  std::string out;
  auto need = [&](bool have, const char* name) {
    if (!have) append(out, ", ", name);
  };
  switch (isa) {
    case Isa::Generic:
      break;
    case Isa::Avx512:
      need(f.avx512f, "AVX-512F");
      need(f.avx512bw, "AVX-512BW");
      need(f.avx512cd, "AVX-512CD");
      need(f.avx512dq, "AVX-512DQ");
      need(f.avx512vl, "AVX-512VL");
      need(f.os_avx512, "OS support for the AVX-512 registers");
      [[fallthrough]];
    case Isa::Avx2:
      need(f.avx2, "AVX2");
      need(f.fma, "FMA");
      need(f.bmi1, "BMI1");
      need(f.bmi2, "BMI2");
      need(f.f16c, "F16C");
      need(f.movbe, "MOVBE");
      need(f.lzcnt, "LZCNT");
      need(f.avx && f.os_avx, "AVX with OS support");
      [[fallthrough]];
    case Isa::Baseline:
      need(f.sse42, "SSE4.2");
      need(f.sse41, "SSE4.1");
      need(f.ssse3, "SSSE3");
      need(f.popcnt, "POPCNT");
      need(f.cx16, "CMPXCHG16B");
      break;
  }
  return out;
}

const KernelTable* table_of(Isa isa) {
  switch (isa) {
#if defined(TW_CPU_ISA_BUILT_BASELINE)
    case Isa::Baseline: return &towerflow_cpu_kernels_baseline;
#endif
#if defined(TW_CPU_ISA_BUILT_AVX2)
    case Isa::Avx2: return &towerflow_cpu_kernels_avx2;
#endif
#if defined(TW_CPU_ISA_BUILT_AVX512)
    case Isa::Avx512: return &towerflow_cpu_kernels_avx512;
#endif
#if !defined(TW_CPU_ISAS_X86)
    case Isa::Generic: return &towerflow_cpu_kernels_generic;
#endif
    default: return nullptr;
  }
}

struct Choice {
  Isa isa = Isa::Generic;
  std::string why;
};

Choice choose() {
  const auto supported = supported_isas();
  const auto built = built_isas();
  if (supported.empty())
    raise<DeviceError>("this CPU cannot run towerflow's CPU kernels: it lacks ", missing(built.front()),
                       " (the lowest instruction set this build has, ", isa_name(built.front()), ")");
  if (max_level() == -2)
    raise<InvalidArgument>("TOWERFLOW_MAX_CPU_ISA=", std::getenv("TOWERFLOW_MAX_CPU_ISA"), " names no level; use "
                           "baseline, avx2, avx512, avx512_bf16 or amx (or unset it for all this CPU has)");
  Choice c{supported.back(), "the best this CPU supports"};
  if (max_level() >= 0) c.why += str(" under TOWERFLOW_MAX_CPU_ISA=", kLevels[max_level()]);
  if (const char* env = std::getenv("TOWERFLOW_CPU_ISA"); env && *env) {
    std::string names;
    std::optional<Isa> asked;
    for (Isa i : built) {
      append(names, ", ", isa_name(i));
      if (std::strcmp(env, isa_name(i)) == 0) asked = i;
    }
    if (!asked)
      raise<InvalidArgument>("TOWERFLOW_CPU_ISA=", env, " names no instruction set of this build; use one of ", names,
                             " (or unset it for the best this CPU supports)");
    if (std::find(supported.begin(), supported.end(), *asked) == supported.end())
      c.why = str("TOWERFLOW_CPU_ISA=", env, " asks for more than this CPU has (it lacks ", missing(*asked), ")");
    else if (*asked != c.isa)
      c = {*asked, str("TOWERFLOW_CPU_ISA=", env, "; the CPU supports ", isa_name(supported.back()))};
    else
      c.why = str("TOWERFLOW_CPU_ISA=", env, ", the best this CPU supports");
  }
  return c;
}

std::mutex g_mu;
std::optional<Choice> g_choice;
std::optional<Isa> g_forced;
std::atomic<const KernelTable*> g_table{nullptr};

const Choice& choice_locked() {
  if (!g_choice) g_choice = choose();
  return *g_choice;
}

// Note [A native build on an older CPU]: with TOWERFLOW_NATIVE=ON everything but the kernel
// tables is compiled for the building machine. Before any of that code runs (a constructor of
// the highest priority, in this baseline-compiled file), compare what it was compiled for with
// what this CPU has, and stop with the names of the missing instructions rather than let an
// illegal instruction end the process somewhere later.
__attribute__((constructor(101))) void check_build_target() {
  const Features& f = features();
  std::string lacking;
  auto need = [&](bool built, bool have, const char* name) {
    if (built && !have) append(lacking, ", ", name);
  };
  need(detail::kBuiltForAvx2, f.avx2 && f.os_avx, "AVX2");
  need(detail::kBuiltForFma, f.fma, "FMA");
  need(detail::kBuiltForAvx512f, f.avx512f && f.os_avx512, "AVX-512F");
  need(detail::kBuiltForAvx512bw, f.avx512bw, "AVX-512BW");
  need(detail::kBuiltForAvx512vl, f.avx512vl, "AVX-512VL");
  if (lacking.empty()) return;
  std::fprintf(stderr,
               "towerflow: this build was compiled for another machine's instructions (-DTOWERFLOW_NATIVE=ON) and "
               "this CPU lacks %s. Rebuild with -DTOWERFLOW_NATIVE=OFF: the portable build chooses its kernels "
               "at run time and runs at full speed here.\n",
               lacking.c_str());
  std::_Exit(70);  // EX_SOFTWARE
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Generic: return "generic";
    case Isa::Baseline: return "baseline";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

std::vector<Isa> built_isas() {
  std::vector<Isa> out;
#if defined(TW_CPU_ISA_BUILT_BASELINE)
  out.push_back(Isa::Baseline);
#endif
#if defined(TW_CPU_ISA_BUILT_AVX2)
  out.push_back(Isa::Avx2);
#endif
#if defined(TW_CPU_ISA_BUILT_AVX512)
  out.push_back(Isa::Avx512);
#endif
#if !defined(TW_CPU_ISAS_X86)
  out.push_back(Isa::Generic);
#endif
  return out;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : built_isas())
    if (missing(i).empty()) out.push_back(i);
  return out;
}

Isa active_isa() {
  std::lock_guard lock(g_mu);
  return g_forced ? *g_forced : choice_locked().isa;
}

std::string describe_active_isa() {
  std::lock_guard lock(g_mu);
  if (g_forced) return str(isa_name(*g_forced), " (forced by a test)");
  const Choice& c = choice_locked();
  return str(isa_name(c.isa), " (", c.why, ")");
}

bool cpu_has_avx512_bf16() {
  const Features& f = features();
  return f.avx512_bf16 && f.avx512f && f.os_avx512;
}

// Note [AMX permission]
// Linux (5.16 and later) enables the 8 KiB of AMX tile data in a process only when it asks, with
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); a tile instruction before that raises
// SIGILL. The request is made once, the first time a caller asks whether AMX can run, and covers
// every thread of the process.
std::string amx_unavailable() {
  static const std::string why = [] {
    const Features& f = features();
    if (!f.amx_tile || !f.amx_bf16) return std::string("this CPU has no AMX-BF16");
    if (!f.avx512f || !f.os_avx512) return std::string("the AVX-512 registers are not enabled");
    if (!f.os_amx) return std::string("the operating system does not enable the AMX tile state (XCR0)");
#if defined(__linux__) && defined(__x86_64__)
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) != 0)
      return str("Linux refused the AMX tile permission (arch_prctl ARCH_REQ_XCOMP_PERM: ",
                 std::strerror(errno), "; it needs Linux 5.16 or later)");
    return std::string();
#else
    return std::string("AMX is enabled for towerflow on Linux only");
#endif
  }();
  return why;
}

bool cpu_has_amx_bf16() { return amx_unavailable().empty(); }

std::string max_cpu_isa() {
  const int level = max_level();
  return level >= 0 ? kLevels[level] : "";
}

std::string cpu_features() {
  const Features& f = features();
  std::string out;
  auto add = [&](bool have, const char* name) {
    if (have) append(out, " ", name);
  };
  add(f.sse42, "sse4.2");
  add(f.avx && f.os_avx, "avx");
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.avx512f && f.os_avx512, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_tile, "amx_tile");
  add(f.amx_bf16, "amx_bf16");
  return out;
}

void force_isa_for_testing(std::optional<Isa> isa) {
  std::lock_guard lock(g_mu);
  if (isa) (void)kernels_of(*isa);  // built and supported, or InvalidArgument
  g_forced = isa;
  g_table.store(nullptr);
}

// The table the public kernels call (kernel_table.h).
const KernelTable& kernels() {
  const KernelTable* t = g_table.load(std::memory_order_acquire);
  if (!t) {
    t = table_of(active_isa());
    g_table.store(t, std::memory_order_release);
  }
  return *t;
}

const KernelTable& kernels_of(Isa isa) {
  const auto s = supported_isas();
  if (std::find(s.begin(), s.end(), isa) == s.end())
    raise<InvalidArgument>("instruction set ", isa_name(isa), " is not built or not supported on this CPU");
  return *table_of(isa);
}

}  // namespace towerflow::cpu
