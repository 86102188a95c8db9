#include "examples/cifar10/train_options.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <variant>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/platform/ini.h"
#include "core/strings.h"
#include "core/version.h"

namespace towerflow::cifar10 {
namespace {

using Member = std::variant<std::string TrainOptions::*, int TrainOptions::*, std::int64_t TrainOptions::*,
                            std::uint64_t TrainOptions::*, double TrainOptions::*, bool TrainOptions::*>;

struct Field {
  const char* name;
  Member member;
  const char* help;
  double min = -INFINITY;  // numeric range, inclusive
  double max = INFINITY;
  const char* group = "Training";
  const char* choices = nullptr;  // for a text option with a fixed set of values: "a|b"
};

// The one list of options: flags, INI keys, --help and the JSON form all come from it.
const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"data_dir", &TrainOptions::data_dir, "CIFAR-10/100 binary folder or an image folder (empty: the built-in dataset)", 0, 0, "Data"},
      {"dataset", &TrainOptions::dataset, "auto|cifar10|cifar100|folder|builtin (auto: from --data_dir's contents)", 0, 0, "Data"},
      {"loader_threads", &TrainOptions::loader_threads, "background threads preparing batches (0: on the training thread)", 0, 64, "Data"},
      {"skip_bad_files", &TrainOptions::skip_bad_files, "an image folder's undecodable files are skipped and listed (default: an error naming the first)", 0, 0, "Data"},
      {"builtin_train_size", &TrainOptions::builtin_train_size, "training images of the built-in dataset", 1, 1e8, "Data"},
      {"builtin_test_size", &TrainOptions::builtin_test_size, "test images of the built-in dataset", 1, 1e8, "Data"},
      {"val_split", &TrainOptions::val_split, "hold out this fraction of the training set (of each class, chosen by --seed) as a validation set: evaluations during training use it and the test set is evaluated once, at the end (0: none)", 0, 0.99, "Data"},
      {"val_dir", &TrainOptions::val_dir, "a validation set of its own, read like --data_dir (an image folder: its test/ sub-folder if it has one, else the folder; CIFAR binary: its test batch); evaluated as --val_split's", 0, 0, "Data"},
      {"crop_padding", &TrainOptions::crop_padding, "random crops of each training image padded by this many pixels on every side (0: none; not on the built-in dataset)", 0, 1024, "Data"},
      {"pad_mode", &TrainOptions::pad_mode, "the crops' padding: zeros (torchvision's RandomCrop) or reflect (PyTorch's reflect padding, airbench94's)", 0, 0, "Data", "zeros|reflect"},
      {"flip", &TrainOptions::flip, "horizontal flips of training images: random (each image, each epoch) | alternating (a random flip per image in even epochs, the opposite in odd ones: airbench94's) | none (not on the built-in dataset)", 0, 0, "Data", "random|alternating|none"},
      {"cutout", &TrainOptions::cutout, "side in pixels of the square cut out of each training image (0: none; DeVries & Taylor use 16 on CIFAR-10)", 0, 1024, "Data"},
      {"image_size", &TrainOptions::image_size, "the model's input size, N or HxW: images of another size (CIFAR's 32x32, an image folder's) are resized to it, bilinear", 0, 0, "Data"},
      {"mean", &TrainOptions::mean, "per-channel mean subtracted from pixels scaled to [0, 1]: R,G,B, or cifar10 (0.4914,0.4822,0.4465) or imagenet (0.485,0.456,0.406); evaluation and cifar10_eval use the same", 0, 0, "Data"},
      {"std", &TrainOptions::stddev, "per-channel standard deviation the pixels are divided by after --mean: R,G,B, or cifar10 (0.247,0.2435,0.2616) or imagenet (0.229,0.224,0.225)", 0, 0, "Data"},
      {"mixup", &TrainOptions::mixup, "mix each training image with its batch neighbour, weights lambda ~ Beta(ALPHA, ALPHA), and their targets alike (Zhang et al.; 0: off, 0.2 is usual for CIFAR)", 0, 100, "Data"},
      {"cutmix", &TrainOptions::cutmix, "paste a box of each training image's batch neighbour into it, area 1 - lambda with lambda ~ Beta(ALPHA, ALPHA), targets weighted by area (Yun et al.; 0: off, 1.0 is usual); with --mixup, each batch takes one of the two", 0, 100, "Data"},
      {"model", &TrainOptions::model, "tfcnn|resnet20|resnet32|resnet44|resnet56|resnet110|airbench94", 0, 0, "Model"},
      {"precision", &TrainOptions::precision, "convolutions and matrix products in fp32, or on bf16 or fp16 operands with fp32 accumulation (the rest stays fp32; bf16 without bf16 instructions, and fp16 always, emulated: slower than fp32); fp16 scales the loss dynamically", 0, 0, "Model", "fp32|bf16|fp16"},
      {"kernel_choice", &TrainOptions::kernel_choice, "fixed: towerflow's own CPU kernels (bf16: the automatic rule), the same bits run after run | auto: each convolution and matrix product on the fastest of the CPU's candidates (towerflow's, oneDNN's), measured at its first call, listed after the first step and cached (TOWERFLOW_KERNEL_CACHE) for later runs", 0, 0, "Model", "fixed|auto"},
      {"devices", &TrainOptions::devices, "towers of this process: 'all' (every logical device) or a list, e.g. /cpu:0,/cpu:1 or /gpu:0,/gpu:1; under mpirun a name with a task (/job:worker/task:1/device:GPU:0) is a device of that rank only", 0, 0, "Devices"},
      {"num_gpus", &TrainOptions::num_gpus, "use the first N GPUs (TensorFlow tutorial flag; -1: all)", -1, 1 << 20, "Devices"},
      {"batch_size", &TrainOptions::batch_size, "global batch, split over the towers", 1, 1 << 24, "Towers"},
      {"split", &TrainOptions::split, "how the batch is split: even | weights:W0,W1,... (one per tower) | per_tower (--batch_size per tower) | auto[:freeze_after=N,...] (by each tower's measured speed)", -INFINITY, INFINITY, "Towers"},
      {"split_remainder", &TrainOptions::split_remainder, "a batch that does not split exactly: error | spread (largest remainders)", -INFINITY, INFINITY, "Towers"},
      {"accumulation_steps", &TrainOptions::accumulation_steps, "micro-batches per step: the global batch is cut into N parts, their gradients summed before one reduction and update (same result, less memory)", 1, 1 << 16, "Towers"},
      {"reduction", &TrainOptions::reduction, "all_reduce | bucketed[:MB] | parameter_device[:DEVICE] (e.g. parameter_device:/cpu:0)", -INFINITY, INFINITY, "Towers"},
      {"batch_norm", &TrainOptions::batch_norm, "batch-norm statistics in training: per_tower (each tower's slice) | sync (the whole global batch, exchanged across towers)", 0, 0, "Towers", "per_tower|sync"},
      {"optimizer", &TrainOptions::optimizer, "sgd (with --momentum) | nesterov | adam | adamw", -INFINITY, INFINITY, "Optimizer"},
      {"lr", &TrainOptions::lr, "peak learning rate", 0, 1e6, "Optimizer"},
      {"momentum", &TrainOptions::momentum, "SGD momentum", 0, 1, "Optimizer"},
      {"weight_decay", &TrainOptions::weight_decay, "L2 weight decay (adamw: decoupled)", 0, 1, "Optimizer"},
      {"adam_beta1", &TrainOptions::adam_beta1, "Adam's first-moment decay", 0, 0.999999, "Optimizer"},
      {"adam_beta2", &TrainOptions::adam_beta2, "Adam's second-moment decay", 0, 0.999999, "Optimizer"},
      {"adam_epsilon", &TrainOptions::adam_epsilon, "Adam's epsilon, added to the root of the second moment", 0, 1, "Optimizer"},
      {"schedule", &TrainOptions::schedule, "constant | cosine[:MIN_LR] | step:STEP1,STEP2[:GAMMA] | onecycle[:PCT] (steps count optimizer steps) | plateau[:FACTOR[:PATIENCE[:MIN_LR]]] (--lr, multiplied by FACTOR (0.1) after PATIENCE (10) evaluations without improvement of --monitor, as Keras's ReduceLROnPlateau)", -INFINITY, INFINITY, "Optimizer"},
      {"warmup_epochs", &TrainOptions::warmup_epochs, "linear warm-up from 0 over this many epochs", 0, 1e6, "Optimizer"},
      {"label_smoothing", &TrainOptions::label_smoothing, "targets (1 - s) * onehot + s / classes in the training loss", 0, 0.999, "Optimizer"},
      {"clip_grad_norm", &TrainOptions::clip_grad_norm, "scale the gradients down to this global L2 norm when it is larger, as torch.nn.utils.clip_grad_norm_ (0: off)", 0, 1e12, "Optimizer"},
      {"epochs", &TrainOptions::epochs, "epochs to train; a fraction stops inside the last one (9.9: 90% of the tenth)", 0.001, 1 << 24},
      {"recipe", &TrainOptions::recipe, "a published recipe's settings for every option not given: airbench94 (Keller Jordan's CIFAR-10 speed recipe: its network, whitening from data, batch 1024, Nesterov SGD with its lr groups, label smoothing, its schedule, alternating flips, Lookahead, six test views; docs/training-fast.md) | none", 0, 0, "Training", "none|airbench94"},
      {"tta", &TrainOptions::tta, "test-time augmentation of the final evaluation: 0 (none) | 1 (the image and its mirror) | 2 (also shifted one pixel both ways: airbench94's six views); evaluations during training stay plain", 0, 2},
      {"lookahead", &TrainOptions::lookahead, "Lookahead weight averaging every N steps (airbench94's: an average of the weights, which the weights are set to; 0: off)", 0, 1 << 24},
      {"dry_run", &TrainOptions::dry_run, "print what the run would use (model, data, towers and their rows, devices, length, checkpoints, each device's memory after one forward and backward) and stop: nothing is trained or written", 0, 0},
      {"max_steps", &TrainOptions::max_steps, "stop after this many steps (0: --epochs decides)", 0, 1e15},
      {"eval_every", &TrainOptions::eval_every, "evaluate every N epochs (0: only at the end), on the validation set when there is one (--val_split, --val_dir), else on the test split", 0, 1 << 24},
      {"keep_best", &TrainOptions::keep_best, "keep the checkpoint of the best evaluation of this metric in train_dir/best/ (cifar10_eval --checkpoint train_dir/best): loss, acc or top5, optionally prefixed val_ or test_ (without a prefix: the set evaluated during training); empty: none", 0, 0, "Checkpoints"},
      {"early_stop", &TrainOptions::early_stop, "stop after this many evaluations in a row without improvement of --monitor (0: never); the final evaluation and checkpoint follow", 0, 1 << 24},
      {"monitor", &TrainOptions::monitor, "the metric --early_stop and --schedule plateau watch: loss, acc or top5, optionally prefixed val_ or test_ (without a prefix: the set evaluated during training)", 0, 0},
      {"log_every", &TrainOptions::log_every, "steps between progress lines", 1, 1 << 24, "Output"},
      {"train_dir", &TrainOptions::train_dir, "checkpoints and metrics.jsonl go here", 0, 0, "Checkpoints"},
      {"save_every", &TrainOptions::save_every, "steps between checkpoints (0: only at the end)", 0, 1e15, "Checkpoints"},
      {"keep_checkpoints", &TrainOptions::keep_checkpoints, "keep the newest N checkpoints (0: all)", 0, 1 << 24, "Checkpoints"},
      {"resume", &TrainOptions::resume, "continue the run in --train_dir from its newest intact checkpoint, with the options it recorded (flags given now override them, and the start-up block lists each)", 0, 0, "Checkpoints"},
      {"resume_from", &TrainOptions::resume_from, "continue from this checkpoint of --train_dir instead (ckpt-200, 200 or its path; implies --resume); the newer ones are moved into train_dir/earlier-<time>/", 0, 0, "Checkpoints"},
      {"resume_new_data", &TrainOptions::resume_new_data, "with --resume: continue on another data set than the one the run trained on (refused otherwise)", 0, 0, "Checkpoints"},
      {"init_from", &TrainOptions::init_from, "start a new run from these weights (fine-tuning): a train_dir (its newest checkpoint), a ckpt-<step> directory or a safetensors state_dict with PyTorch's names; the optimizer and the step start afresh", 0, 0, "Checkpoints"},
      {"start_over", &TrainOptions::start_over, "a new run in a --train_dir holding an earlier run's files: no (refuse), move (them into train_dir/earlier-<time>/) | delete", 0, 0, "Checkpoints", "no|move|delete"},
      {"on_checkpoint_error", &TrainOptions::on_checkpoint_error, "a checkpoint that cannot be written (a full disk): stop | continue (log it and train on)", 0, 0, "Checkpoints", "stop|continue"},
      {"seed", &TrainOptions::seed, "seeds initialisation, shuffling and augmentation", 0, 1.9e19},
      {"progress", &TrainOptions::progress, "how progress is shown: live (one line redrawn in place), plain (one line per report, no carriage returns or escape codes), json (one JSON object per line), auto (live on a terminal; plain where the output is not a terminal or an MPI launcher, mpirun or srun, started the program)", 0, 0, "Output", "auto|plain|live|json"},
      {"json", &TrainOptions::json, "print one JSON object per log line (the same as --progress json)", 0, 0, "Output"},
      {"tensorboard", &TrainOptions::tensorboard, "write TensorBoard event files (scalars every --log_every steps and at each evaluation)", 0, 0, "Output"},
      {"logdir", &TrainOptions::logdir, "where the event files go (empty: --train_dir)", 0, 0, "Output"},
      {"trace", &TrainOptions::trace, "write a timeline of --trace_steps to this Chrome-trace JSON file (Perfetto, chrome://tracing) and print time per op", 0, 0, "Output"},
      {"trace_steps", &TrainOptions::trace_steps, "the steps --trace records, A:B (1 is the first step)", 0, 0, "Output"},
      {"histogram_every", &TrainOptions::histogram_every, "steps between weight and gradient histograms in TensorBoard (0: none)", 0, 1e15, "Output"},
  };
  return f;
}

const Field* find_field(std::string_view name) {
  for (const auto& f : fields())
    if (name == f.name) return &f;
  return nullptr;
}

std::string known_names() {
  std::string out;
  for (const auto& f : fields()) out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out;
}

// 16777216 rather than 1.67772e+07; 0.999 as it is.
std::string number_text(double x) {
  if (std::isfinite(x) && x == std::floor(x) && std::abs(x) < 1e15) return std::to_string(static_cast<long long>(x));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

template <typename T>
T parse_number(const Field& f, std::string_view value) {
  T out{};
  std::string_view v = trim(value);
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  bool ok = ec == std::errc() && end == v.data() + v.size() && !v.empty();
  if constexpr (std::is_floating_point_v<T>) ok = ok && std::isfinite(out);
  if (!ok)
    raise<InvalidArgument>("--", f.name, " \"", value, "\" is not ",
                           std::is_floating_point_v<T> ? "a number" : "an integer", "; write e.g. --", f.name, " ",
                           std::is_floating_point_v<T> ? "0.1" : "100");
  double d = static_cast<double>(out);
  if (d < f.min || d > f.max)
    raise<InvalidArgument>("--", f.name, " ", value, " is out of range; use a value in [", number_text(f.min), ", ",
                           number_text(f.max), "]");
  return out;
}

// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool is_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : c & (0xFF >> (n + 1));
    for (std::size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b >> 6) != 0x2) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// The trimmed text; for an option with choices, one of them (InvalidArgument otherwise).
// Text options are recorded as JSON (checkpoint metadata, --json lines), which holds UTF-8 only:
// anything else is refused here rather than when the first checkpoint is written.
std::string parse_choice(const Field& f, std::string_view value) {
  std::string v(trim(value));
  if (!is_utf8(v))
    raise<InvalidArgument>("--", f.name, " is not valid UTF-8 text; towerflow records its options as JSON, "
                           "which holds UTF-8 only (rename the file or folder, or reach it through a "
                           "symbolic link with a UTF-8 name)");
  if (!f.choices) return v;
  std::string_view rest = f.choices;
  std::string listed;
  while (!rest.empty()) {
    const std::size_t bar = rest.find('|');
    const std::string_view choice = rest.substr(0, bar);
    if (v == choice) return v;
    listed += (listed.empty() ? "" : ", ") + std::string(choice);
    rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
  }
  raise<InvalidArgument>("--", f.name, " \"", value, "\" is not one of ", listed, "; write e.g. --",
                         f.name, " ", std::string_view(f.choices).substr(0, std::string_view(f.choices).find('|')));
}

bool parse_bool(const Field& f, std::string_view value) {
  std::string v = lower(trim(value));
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  raise<InvalidArgument>("--", f.name, " \"", value, "\" is not a boolean; write true or false");
}

std::string value_text(const TrainOptions& opts, const Field& f) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = opts.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) return v;
        else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_floating_point_v<T>) {
          std::ostringstream os;
          os << v;
          return os.str();
        } else return std::to_string(v);
      },
      f.member);
}

// --help's layout: a wide first column, and switches shown as "--resume", not CLI11's
// "--resume{true}" (the value a bare switch takes).
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(44); }
  std::string make_option_name(const CLI::Option* opt, bool positional) const override {
    std::string name = CLI::Formatter::make_option_name(opt, positional);
    for (std::size_t open; (open = name.find('{')) != std::string::npos;) {
      const std::size_t close = name.find('}', open);
      if (close == std::string::npos) break;
      name.erase(open, close - open + 1);
    }
    return name;
  }
};

}  // namespace

void set_train_option(TrainOptions& opts, std::string_view name, std::string_view value) {
  const Field* f = find_field(name);
  if (!f) raise<InvalidArgument>("unknown training option \"", name, "\"; the options are ", known_names());
  std::visit(
      [&](auto member) {
        auto& slot = opts.*member;
        using T = std::decay_t<decltype(slot)>;
        if constexpr (std::is_same_v<T, std::string>) slot = parse_choice(*f, value);
        else if constexpr (std::is_same_v<T, bool>) slot = parse_bool(*f, value);
        else slot = parse_number<T>(*f, value);
      },
      f->member);
}

bool is_train_option(std::string_view name) { return find_field(name) != nullptr; }

std::vector<OptionDoc> describe_train_options(const TrainOptions& opts) {
  std::vector<OptionDoc> out;
  for (const auto& f : fields()) out.push_back({f.name, value_text(opts, f), f.help});
  return out;
}

// The file is read once, as Python's configparser reads it (core/platform/ini.h); a section that
// is neither ours nor declared another program's ([towerflow] ignore_sections) is refused, so a
// typo such as [trian] does not drop its keys. Training keys ([train], and training option names
// at the top or in [DEFAULT]) are applied here, and every other entry goes to the device options,
// which read their own sections and skip the rest.
Config parse_config(std::string_view text, std::string_view source) {
  Config c;
  std::map<std::string, int> seen;
  std::vector<IniEntry> device_entries;
  const IniFile ini = read_ini(text, source);
  check_ini_sections(ini, source, "a --config file of cifar10_train and cifar10_eval",
                     {"train", "gpu", "cpu", "devices", "session", "process"});
  for (const IniEntry& e : ini.entries) {
    bool shared = e.section.empty() || e.section == "DEFAULT";
    if (lower(e.section) != "train" && !(shared && is_train_option(e.key))) {
      device_entries.push_back(e);
      continue;
    }
    try {
      set_train_option(c.train, e.key, ini_option_value(e));
    } catch (const InvalidArgument& err) {
      raise_ini_value_error(source, e, err.what());
    }
    auto [it, fresh] = seen.emplace(e.key, e.line);
    if (!fresh)
      raise<InvalidArgument>(source, ":", e.line, ": option ", e.key, " is already set on line ", it->second,
                             "; keep one of the two");
    c.train_keys.push_back(e.key);
  }
  c.process = ProcessOptions::from_ini_entries(device_entries, source);
  return c;
}

Config load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) raise<NotFound>("config file ", path, " does not exist or cannot be read; check --config");
  std::ostringstream buf;
  buf << in.rdbuf();
  return parse_config(buf.str(), path);
}

void TrainCommandLine::add_to(CLI::App& app, const std::vector<std::string>& only) {
  static const TrainOptions defaults{};
  app.set_version_flag("--version", version_string(), "print towerflow's version and the commit it was built from");
  app.add_option("--config", config_, "INI file with any of these options ([train] and device sections); flags win")
      ->check(CLI::ExistingFile);
  // --help lists the options by topic, in this order (CLI11 shows groups in the order their first
  // option was added); the Devices group also takes the process options added below.
  app.formatter(std::make_shared<HelpFormatter>());
  static const char* const kGroups[] = {"Data", "Model", "Devices", "Towers", "Optimizer",
                                        "Training", "Checkpoints", "Output"};
  std::vector<const Field*> ordered;
  for (const char* group : kGroups)
    for (const auto& f : fields())
      if (std::string_view(f.group) == group) ordered.push_back(&f);
  TW_CHECK(ordered.size() == fields().size(), "every training option belongs to a --help group");
  for (const Field* field : ordered) {
    const Field& f = *field;
    if (!only.empty() && std::find(only.begin(), only.end(), f.name) == only.end()) continue;
    std::string name = f.name;
    auto record = [this, name](const std::string& value) {
      TrainOptions scratch;
      try {
        set_train_option(scratch, name, value);
      } catch (const Error& e) {
        throw CLI::ValidationError("--" + name, e.what());
      }
      given_.emplace_back(name, value);
    };
    CLI::Option* opt;
    if (std::holds_alternative<bool TrainOptions::*>(f.member)) {
      // "--resume" means true; "--resume=false" is accepted too.
      opt = app.add_flag_function(
          "--" + name + "{true}",
          [record, &app, name](std::int64_t) { record(app.get_option("--" + name)->as<std::string>()); }, f.help);
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      opt->option_text(std::string("FLAG=") + value_text(defaults, f));
    } else {
      opt = app.add_option_function<std::string>("--" + name, record, f.help);
      // A flag given twice takes its last value, as absl and argparse do, so a wrapper script's
      // flags can be overridden by appending the same flag.
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      const std::string default_text = value_text(defaults, f);
      opt->default_str(default_text.empty() ? "\"\"" : default_text);
      opt->type_name(std::visit(
          [](auto member) -> std::string {
            using T = std::decay_t<decltype(TrainOptions{}.*member)>;
            if constexpr (std::is_same_v<T, std::string>) return "TEXT";
            else if constexpr (std::is_floating_point_v<T>) return "NUMBER";
            else return "INT";
          },
          f.member));
      if (f.choices) opt->type_name(f.choices);
      if (name == "devices") opt->default_str("all");
    }
    opt->group(f.group);
  }
  add_process_option_flags(app, process_flags_);
  // The process options' defaults, as --help shows them (unset options keep TensorFlow's
  // behaviour; this program's own default for device_count).
  for (const ProcessOptionInfo& info : process_option_table()) {
    CLI::Option* opt = app.get_option_no_throw("--" + std::string(info.name));
    if (!opt) continue;
    if (info.value_form.empty()) opt->option_text("FLAG=false");  // the switches
    else opt->default_str(info.name == "device_count" ? "CPU=2 without a GPU" : std::string(info.default_text));
  }
}

Resolved TrainCommandLine::resolve() const {
  Config c;
  if (!config_.empty()) c = load_config(config_);
  std::set<std::string> given(c.train_keys.begin(), c.train_keys.end());
  for (const auto& [name, value] : given_) {
    set_train_option(c.train, name, value);
    given.insert(name);
  }
  apply_recipe(c.train, given);
  return {c.train, c.process.merged_with(process_flags_), given};
}

bool is_invocation_option(std::string_view name) {
  static const std::set<std::string, std::less<>> kInvocation = {
      "resume", "resume_from", "resume_new_data", "init_from", "dry_run", "train_dir", "start_over",
      "progress", "json", "trace", "trace_steps"};
  return kInvocation.count(name) > 0;
}

std::vector<OptionChange> take_recorded_options(TrainOptions& opts, std::string_view recorded,
                                                const std::set<std::string>& keep, std::string_view source) {
  const nlohmann::json then = nlohmann::json::parse(recorded, nullptr, false);
  if (then.is_discarded() || !then.is_object())
    raise<DataError>(source, ": the recorded options are not a JSON object; the checkpoint's metadata is damaged");
  auto text = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  // Exact: a double compares as a double (0.05 and 0.0500001 differ), as JSON holds it.
  auto json_of = [](const TrainOptions& o, const Field& f) {
    return std::visit([&](auto member) { return nlohmann::json(o.*member); }, f.member);
  };
  std::vector<OptionChange> changed;
  for (const auto& f : fields()) {
    if (is_invocation_option(f.name) || !then.contains(f.name)) continue;
    const std::string was = text(then[f.name]);
    if (keep.count(f.name)) {
      TrainOptions recorded_value = opts;
      bool differs = true;  // a value this version refuses differs from any it accepts
      try {
        set_train_option(recorded_value, f.name, was);
        differs = json_of(recorded_value, f) != json_of(opts, f);
      } catch (const InvalidArgument&) {
      }
      if (differs) changed.push_back({f.name, was, text(json_of(opts, f))});
      continue;
    }
    try {
      set_train_option(opts, f.name, was);
    } catch (const InvalidArgument& e) {
      raise<DataError>(source, ": the run's recorded option ", f.name, " = ", was, " is not accepted: ", e.what(),
                       "; give --", f.name, " to choose a value");
    }
  }
  return changed;
}

std::string to_json(const TrainOptions& opts) {
  nlohmann::ordered_json j;
  for (const auto& f : fields()) {
    std::visit([&](auto member) { j[f.name] = opts.*member; }, f.member);
  }
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);  // a path need not be UTF-8
}

void apply_recipe(TrainOptions& opts, const std::set<std::string>& given) {
  if (opts.recipe != "airbench94") return;
  // airbench94's hyperparameters are per 1024 examples with a summed loss and decoupled from the
  // momentum: lr 11.5 and weight decay 0.0153 become PyTorch SGD's lr 11.5 / K and weight decay
  // 0.0153 * 1024 / 11.5 with K = 1024 * (1 + 1 / (1 - 0.85)). Towers average the loss over the
  // global batch B (Note [Why towers scale loss by B]): the same updates take lr * B and weight
  // decay / B, that is lr 1.5 and weight decay 0.0153 / 11.5 at B = 1024 (the 64x lr of the
  // batch-norm biases is a parameter group, set with the model). Batch norm takes its statistics
  // over the whole global batch, as the recipe's single device does, whatever the towers.
  const std::vector<std::pair<const char*, std::string>> settings = {
      {"model", "airbench94"},   {"batch_size", "1024"},     {"epochs", "9.9"},
      {"optimizer", "nesterov"}, {"lr", "1.5"},              {"momentum", "0.85"},
      {"weight_decay", number_text(0.0153 / 11.5)},          {"schedule", "linear:0=0.2,0.23=1,1=0.07"},
      {"warmup_epochs", "0"},    {"label_smoothing", "0.2"}, {"crop_padding", "2"},
      {"pad_mode", "reflect"},   {"flip", "alternating"},    {"tta", "2"},
      {"lookahead", "5"},        {"save_every", "0"},        {"batch_norm", "sync"}};
  for (const auto& [name, value] : settings)
    if (!given.count(name)) set_train_option(opts, name, value);
}

std::string as_flags(std::string_view message) {
  // The library's fields this program sets with a flag of its own (ProcessOptions' fields are
  // the library's flags, process_option_flag).
  static const std::map<std::string_view, std::string_view> kFlags = {
      {"FitOptions::batch", "batch_size"},
      {"LoaderOptions::batch", "batch_size"},
      {"FitOptions::train_dir", "train_dir"},
      {"FitOptions::keep_checkpoints", "keep_checkpoints"},
      {"TrainerOptions::precision", "precision"},
      {"TrainerOptions::batch_norm", "batch_norm"},
      {"ImageFolderOptions::bad_files", "skip_bad_files"},
      {"FitOptions::epochs", "epochs"},
      {"FitOptions::max_steps", "max_steps"},
      {"TrainerOptions::accumulation_steps", "accumulation_steps"},
      {"TrainerOptions::remainder", "split_remainder"},
      {"TrainerOptions::split", "split"},
  };
  // "BatchNormMode::PerTower" -> "per_tower", "Precision::Fp32" -> "fp32", "32" -> "32".
  auto flag_value = [](std::string_view v) {
    if (const auto colons = v.rfind("::"); colons != std::string_view::npos) v.remove_prefix(colons + 2);
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i] >= 'A' && v[i] <= 'Z' && i > 0) out += '_';
      out += lower(v.substr(i, 1));
    }
    return out;
  };
  std::string text = render_options(message, [&](const OptionMention& m) -> std::optional<std::string> {
    if (auto flag = process_option_flag(m)) return flag;
    const auto it = kFlags.find(m.field);
    if (it == kFlags.end()) return std::nullopt;
    if (it->second == "skip_bad_files") return std::string("--skip_bad_files");
    std::string out = str("--", it->second);
    if (!m.value.empty() && m.value != "true") out += " " + flag_value(m.value);
    return out;
  });
  // The data set's kind is --dataset's value; train::schedule()'s warm-up is --warmup_epochs.
  for (auto [from, to] : {std::pair<std::string_view, std::string_view>{"DatasetKind::Builtin", "--dataset builtin"},
                          {"(DatasetKind)", "(--dataset)"},
                          {"schedule()'s warmup_epochs", "--warmup_epochs"}})
    for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  return text;
}

}  // namespace towerflow::cifar10
