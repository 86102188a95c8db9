#pragma once
// The trainer's options: one struct, settable from flags (TensorFlow tutorial names where they
// exist) and from an INI file (`--config train.ini`), flags winning over the file.
//
//   [train]                       # training keys; they may also stand at the top of the file
//   model = resnet20
//   batch_size = 256
//   [cpu]                         # device options: see core/platform/options.h
//   device_count = CPU=2
//
// Contract: every value funnels through set_train_option, so a flag and an INI key accept the
// same text and fail the same way: InvalidArgument naming the option, the value, and the form
// expected (for a file also the file and line). Keys of [train] must be training options; keys at
// the top of the file that are not training options must be device options; keys in the device
// sections [gpu], [cpu], [devices], [session], [process] are device options. Any other section
// is an error naming the nearest known one ([trian]: did you mean [train]?), unless the file
// declares it another program's in [towerflow] ignore_sections = a, b (core/platform/ini.h);
// those are skipped. A key given twice is an error.

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/platform/options.h"

namespace CLI {
class App;
}

namespace towerflow::cifar10 {

struct TrainOptions {
  // data
  std::string data_dir = {};           // CIFAR-10/100 binary or an image folder; empty: built-in
  std::string dataset = "auto";        // auto|cifar10|cifar100|folder|builtin
  int loader_threads = 1;              // background threads preparing batches
  std::int64_t builtin_train_size = 5000;  // images of the built-in dataset's splits
  std::int64_t builtin_test_size = 1000;
  int crop_padding = 4;                // random crops of the image padded by N pixels (0: none)
  std::string pad_mode = "zeros";      // zeros | reflect: the crop's padding
  std::string flip = "random";         // random | alternating | none: horizontal flips
  int cutout = 0;                      // side of the cutout square on training images (0: none)
  double mixup = 0.0;                  // > 0: mixup of training batches, lambda ~ Beta(mixup, mixup)
  double cutmix = 0.0;                 // > 0: CutMix, lambda ~ Beta(cutmix, cutmix); with --mixup, one or the other per batch
  bool skip_bad_files = false;         // image folders: skip undecodable files instead of failing
  std::string image_size = "32";       // N or HxW: the model's input; other sizes are resized (bilinear)
  std::string mean = "cifar10";        // R,G,B of pixels in [0, 1] | cifar10 | imagenet: normalisation
  std::string stddev = "cifar10";      // --std: R,G,B | cifar10 | imagenet
  double val_split = 0.0;              // > 0: this fraction of the training set held out for validation
  std::string val_dir = {};            // a validation set of its own (the kind of --data_dir)
  // model and devices
  std::string model = "tfcnn";
  std::string devices = {};            // "" or "all": every logical device; or "/cpu:0,/cpu:1"
  int num_gpus = -1;                   // TensorFlow tutorial flag: the first N GPUs (-1: all)
  // the step
  int batch_size = 128;                // global, over all towers
  std::string split = "even";          // even | weights:3,1 | per_tower (tower/split.h)
  std::string split_remainder = "error";  // error | spread (a batch that does not split evenly)
  int accumulation_steps = 1;          // micro-batches per step, reduced once
  std::string reduction = "all_reduce";   // all_reduce | bucketed[:MB] | parameter_device[:DEVICE]
  std::string batch_norm = "per_tower";   // per_tower | sync (statistics over all towers)
  std::string precision = "fp32";         // fp32 | bf16 (core/tensor/precision.h)
  std::string kernel_choice = "fixed";    // fixed | auto (core/kernel_choice.h)
  std::string optimizer = "sgd";       // sgd (with --momentum) | adam
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  double adam_beta1 = 0.9;             // adam, adamw
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  std::string schedule = "cosine";     // see optim::parse_schedule
  double warmup_epochs = 0.0;
  double label_smoothing = 0.0;        // targets (1 - s) * onehot + s / classes
  double clip_grad_norm = 0.0;         // > 0: the gradients' global L2 norm is clipped to this
  int tta = 0;                         // test-time views of the final evaluation: 0 | 1 (mirror) | 2 (airbench94's six)
  int lookahead = 0;                   // > 0: Lookahead weight averaging every N steps (train/lookahead.h)
  // a recipe: the settings of a published run for every option not given (apply_recipe)
  std::string recipe = "none";         // none | airbench94
  // length
  double epochs = 3;                   // a fraction ends the run inside its last epoch
  std::int64_t max_steps = 0;          // > 0: stop after this many steps (wins over epochs)
  int eval_every = 1;                  // epochs between evaluations (0: only at the end)
  std::string keep_best = {};          // a metric (val_acc, loss, ...): its best checkpoint in train_dir/best
  int early_stop = 0;                  // > 0: stop after this many evaluations without improvement of --monitor
  std::string monitor = "loss";        // what --early_stop and --schedule plateau watch
  int log_every = 10;                  // steps between progress lines
  // checkpoints and logs
  std::string train_dir = "train_dir";
  std::int64_t save_every = 100;       // steps between checkpoints (0: only at the end)
  int keep_checkpoints = 5;            // newest N kept (0: all)
  bool resume = false;
  std::string resume_from = {};        // with resume: this checkpoint (ckpt-200, 200, a path), not the newest
  bool resume_new_data = false;        // with resume: another data set than the run's is allowed
  std::string init_from = {};          // a new run from these weights (a checkpoint or a state_dict file)
  bool dry_run = false;                // say what the run would use, after one forward and backward, and stop
  std::string start_over = "no";       // no | move | delete: a new run where an earlier one left files
  std::string on_checkpoint_error = "stop";  // stop | continue
  std::uint64_t seed = 1;
  std::string progress = "auto";       // auto | plain | live | json (train/reporter.h)
  bool json = false;                   // --progress json, by its older name
  bool tensorboard = true;             // TensorBoard event files
  std::string logdir = {};             // for the event files (empty: train_dir)
  std::int64_t histogram_every = 0;    // steps between weight/gradient histograms (0: none)
  std::string trace = {};              // a Chrome-trace JSON file of trace_steps (empty: none)
  std::string trace_steps = "6:10";    // A:B, 1-based
};

// Sets one option from its flag/INI spelling (name without dashes). InvalidArgument for an
// unknown name (listing the known ones) or a value that does not parse or is out of range.
void set_train_option(TrainOptions& opts, std::string_view name, std::string_view value);
// Whether `name` is a training option.
bool is_train_option(std::string_view name);

// --recipe: sets every option the recipe fixes and `given` does not name (a flag or the config
// file wins). airbench94: see docs/training-fast.md. "none" sets nothing.
void apply_recipe(TrainOptions& opts, const std::set<std::string>& given);

// A library error's message in this program's words: the option fields the library names
// (core/error.h's render_options) as the flags that set them, "FitOptions::batch" as
// "--batch_size", "ProcessOptions::memory_limit_mb[/gpu:1]" as "--memory_limit gpu:1=<MiB>",
// "TrainerOptions::batch_norm = BatchNormMode::PerTower" as "--batch_norm per_tower".
std::string as_flags(std::string_view message);
// Every option's name, current value (as text) and help, in --help order.
struct OptionDoc {
  std::string name, value, help;
};
std::vector<OptionDoc> describe_train_options(const TrainOptions& opts);

// A parsed config file: its training keys applied to defaults, and its device options.
struct Config {
  TrainOptions train;
  ProcessOptions process;
  std::vector<std::string> train_keys;  // the training keys the file set (flags override these)
};
Config parse_config(std::string_view text, std::string_view source);
Config load_config(const std::string& path);  // NotFound if missing

// The command line of the trainer: --config, every training flag and every device flag.
//
//   CLI::App app{"..."};
//   TrainCommandLine cli;
//   cli.add_to(app);
//   if (auto code = parse_command_line(app, argc, argv)) return *code;   // main_util.h: bad
//                                        // flags exit 2 (a ValidationError's text is set_train_option's message)
//   auto [train, process] = cli.resolve();   // the config file, then the flags over it
struct Resolved {
  TrainOptions train;
  ProcessOptions process;
  std::set<std::string> given;  // training options set by the config file or a flag
};
class TrainCommandLine {
 public:
  // `only` restricts the training flags added (empty: all); cifar10_eval uses a subset.
  void add_to(CLI::App& app, const std::vector<std::string>& only = {});
  // Throws InvalidArgument / NotFound for a bad config file.
  Resolved resolve() const;
  const std::string& config_path() const { return config_; }

 private:
  std::string config_;
  std::vector<std::pair<std::string, std::string>> given_;  // training flags, in order
  ProcessOptions process_flags_;
};

// The JSON form of the options (stored in checkpoints, printed at start-up).
std::string to_json(const TrainOptions& opts);

// --resume: the options of the run it continues. Every option the run recorded (its to_json form,
// `recorded`) replaces the one in `opts`, except the options named in `keep` (those a flag or the
// config file set) and those of one invocation rather than of the run (is_invocation_option).
// Returns each kept option whose value differs from the recorded one. A recorded name this
// program does not know is skipped; DataError for recorded JSON that does not parse, or a value
// that no longer does (naming the option and the checkpoint `source`).
struct OptionChange {
  std::string name, recorded, now;  // values as text
};
std::vector<OptionChange> take_recorded_options(TrainOptions& opts, std::string_view recorded,
                                                const std::set<std::string>& keep, std::string_view source);
// resume, resume_from, resume_new_data, init_from, dry_run, train_dir, start_over, progress, json,
// trace, trace_steps: how this invocation starts and shows itself, never taken from a checkpoint.
bool is_invocation_option(std::string_view name);

}  // namespace towerflow::cifar10
