#pragma once
// Which kernel runs each convolution and matrix product on the CPU: a fixed rule, or the fastest
// of the candidates, measured the first time each problem runs (as cuDNN's benchmark mode, or
// TensorFlow's autotuning, does on a GPU).
//
//   fixed  towerflow's own fp32 kernels; in bf16 the kernels bf16.h's automatic rule picks (or
//          TOWERFLOW_BF16_KERNELS names). Results repeat bit for bit from run to run.
//   auto   each problem (pass, shape, operand type, thread count) is run once on every candidate
//          this build and CPU can run, then timed, and the fastest is kept for the rest of the
//          process: in fp32 towerflow's direct and Winograd kernels (on an AVX-512 CPU also
//          their AVX2 build) and oneDNN's; in bf16 the emulated path, oneDNN's,
//          towerflow's AVX512-BF16 and AMX kernels, where each runs at full speed. The first
//          step is slower by the measuring. The candidates agree within the tolerances the tests
//          hold them to (the same as between fp32 and bf16 paths), so a run's results do not
//          depend on the choice beyond rounding; a second run reads the choices from the cache
//          and makes the same ones.
//
// The cache: a JSON file of choices keyed by CPU (model, instruction set, oneDNN version, thread
// count) and problem, read at the first choice and rewritten (atomically) after each new
// measurement. Its path: TOWERFLOW_KERNEL_CACHE if set (empty or "none": no file), else
// $XDG_CACHE_HOME/towerflow/kernel-choices.json, else ~/.cache/towerflow/kernel-choices.json.
// A file that cannot be read or parsed is reported once and left as it is; the choices are then
// measured again and the file rewritten.
//
// The mode starts as TOWERFLOW_KERNEL_CHOICE (auto or fixed), fixed when unset. The command-line
// programs set it from --kernel_choice.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace towerflow {

enum class KernelChoice { kFixed, kAuto };

const char* kernel_choice_name(KernelChoice c);  // "fixed", "auto"
// "fixed" or "auto"; InvalidArgument naming `what`, the value and the choices otherwise.
KernelChoice parse_kernel_choice(std::string_view text, std::string_view what = "kernel choice");

// The candidates of auto for fp32 or bf16 operands in this build and on this CPU, the fixed
// choice first (e.g. {"towerflow", "onednn"}; one where there is nothing to choose).
std::vector<std::string> kernel_choice_candidates(bool bf16 = false);

// Process-wide; takes effect for problems not yet chosen (a problem keeps its first choice).
void set_kernel_choice(KernelChoice c);
KernelChoice kernel_choice();

// The cache file ("" when there is none). Setting it takes effect before the first choice.
std::string kernel_choice_cache();
void set_kernel_choice_cache(std::string path);

// One choice: where it was made, for what, what won and what each candidate took.
struct KernelChoiceRecord {
  std::string layer;    // the op scope of the first call ("conv1", "layer1.0.conv2"; a backward
                        // pass runs in its forward's), or ""
  std::string pass;     // "forward", "backward input", "backward input, added", "backward weight",
                        // "matmul"
  std::string problem;  // e.g. "128x32x32x3 -> 64, 5x5, stride 1, pad 2" or "128x4096 * 4096x384"
  std::string operands;  // "fp32", "bf16"
  int threads = 1;
  std::string chosen;   // "towerflow", "winograd", "onednn", "towerflow-avx2", "amx", ...
  bool from_cache = false;
  std::vector<std::pair<std::string, double>> ms;  // each candidate's best time; empty from cache
};

// Every choice of this process so far, in the order made (auto mode only).
std::vector<KernelChoiceRecord> kernel_choices();

// One line for a start-up block: "conv1  forward  128x32x32x3 -> 64, 5x5, stride 1, pad 2  fp32
// x2 threads: onednn 10.4 ms (towerflow 14.1)" (or "... onednn (cached)").
std::string format_kernel_choice(const KernelChoiceRecord& r);

// Tests: forget every choice (and the cache's contents read so far).
void reset_kernel_choices_for_testing();

}  // namespace towerflow
