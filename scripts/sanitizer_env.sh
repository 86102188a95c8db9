# Sourced by scripts/sanitize.sh and scripts/fuzz.sh: the compiler, the build configurations and
# the run-time options of the sanitizer builds.
#
# clang 16 (scripts/install_deps.sh fuzz): Debian 12's default clang 14 cannot compile
# libstdc++'s <source_location>. One clang build, build-asan/ (ASan + UBSan, with libFuzzer's
# coverage instrumentation), serves both the ASan test run and the fuzz targets, so CI compiles
# the library once for the two; it costs the tests little. -O0 with line tables, whole stacks in
# reports: the kernels keep their own -O3 (core/cpu/CMakeLists.txt), so CI's sanitizer tests run
# about as fast as at -O1 while the rest compiles in about two thirds of the time; the fuzz
# targets run about half as many inputs a second. No precompiled header (TOWERFLOW_PCH): a build
# without one shows a test source that does not include what it uses.
tw_cxx=clang++-16
tw_configure() {  # build_dir sanitizers optimisation [cmake args...]
  local dir=$1 sanitizers=$2 opt=$3
  shift 3
  cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER="$tw_cxx" -DTOWERFLOW_CUDA=OFF \
    -DTOWERFLOW_SANITIZE="$sanitizers" -DTOWERFLOW_PCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt -gline-tables-only" "$@" >/dev/null
}
# The kernels are built for the baseline instruction set alone (TOWERFLOW_CPU_ISAS) unless the
# caller names others ("" for all three, as the whole ASan suite does, whose tests compare the
# sets): the parsers, the fuzz targets and the threaded components run the same code at any
# width, and three sets of kernels under the sanitizers took half of CI's ASan build.
# The whole-suite ASan run (scripts/sanitize.sh asan) passes -O1 as the second argument: at -O0
# its longest tests (mpirun jobs, the docs' commands, the benchmark suite) ran 6-7 minutes, or
# past their time limits.
tw_configure_asan() {
  tw_configure build-asan address,undefined "${2:--O0}" -DTOWERFLOW_FUZZ=ON "-DTOWERFLOW_CPU_ISAS=${1-baseline}"
}
tw_configure_tsan() { tw_configure build-tsan thread -O0 "-DTOWERFLOW_CPU_ISAS=${1-baseline}"; }

# Reports with function names and lines: clang-16's runtimes do not find Debian's
# llvm-symbolizer by themselves.
tw_symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer-14 || command -v llvm-symbolizer || true)
tw_supp=$PWD/scripts/sanitizers
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:external_symbolizer_path=$tw_symbolizer"
export LSAN_OPTIONS="suppressions=$tw_supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$tw_supp/ubsan.supp:external_symbolizer_path=$tw_symbolizer"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$tw_supp/tsan.supp:external_symbolizer_path=$tw_symbolizer"
