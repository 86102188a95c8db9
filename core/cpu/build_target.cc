// What the library around the kernels was compiled for, as data only (no code runs here): read
// by isa.cc's start-up check. Compiled with the build's flags (-march=native under
// TOWERFLOW_NATIVE), unlike isa.cc.
namespace towerflow::cpu::detail {

extern const bool kBuiltForAvx2 =
#if defined(__AVX2__)
    true;
#else
    false;
#endif
extern const bool kBuiltForFma =
#if defined(__FMA__)
    true;
#else
    false;
#endif
extern const bool kBuiltForAvx512f =
#if defined(__AVX512F__)
    true;
#else
    false;
#endif
extern const bool kBuiltForAvx512bw =
#if defined(__AVX512BW__)
    true;
#else
    false;
#endif
extern const bool kBuiltForAvx512vl =
#if defined(__AVX512VL__)
    true;
#else
    false;
#endif

}  // namespace towerflow::cpu::detail
