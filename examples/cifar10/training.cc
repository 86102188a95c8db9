#include "examples/cifar10/training.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <thread>
#include <variant>

#include <nlohmann/json.hpp>

#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/kernel_choice.h"
#include "core/log.h"
#include "core/memory/allocator.h"
#include "core/platform/logical.h"
#include "core/platform/platform.h"
#include "core/platform/registry.h"
#include "data/data.h"
#include "io/model_state.h"
#include "io/train_dir_lock.h"
#include "models/models.h"
#include "optim/optim.h"
#include "tower/tower.h"
#include "train/checkpoint.h"

namespace towerflow::cifar10 {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string join(const std::vector<Device>& devices) {
  std::string out;
  for (const auto& d : devices) out += (out.empty() ? "" : ", ") + d.str();
  return out;
}

data::DatasetKind dataset_kind(const TrainOptions& o) {
  if (o.dataset != "auto") return data::parse_dataset_kind(o.dataset);
  if (o.data_dir.empty()) return data::DatasetKind::Builtin;
  return data::detect_dataset_kind(o.data_dir);
}

}  // namespace

Preprocessing preprocessing(const TrainOptions& o) {
  Preprocessing p;
  {
    const std::string& v = o.image_size;
    const std::size_t x = v.find('x');
    std::size_t used_h = 0, used_w = 0;
    try {
      p.height = std::stoi(v.substr(0, x), &used_h);
      p.width = x == std::string::npos ? p.height : std::stoi(v.substr(x + 1), &used_w);
    } catch (const std::logic_error&) {
      used_h = 0;
    }
    const bool ok = used_h == (x == std::string::npos ? v.size() : x) &&
                    (x == std::string::npos || used_w == v.size() - x - 1) && p.height >= 1 && p.width >= 1 &&
                    p.height <= 4096 && p.width <= 4096;
    if (!ok)
      raise<InvalidArgument>("--image_size \"", v, "\" is not a size; write N or HxW with sides in 1..4096, e.g. "
                             "--image_size 64 or --image_size 48x64");
  }
  const auto triple = [](const char* flag, const std::string& v, std::array<float, 3> cifar10,
                         std::array<float, 3> imagenet, bool positive) {
    if (v == "cifar10") return cifar10;
    if (v == "imagenet") return imagenet;
    std::array<float, 3> out{};
    std::size_t at = 0;
    for (int c = 0; c < 3; ++c) {
      const std::size_t end = c < 2 ? v.find(',', at) : v.size();
      std::size_t used = 0;
      bool ok = end != std::string::npos;
      if (ok) {
        try {
          out[c] = std::stof(v.substr(at, end - at), &used);
        } catch (const std::logic_error&) {
          ok = false;
        }
      }
      ok = ok && used == end - at && std::isfinite(out[c]) && (!positive || out[c] > 0);
      if (!ok)
        raise<InvalidArgument>("--", flag, " \"", v, "\" is not three ", positive ? "positive " : "",
                               "numbers R,G,B (for pixels scaled to [0, 1]), cifar10 or imagenet; e.g. --", flag, " ",
                               positive ? "0.229,0.224,0.225" : "0.485,0.456,0.406");
      at = end + 1;
    }
    return out;
  };
  p.mean = triple("mean", o.mean, data::kCifar10Mean, {0.485f, 0.456f, 0.406f}, false);
  p.std = triple("std", o.stddev, data::kCifar10Std, {0.229f, 0.224f, 0.225f}, true);
  return p;
}

namespace {

std::string text_of(const std::array<float, 3>& v) { return str(v[0], ",", v[1], ",", v[2]); }

// The data set of `split`, its images at --image_size: an image folder resizes as it decodes,
// the others through data::Resized.
std::unique_ptr<data::Dataset> open(const TrainOptions& o, data::Split split) {
  const Preprocessing p = preprocessing(o);
  data::DatasetOptions dopts;
  dopts.folder.height = p.height;
  dopts.folder.width = p.width;
  dopts.builtin.train_size = o.builtin_train_size;
  dopts.builtin.test_size = o.builtin_test_size;
  dopts.folder.bad_files = o.skip_bad_files ? data::BadFilePolicy::Skip : data::BadFilePolicy::Fail;
  std::unique_ptr<data::Dataset> set = data::open_dataset(dataset_kind(o), o.data_dir, split, dopts);
  if (set->shape().h == p.height && set->shape().w == p.width) return set;
  return std::make_unique<data::Resized>(std::move(set), p.height, p.width);
}

// --val_split: the training set's two parts; --val_dir: a set of its own, the training set whole.
struct ValidationData {
  std::unique_ptr<data::Dataset> train;  // null: the whole training set trains
  std::unique_ptr<data::Dataset> owned;  // --val_dir's set
  const data::Dataset* set = nullptr;    // null: no validation set
};

ValidationData open_validation(const TrainOptions& o, const data::Dataset& train_set) {
  ValidationData v;
  if (o.val_split > 0 && !o.val_dir.empty())
    raise<InvalidArgument>("--val_split ", o.val_split, " and --val_dir ", o.val_dir,
                           " both name a validation set; give one of them");
  if (o.val_split > 0) {
    data::Holdout held;
    try {
      held = data::holdout(train_set, o.val_split, o.seed);
    } catch (const InvalidArgument& e) {
      raise<InvalidArgument>("--val_split: ", e.what());
    }
    v.set = held.validation.get();
    v.train = std::move(held.train);
    v.owned = std::move(held.validation);
    return v;
  }
  if (o.val_dir.empty()) return v;
  const data::DatasetKind kind = dataset_kind(o);
  if (kind == data::DatasetKind::Builtin)
    raise<InvalidArgument>("--val_dir ", o.val_dir, " with the built-in dataset, which has no folder; use --val_split "
                           "to hold out part of it, or give --data_dir");
  TrainOptions at_dir = o;
  at_dir.data_dir = o.val_dir;
  at_dir.dataset = std::string(data::to_string(kind));
  try {
    v.owned = open(at_dir, data::Split::Test);
  } catch (const Error& e) {
    raise<InvalidArgument>("--val_dir ", o.val_dir, ": ", e.what());
  }
  if (v.owned->num_classes() != train_set.num_classes() || v.owned->shape() != train_set.shape())
    raise<InvalidArgument>("--val_dir ", o.val_dir, " holds ", v.owned->num_classes(), " classes of ",
                           v.owned->shape().h, "x", v.owned->shape().w, "x", v.owned->shape().c,
                           " images, the training set ", train_set.num_classes(), " of ", train_set.shape().h, "x",
                           train_set.shape().w, "x", train_set.shape().c, "; give a validation set of the same classes");
  v.set = v.owned.get();
  return v;
}

// --schedule plateau[:FACTOR[:PATIENCE[:MIN_LR]]]: nullopt for any other schedule.
std::optional<train::PlateauOptions> parse_plateau(const std::string& spec) {
  if (spec != "plateau" && !spec.starts_with("plateau:")) return std::nullopt;
  train::PlateauOptions p;
  std::vector<std::string> parts;
  for (std::size_t at = 8; at <= spec.size() && spec.size() > 7;) {
    const std::size_t end = std::min(spec.find(':', at), spec.size());
    parts.push_back(spec.substr(at, end - at));
    at = end + 1;
  }
  const auto bad = [&](const std::string& what) {
    raise<InvalidArgument>("--schedule \"", spec, "\": ", what, "; write plateau[:FACTOR[:PATIENCE[:MIN_LR]]], e.g. "
                           "plateau:0.1:5 (the rate times 0.1 after 5 evaluations without improvement of --monitor)");
  };
  if (parts.size() > 3) bad("too many parts");
  try {
    std::size_t used = 0;
    if (parts.size() > 0 && (p.factor = std::stod(parts[0], &used), used != parts[0].size())) bad("FACTOR is not a number");
    if (parts.size() > 1 && (p.patience = std::stoi(parts[1], &used), used != parts[1].size())) bad("PATIENCE is not an integer");
    if (parts.size() > 2 && (p.min_lr = std::stod(parts[2], &used), used != parts[2].size())) bad("MIN_LR is not a number");
  } catch (const std::logic_error&) {
    bad("a part is not a number");
  }
  try {
    train::ReduceLrOnPlateau check({}, p);
  } catch (const InvalidArgument& e) {
    bad(e.what());
  }
  return p;
}

tower::TrainerOptions trainer_options(const TrainOptions& o) {
  tower::TrainerOptions t;
  t.reduction = tower::parse_reduction(o.reduction);
  t.split = tower::parse_split(o.split);
  t.batch_norm = o.batch_norm == "sync" ? tower::BatchNormMode::Synchronised : tower::BatchNormMode::PerTower;
  t.label_smoothing = static_cast<float>(o.label_smoothing);
  t.clip_grad_norm = o.clip_grad_norm;
  t.precision = parse_precision(o.precision);
  t.accumulation_steps = o.accumulation_steps;
  if (o.split_remainder == "spread") t.remainder = tower::Remainder::Spread;
  else if (o.split_remainder != "error")
    raise<InvalidArgument>("--split_remainder \"", o.split_remainder, "\" is not known; use error or spread");
  return t;
}


// What a run trained on, as recorded in its checkpoints ("data") and compared on --resume: the
// kind of data set, its training images and classes. A data_dir that moved keeps it.
std::string data_identity(const TrainOptions& o, const data::Dataset& train_set) {
  return str(data::to_string(dataset_kind(o)), ", ", train_set.size(), " training images, ", train_set.num_classes(),
             " classes");
}

// --resume as the command line means it: the options of the run being continued (see training.h).
struct Resumption {
  std::string checkpoint;   // empty: nothing to resume here (fit starts a new run and says so)
  io::Metadata metadata;    // the checkpoint's
  std::vector<OptionChange> changed;
};

Resumption resume_options(TrainOptions& o, const std::set<std::string>& given) {
  Resumption r;
  if (!o.resume) return r;
  collectives::ProcessGroup& world = collectives::world();
  // Rank 0 chooses, as fit() will (it alone may see train_dir), and every rank takes its options.
  std::string chosen, recorded;
  if (world.rank() == 0) {
    if (!o.resume_from.empty()) {
      try {
        chosen = train::find_checkpoint(o.train_dir, o.resume_from).path.string();
      } catch (const NotFound& e) {
        raise<NotFound>("--resume_from: ", e.what());
      } catch (const InvalidArgument& e) {
        raise<InvalidArgument>("--resume_from: ", e.what());
      }
    } else {
      std::vector<std::string> passed_over;  // fit() names them when it chooses the same one
      if (auto c = train::newest_intact_checkpoint(o.train_dir, &passed_over)) chosen = c->path.string();
    }
    if (!chosen.empty()) {
      io::Metadata meta = train::read_checkpoint_info(chosen).metadata;
      if (auto it = meta.find("options"); it != meta.end()) recorded = it->second;
    }
  }
  chosen = world.broadcast(chosen, 0);
  recorded = world.broadcast(recorded, 0);
  if (chosen.empty()) return r;
  r.checkpoint = chosen;
  r.metadata = train::read_checkpoint_info(chosen).metadata;
  if (recorded.empty()) {
    log_warning(str("--resume: ", chosen, " records no options (it was not written by cifar10_train); the run goes on "
                    "with the options given now"));
    return r;
  }
  const std::string recorded_model = [&] {
    const nlohmann::json then = nlohmann::json::parse(recorded, nullptr, false);
    return then.is_object() && then.contains("model") && then["model"].is_string() ? then["model"].get<std::string>()
                                                                                 : std::string();
  }();
  if (!recorded_model.empty() && given.count("model") && recorded_model != o.model)
    raise<InvalidArgument>("--resume: the run in --train_dir ", o.train_dir, " (", fs::path(chosen).filename().string(),
                           ") trains ", recorded_model, ", and --model ", o.model,
                           " cannot continue it: a checkpoint holds the weights of its own model. Leave --model out "
                           "to continue the run; to train ", o.model, ", start a new run (another --train_dir, or "
                           "--start_over move)");
  r.changed = take_recorded_options(o, recorded, given, chosen);
  return r;
}

// A resumed run must go on with the data it trained on, unless --resume_new_data says otherwise.
void check_resumed_data(const Resumption& r, const TrainOptions& o, const data::Dataset& train_set) {
  if (r.checkpoint.empty() || o.resume_new_data) return;
  const std::string now = data_identity(o, train_set);
  std::string then;
  if (auto it = r.metadata.find("data"); it != r.metadata.end()) {
    then = it->second;
  } else {  // written before "data" was recorded: the data options themselves
    for (const auto& c : r.changed)
      if (c.name == "data_dir" || c.name == "dataset" || c.name == "builtin_train_size")
        then += str(then.empty() ? "" : ", ", c.name, " ", c.recorded.empty() ? "\"\"" : c.recorded);
    if (then.empty()) return;
  }
  if (then == now) return;
  raise<InvalidArgument>("--resume: the run in --train_dir ", o.train_dir, " trained on ", then, "; the data given now is ",
                         now, " (", train_set.describe(), "). Leave the data flags out to continue on the run's data, "
                         "give --resume_new_data to continue this run on the new data, or start a new run from its "
                         "weights with --init_from ", o.train_dir, " and another --train_dir");
}

std::string describe_changes(const std::vector<OptionChange>& changed) {
  std::string out;
  for (const auto& c : changed)
    out += str(out.empty() ? "" : ", ", c.name, " ", c.now.empty() ? "\"\"" : c.now, " (the run's: ",
               c.recorded.empty() ? "\"\"" : c.recorded, ")");
  return out;
}

// --dry_run: the start-up block the run would print, and each device's memory after one forward
// and backward of the first batch (no optimizer step, nothing written, no train_dir touched).
FitResult dry_run(tower::Trainer& trainer, optim::Optimizer& optimizer, const data::Dataset& train_set,
                  const data::Dataset* test_set, const train::FitOptions& fopts, const Resumption& resumption,
                  Reporter& reporter) {
  // As fit() would, before its first step: the batch split and the schedule over the run.
  trainer.check_batch(fopts.batch);
  const train::Plan plan = train::plan(train_set, fopts);
  if (fopts.schedule) (void)fopts.schedule(plan);
  collectives::ProcessGroup& world = collectives::world();
  std::optional<train::CheckpointInfo> resumed;
  train::TrainingPosition position;
  if (!resumption.checkpoint.empty()) {
    resumed = train::read_checkpoint_info(resumption.checkpoint);
    position = resumed->position;
  }
  const train::StartInfo start{.trainer = trainer, .optimizer = optimizer, .train_set = train_set, .test_set = test_set,
                               .validation_set = fopts.validation_set,
                               .options = fopts, .plan = plan, .position = position,
                               .resumed = resumed, .resumed_from = resumption.checkpoint, .run_id = "(a dry run)"};
  if (world.rank() == 0) reporter.on_start(start);
  data::Loader loader(train_set, {.batch = fopts.batch, .augment = fopts.augment, .seed = fopts.seed,
                                  .rank = world.rank(), .world_size = world.size(),
                                  .shard = [&](int n, std::int64_t epoch, std::int64_t index) {
                                    return trainer.shard(n, epoch * plan.steps_per_epoch + index + 1);
                                  },
                                  .threads = 0});
  loader.set_epoch(position.epoch, position.step_in_epoch);
  loader.start();
  const data::Batch* batch = loader.next();
  TW_CHECK(batch != nullptr, "the loader gave no batch for the dry run");
  tower::HostBatch host = tower::HostBatch::of(*batch);
  host.step = position.step + 1;
  trainer.forward_backward(host);
  loader.stop();
  train::Fields memory;
  for (const Device& d : trainer.devices()) {
    const AllocatorStats s = device_allocator(d).stats();
    memory.emplace_back("memory " + d.str(), str("peak ", format_byte_size(s.peak_bytes_in_use), " after one forward and backward of ",
                                                 fopts.batch, " rows (limit ", format_byte_size(s.bytes_limit),
                                                 "); the optimizer's state adds to it at the first step"));
  }
  if (world.rank() == 0) reporter.block("dry_run", "dry run: nothing was trained or written", memory);
  return {};
}

// An evaluation's confusion matrix as JSON (scripts/plot_confusion.py draws it): the class names,
// the [true][predicted] counts, each class's accuracy, top-1 and top-5. Written atomically.
void write_confusion(const fs::path& path, const train::EvalRecord& r, const std::vector<std::string>& names) {
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["examples"] = r.examples;
  j["set"] = train::metric_prefix(r.set);  // val | test
  j["acc"] = r.test_acc;
  j["top5"] = r.test_top5;
  j["classes"] = names.size() == static_cast<std::size_t>(r.classes) ? nlohmann::ordered_json(names)
                                                                      : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (int t = 0; t < r.classes; ++t)
    rows.push_back(std::vector<std::int64_t>(r.confusion.begin() + t * r.classes, r.confusion.begin() + (t + 1) * r.classes));
  j["confusion"] = rows;
  nlohmann::ordered_json per_class = nlohmann::ordered_json::array();
  for (const auto& a : train::class_accuracy(r.classes, r.confusion))
    per_class.push_back(a ? nlohmann::ordered_json(*a) : nlohmann::ordered_json(nullptr));
  j["class_acc"] = per_class;
  io::write_file_atomically(path, j.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
}

// What a model or a recipe adds to the run: airbench94's whitening layer from the first 5,000
// training images (a resumed run then loads its checkpoint's over it; --init_from's weights keep
// theirs), and --recipe airbench94's
// parameter groups (batch-norm biases at 64x the lr, the whitening bias frozen after 3 epochs).
struct Recipe {
  std::vector<std::pair<std::string, std::string>> fields;  // for the start-up block
  std::unique_ptr<train::LambdaHook> hook;
};

Recipe set_up_recipe(const TrainOptions& o, tower::Trainer& trainer, optim::Optimizer& optimizer,
                     const data::Dataset& train_set, const data::Augment& augment) {
  Recipe r;
  if (models::Airbench94* net = models::as_airbench94(trainer.model()); net && o.init_from.empty()) {
    const auto t0 = Clock::now();
    const int n = static_cast<int>(std::min<std::int64_t>(5000, train_set.size()));
    data::Loader first(train_set, {.batch = n, .augment = {.mean = augment.mean, .std = augment.std},
                                   .shuffle = false, .drop_last = false, .threads = 0});
    const data::Batch& b = *first.begin();
    net->whiten(Tensor::from_host(std::span<const float>(b.images.data(), b.n * b.image_floats()),
                                  {b.n, b.h, b.w, b.c}, Device::cpu()));
    trainer.broadcast_from_replica0();
    r.fields.emplace_back("whitening", str("2x2 patches of the first ", n, " training images, in ",
                                           std::lround(seconds_since(t0) * 1000), " ms"));
  }
  if (o.recipe == "airbench94") {
    optimizer.set_groups({{.name = "norm_biases", .slots = optim::slots_containing("norm"), .lr_scale = 64,
                           .weight_decay = o.weight_decay / 64},
                          {.name = "whitening_bias", .slots = optim::slots_named({"0.bias"})}});
    r.hook = std::make_unique<train::LambdaHook>();
    constexpr std::int64_t kWhiteningBiasEpochs = 3;
    r.hook->start = [&optimizer](const train::StartInfo& s) {
      if (s.position.epoch >= kWhiteningBiasEpochs) optimizer.set_group_frozen("whitening_bias", true);
    };
    r.hook->epoch_end = [&optimizer](std::int64_t epoch) {
      if (epoch + 1 == kWhiteningBiasEpochs) optimizer.set_group_frozen("whitening_bias", true);
    };
    r.fields.emplace_back("recipe", "airbench94: batch-norm biases at 64x the lr with weight decay / 64, "
                                    "the whitening bias trained for 3 epochs, then frozen");
  }
  if (o.lookahead > 0)
    r.fields.emplace_back("lookahead", str("every ", o.lookahead, " steps, decay 0.95^5 * (step / steps)^3"));
  if (o.tta > 0)
    r.fields.emplace_back("test views", o.tta == 1 ? "the image and its mirror, in the final evaluation"
                                                   : "six (mirror, one-pixel shifts), in the final evaluation");
  return r;
}

std::string optimizer_description(const TrainOptions& o) {
  std::string out = o.optimizer + ", lr " + str(o.lr);
  if (o.optimizer == "sgd" || o.optimizer == "nesterov") out += str(", momentum ", o.momentum);
  else out += str(", betas (", o.adam_beta1, ", ", o.adam_beta2, "), eps ", o.adam_epsilon);
  out += str(", weight decay ", o.weight_decay, ", schedule ", o.schedule);
  if (o.warmup_epochs > 0)
    out += str(" after ", o.warmup_epochs, o.warmup_epochs == 1 ? " warm-up epoch" : " warm-up epochs");
  return out;
}

}  // namespace

std::vector<Device> choose_devices(const TrainOptions& o, ProcessOptions& process) {
  bool explicit_list = !o.devices.empty() && o.devices != "all";
  const collectives::ProcessGroup& world = collectives::world();
  bool has_gpu = !make_system_platform()->gpus().empty();
  bool cpu_configured = process.device_count.count("CPU") || process.virtual_devices.cpu_memory_limits_mb;
  std::vector<Device> listed;
  if (explicit_list) {
    std::stringstream ss(o.devices);
    for (std::string name; std::getline(ss, name, ',');) {
      std::string_view n = name;
      while (!n.empty() && n.front() == ' ') n.remove_prefix(1);
      while (!n.empty() && n.back() == ' ') n.remove_suffix(1);
      if (n.empty()) continue;
      try {
        // A name with a task is a device of that process (TensorFlow's cluster naming).
        if (auto task = device_task(n)) {
          if (*task >= world.size())
            raise<InvalidArgument>("'", n, "' names task ", *task, " but the job has ", world.size(),
                                   world.size() == 1 ? " process (task 0)" : str(" processes (tasks 0..", world.size() - 1, ")"),
                                   "; start more processes (mpirun -np ", *task + 1, ") or name an existing task");
          if (*task != world.rank()) continue;
        }
        listed.push_back(Device::parse(n));
      } catch (const InvalidArgument& e) {
        raise<InvalidArgument>("--devices: ", e.what());
      }
    }
    if (listed.empty())
      raise<InvalidArgument>("--devices \"", o.devices, "\" names no device",
                             world.size() > 1 ? str(" of task ", world.rank(), " (this process, rank ", world.rank(), ")") : "",
                             "; write e.g. /cpu:0,/cpu:1 or all");
    // Naming /cpu:3 asks for four logical CPU devices unless the options already say how many:
    // never more than the host has threads, and never without saying so when some go unused
    // (each device gets an equal share of the threads, used or not).
    int max_cpu = -1, named_cpus = 0;
    for (const auto& d : listed)
      if (d.is_cpu()) max_cpu = std::max(max_cpu, d.index), ++named_cpus;
    if (max_cpu >= 1 && !cpu_configured) {
      const int threads = static_cast<int>(std::thread::hardware_concurrency());
      const Device& highest = Device::cpu(max_cpu);
      if (threads > 0 && max_cpu + 1 > threads)
        raise<InvalidArgument>("--devices names ", highest, ", which needs ", max_cpu + 1,
                               " logical CPU devices, and this host has ", threads, " hardware thread",
                               threads == 1 ? "" : "s", "; name /cpu:0..", Device::cpu(std::max(0, threads - 1)),
                               ", or make that many devices on purpose with --device_count CPU=", max_cpu + 1,
                               " (they then share the threads)");
      if (named_cpus < max_cpu + 1)
        log_warning(str("--devices names ", highest, ", so ", max_cpu + 1, " logical CPU devices are made (device_count "
                        "CPU=", max_cpu + 1, "), each with an equal share of the host's ", threads,
                        " threads, and only the ", named_cpus, " named train; name /cpu:0..", highest,
                        " to use them all, or set --device_count"));
      process.device_count["CPU"] = max_cpu + 1;
    }
  }
  // The library's defaults (tower/devices.h): two CPU towers without a GPU, unless devices are
  // named or --num_gpus asks for GPUs; processes on one host share its threads.
  process = tower::with_tower_defaults(
      process, {.has_gpu = has_gpu,
                .processes_on_host = world.local_size(),
                .hardware_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency())),
                .two_cpu_towers = !explicit_list && o.num_gpus <= 0});
  const auto& all = initialise_devices(process);
  set_kernel_choice(parse_kernel_choice(o.kernel_choice, "--kernel_choice"));
  std::vector<Device> gpus, cpus;
  for (const auto& ld : all) (ld.device.is_gpu() ? gpus : cpus).push_back(ld.device);

  if (explicit_list) {
    std::vector<Device> out;
    for (const auto& d : listed) {
      Device p = place(d);  // NotFound (or soft placement) naming what exists
      if (std::find(out.begin(), out.end(), p) != out.end())
        raise<InvalidArgument>("--devices lists ", p.str(), " twice", p != d ? str(" (", d.str(), " was placed there)") : "",
                               "; list each device once");
      out.push_back(p);
    }
    return out;
  }
  if (o.num_gpus >= 0 && !(o.num_gpus == 0 && gpus.empty())) {
    if (o.num_gpus > static_cast<int>(gpus.size()))
      raise<InvalidArgument>("--num_gpus ", o.num_gpus, " but this process has ", gpus.size(), " GPU",
                             gpus.size() == 1 ? "" : "s", gpus.empty() ? "" : str(" (", join(gpus), ")"),
                             "; use --num_gpus ", gpus.size(), " or --devices all");
    if (o.num_gpus == 0) return cpus;
    return {gpus.begin(), gpus.begin() + o.num_gpus};
  }
  return gpus.empty() ? cpus : gpus;
}

FitResult run_training(const TrainOptions& options, ProcessOptions process, Reporter& reporter,
                       const std::vector<train::Hook*>& extra, const std::optional<std::set<std::string>>& given) {
  collectives::ProcessGroup& world = collectives::world();
  // Every rank runs with the same flags (a rank with others would train another model, or
  // wait in collectives that the others never make).
  collectives::check_same_on_every_rank(world, "the options", to_json(options),
                                        "start every rank with the same flags and config file");
  TrainOptions o = options;
  if (!o.resume_from.empty()) o.resume = true;
  if (!o.init_from.empty() && o.resume)
    raise<InvalidArgument>("--init_from starts a new run from a checkpoint's weights and --resume", o.resume_from.empty() ? "" : "_from",
                           " continues a run; give one of them");
  // --resume continues the run with the options it recorded, those given now excepted (without
  // `given`, every option is as given: none is taken, and those that differ are still listed).
  std::set<std::string> every_option;
  if (!given)
    for (const OptionDoc& d : describe_train_options(o)) every_option.insert(d.name);
  const Resumption resumption = resume_options(o, given ? *given : every_option);
  if (!resumption.changed.empty())
    log_warning(str("--resume: the run continues with options changed from its own: ", describe_changes(resumption.changed)));
  std::vector<Device> devices = choose_devices(o, process);
  collectives::check_same_on_every_rank(world, "the number of devices per process", std::to_string(devices.size()),
                                        "give every process the same number of devices (--devices, --num_gpus)");
  auto train_file = open(o, data::Split::Train);
  auto test_set = open(o, data::Split::Test);
  check_resumed_data(resumption, o, *train_file);
  // The validation set: held out of the training set, or a set of its own; training uses the rest.
  const ValidationData validation = open_validation(o, *train_file);
  const data::Dataset* train_set = validation.train ? validation.train.get() : train_file.get();
  tower::TrainerOptions topts = trainer_options(o);
  topts.processes = &world;
  // The towers of every process.
  std::vector<Device> towers;
  for (int r = 0; r < world.size(); ++r) towers.insert(towers.end(), devices.begin(), devices.end());

  train::FitOptions fopts;
  fopts.batch = tower::global_batch(o.batch_size, static_cast<int>(towers.size()), topts.split);
  if ((o.mixup > 0 || o.cutmix > 0) && fopts.batch < 2)
    raise<InvalidArgument>("--mixup / --cutmix mix each image with another of its batch; --batch_size ", o.batch_size,
                           " gives a global batch of ", fopts.batch, ": use a batch of at least 2");
  // The built-in set already varies position, scale and colour, so it gets no crop or flip;
  // cutout, when asked for, applies to every dataset.
  fopts.augment = data::eval_transform();
  if (dataset_kind(o) != data::DatasetKind::Builtin) {
    fopts.augment.crop_padding = o.crop_padding;
    fopts.augment.pad_mode = o.pad_mode == "reflect" ? data::PadMode::Reflect : data::PadMode::Zeros;
    fopts.augment.flip = o.flip != "none";
    fopts.augment.flip_mode = o.flip == "alternating" ? data::FlipMode::Alternating : data::FlipMode::Random;
  }
  fopts.augment.cutout = o.cutout;
  const Preprocessing prep = preprocessing(o);
  fopts.augment.mean = prep.mean;
  fopts.augment.std = prep.std;
  fopts.mix = {.mixup_alpha = static_cast<float>(o.mixup), .cutmix_alpha = static_cast<float>(o.cutmix)};
  if (const data::ImageShape shape = train_set->shape(); o.cutout > std::max(shape.h, shape.w))
    raise<InvalidArgument>("--cutout ", o.cutout, " is larger than the ", shape.h, "x", shape.w,
                           " training images; use 0 (none) .. ", std::max(shape.h, shape.w), " (16 is usual for CIFAR-10)");
  fopts.seed = o.seed;
  fopts.loader_threads = o.loader_threads;
  // A fractional --epochs ends inside its last epoch: ceil(epochs * steps per epoch) steps.
  fopts.epochs = static_cast<int>(std::ceil(o.epochs));
  fopts.max_steps = o.max_steps;
  if (fopts.max_steps == 0 && o.epochs != std::floor(o.epochs))
    fopts.max_steps = static_cast<std::int64_t>(std::ceil(o.epochs * static_cast<double>(train::plan(*train_set, fopts).steps_per_epoch)));
  if (o.tta > 0) fopts.final_views = data::test_views(o.tta);
  const std::optional<train::PlateauOptions> plateau = parse_plateau(o.schedule);
  // The metrics watched, checked here so that their errors speak in flags.
  for (const auto& [flag, metric, used] : {std::tuple{"keep_best", o.keep_best, !o.keep_best.empty()},
                                           std::tuple{"monitor", o.monitor, o.early_stop > 0 || plateau.has_value()}}) {
    if (!used) continue;
    train::MetricName m;
    try {
      m = train::parse_metric(metric);
    } catch (const InvalidArgument& e) {
      raise<InvalidArgument>("--", flag, ": ", e.what());
    }
    if (m.set == train::EvalSet::Validation && !validation.set)
      raise<InvalidArgument>("--", flag, " ", metric, " watches the validation set, and this run has none; add "
                             "--val_split 0.1 (or --val_dir DIR), or watch ", m.quantity, " (the test set here)");
  }
  fopts.schedule = train::schedule(plateau ? "constant" : o.schedule, o.lr, o.warmup_epochs);
  fopts.eval_every = o.eval_every;
  fopts.validation_set = validation.set;
  fopts.log_every = o.log_every;
  fopts.train_dir = o.train_dir;
  fopts.save_every = o.save_every;
  fopts.keep_checkpoints = o.keep_checkpoints;
  fopts.resume = o.resume;
  fopts.resume_from = o.resume_from;
  fopts.start_over = o.start_over == "move"     ? train::StartOver::MoveAside
                     : o.start_over == "delete" ? train::StartOver::Delete
                                                : train::StartOver::Refuse;
  fopts.checkpoint_errors =
      o.on_checkpoint_error == "continue" ? train::CheckpointErrors::Continue : train::CheckpointErrors::Stop;
  fopts.metadata = {{"model", o.model},
                    {"num_classes", std::to_string(train_set->num_classes())},
                    {"options", to_json(o)},
                    {"data", data_identity(o, *train_file)},
                    {"class_names", nlohmann::json(train_set->class_names()).dump()},
                    {"image_size", str(prep.height, "x", prep.width)},
                    {"mean", text_of(prep.mean)},
                    {"std", text_of(prep.std)},
                    {"producer", "towerflow cifar10_train"}};

  std::unique_ptr<tower::Trainer> trainer;
  std::unique_ptr<optim::Optimizer> optimizer;
  try {
    models::ModelOptions mopts{.num_classes = train_set->num_classes(), .seed = o.seed, .image_height = prep.height,
                               .image_width = prep.width};
    trainer = std::make_unique<tower::Trainer>(models::factory(o.model, mopts), devices, topts);
    optimizer = optim::make_optimizer(trainer->parameters(), {.name = o.optimizer,
                                                              .lr = o.lr,
                                                              .momentum = o.momentum,
                                                              .weight_decay = o.weight_decay,
                                                              .beta1 = o.adam_beta1,
                                                              .beta2 = o.adam_beta2,
                                                              .eps = o.adam_epsilon});
  } catch (const OutOfMemory& e) {
    throw train::explain_out_of_memory(e, devices, fopts.batch);
  }
  const Recipe recipe = set_up_recipe(o, *trainer, *optimizer, *train_set, fopts.augment);
  // --init_from: a new run from a checkpoint's (or a state_dict's) weights.
  fs::path initial_weights;
  if (!o.init_from.empty()) {
    try {
      initial_weights = train::resolve_model_file(o.init_from);
      // Every tensor of the model must be there, shaped alike; the file's others (PyTorch's
      // num_batches_tracked) are not the model's and are left out.
      io::load_module(trainer->model(), initial_weights, {.strict = false, .destination = "the model " + o.model});
    } catch (const NotFound& e) {
      raise<NotFound>("--init_from: ", e.what());
    } catch (const DataError& e) {
      raise<DataError>("--init_from ", o.init_from, ": ", e.what());
    }
    trainer->broadcast_from_replica0();
  }

  reporter.set_start_block("towerflow cifar10_train", [&](const train::StartInfo& s, train::Fields& f) {
    train::set_field(f, "model", str(o.model, " (", trainer->model().num_parameters(), " parameters, ",
                                     train_set->num_classes(), " classes)"));
    if (!initial_weights.empty()) train::set_field(f, "initial weights", initial_weights.string(), "model");
    if (s.resumed && !resumption.checkpoint.empty())
      train::set_field(f, "resumed options",
                       resumption.changed.empty() ? std::string("as the run recorded them")
                                                  : "as the run recorded them, except " + describe_changes(resumption.changed),
                       "resumed");
    train::set_field(f, "optimizer", optimizer_description(o));
    for (const auto& [key, value] : recipe.fields) train::set_field(f, key, value, "optimizer");
    if (world.size() > 1)
      train::set_field(f, "processes", str(world.name(), "; ", towers.size(), " towers (", devices.size(),
                                           " per process)"), "devices");
    if (o.label_smoothing > 0)
      train::set_field(f, "loss", str("cross-entropy with label smoothing ", o.label_smoothing), "optimizer");
    if (o.clip_grad_norm > 0)
      train::set_field(f, "gradients", str("clipped to global L2 norm ", o.clip_grad_norm), "optimizer");
    std::vector<std::string> watching;
    if (!o.keep_best.empty())
      watching.push_back(str("the best ", o.keep_best, "'s checkpoint kept in ", (fs::path(o.train_dir) / "best").string()));
    if (o.early_stop > 0)
      watching.push_back(str("stop after ", o.early_stop, o.early_stop == 1 ? " evaluation" : " evaluations",
                             " without improvement of ", o.monitor));
    if (plateau)
      watching.push_back(str("lr times ", plateau->factor, " after ", plateau->patience,
                             plateau->patience == 1 ? " evaluation" : " evaluations", " without improvement of ",
                             o.monitor, plateau->min_lr > 0 ? str(", down to ", plateau->min_lr) : std::string()));
    if (!watching.empty()) {
      std::string text;
      for (const auto& w : watching) text += (text.empty() ? "" : "; ") + w;
      train::set_field(f, "metrics watched", text, "checkpoints");
    }
  });

  if (o.dry_run) return dry_run(*trainer, *optimizer, *train_set, test_set.get(), fopts, resumption, reporter);

  // The command line's hooks: the start-up block and progress, metrics.jsonl.
  train::MetricsFile metrics(fs::path(o.train_dir) / "metrics.jsonl");
  train::TensorBoard tensorboard(o.logdir.empty() ? fs::path(o.train_dir) : fs::path(o.logdir),
                                 {.histogram_every = o.histogram_every});
  // Across processes, rank 0 alone reports and writes files.
  std::vector<train::Hook*> hooks;
  const bool rank0 = world.rank() == 0;
  // The newest evaluation's confusion matrix, next to metrics.jsonl (a file of the run's, like it).
  struct ConfusionFile : train::Hook {
    fs::path path;
    std::vector<std::string> names;
    void on_eval(const train::EvalRecord& r) override { write_confusion(path, r, names); }
    std::vector<fs::path> files() const override { return {path}; }
  } confusion;
  confusion.path = fs::path(o.train_dir) / "confusion.json";
  if (test_set) confusion.names = test_set->class_names();
  if (rank0) hooks = {&reporter, &metrics};
  if (rank0 && test_set) hooks.push_back(&confusion);
  if (rank0 && o.tensorboard) hooks.push_back(&tensorboard);
  std::unique_ptr<train::Trace> timeline;
  if (rank0 && !o.trace.empty()) {
    train::TraceOptions t{.path = o.trace};
    try {
      train::parse_trace_steps(o.trace_steps, t);
    } catch (const InvalidArgument& e) {
      raise<InvalidArgument>("--trace_steps: ", e.what());
    }
    timeline = std::make_unique<train::Trace>(t);
    hooks.push_back(timeline.get());
  }
  // Watching a metric: the best checkpoint (rank 0 writes it), early stopping and the plateau
  // schedule (every rank: each steps its own optimizer, and evaluations agree across ranks).
  std::optional<train::KeepBest> best;
  std::optional<train::EarlyStopping> early;
  std::optional<train::ReduceLrOnPlateau> reduce;
  try {
    if (!o.keep_best.empty() && rank0) hooks.push_back(&best.emplace(train::Watch{.metric = o.keep_best}, fs::path(o.train_dir) / "best"));
    if (o.early_stop > 0) hooks.push_back(&early.emplace(train::Watch{.metric = o.monitor}, o.early_stop));
    if (plateau) hooks.push_back(&reduce.emplace(train::Watch{.metric = o.monitor, .min_delta = 1e-4}, *plateau));
  } catch (const InvalidArgument& e) {
    raise<InvalidArgument>("--keep_best / --early_stop / --schedule plateau: ", e.what());
  }
  std::optional<train::Lookahead> lookahead;
  if (o.lookahead > 0) hooks.push_back(&lookahead.emplace(train::LookaheadOptions{.every = o.lookahead}));
  if (recipe.hook) hooks.push_back(recipe.hook.get());
  hooks.insert(hooks.end(), extra.begin(), extra.end());

  try {
    return train::fit(*trainer, *optimizer, *train_set, test_set.get(), fopts, hooks);
  } catch (const NumericalError& e) {
    throw NumericalError(str(e.what(), " (flags: --lr, --warmup_epochs, --resume)"));
  } catch (const io::TrainDirLocked& e) {
    // The library's words, in the command line's: the directory is the flag's value.
    std::string m = e.what();
    for (auto at = m.find("another train_dir"); at != std::string::npos; at = m.find("another train_dir", at + 2))
      m.insert(at + 8, "--");
    throw io::TrainDirLocked("--" + m, e.dir, e.holder);
  } catch (const train::TrainDirInUse& e) {
    raise<InvalidArgument>("--train_dir ", o.train_dir, " holds an earlier run: ", e.found,
                           "; nothing was changed. To continue that run: --resume. To start a new one here: "
                           "--start_over move (its files go to ", o.train_dir,
                           "/earlier-<time>/) or --start_over delete. Or choose another --train_dir");
  }
}

FitResult run_evaluation(const TrainOptions& given_options, const EvalOptions& eval, ProcessOptions process,
                         Reporter& reporter, const std::set<std::string>& given) {
  fs::path model_file = train::resolve_model_file(eval.checkpoint);
  std::string model = eval.model;
  io::Metadata meta;
  if (fs::exists(model_file.parent_path() / train::kStateFile))
    meta = train::read_checkpoint_info(model_file.parent_path()).metadata;
  if (model.empty()) model = meta.count("model") ? meta["model"] : given_options.model;

  // The data the model was trained on, as the checkpoint recorded it, unless flags say otherwise.
  TrainOptions o = given_options;
  std::string data_source = "as given";
  if (auto it = meta.find("options"); it != meta.end()) {
    nlohmann::json then = nlohmann::json::parse(it->second, nullptr, false);
    std::vector<std::string> taken;
    for (const char* key : {"data_dir", "dataset", "builtin_train_size", "builtin_test_size", "image_size", "mean", "std"})
      if (!given.count(key) && then.is_object() && then.contains(key)) {
        set_train_option(o, key, then[key].is_string() ? then[key].get<std::string>() : then[key].dump());
        taken.push_back(key);
      }
    if (!taken.empty()) data_source = "as the checkpoint recorded it";
  }

  std::vector<Device> devices = choose_devices(o, process);
  auto test_set = open(o, data::Split::Test);
  tower::TrainerOptions topts = trainer_options(o);
  topts.remainder = tower::Remainder::Spread;
  const Preprocessing prep = preprocessing(o);
  tower::Trainer trainer(models::factory(model, {.num_classes = test_set->num_classes(), .seed = o.seed,
                                                 .image_height = prep.height, .image_width = prep.width}),
                         devices, topts);
  io::load_module(trainer.model(), model_file, {.destination = "the model " + model});
  trainer.broadcast_from_replica0();

  reporter.block("start", "towerflow cifar10_eval",
                 {{"checkpoint", model_file.string()},
                  {"model", model},
                  {"test data", str(test_set->describe(), " (", data_source, ")")},
                  {"towers", trainer.describe()}});
  auto t0 = Clock::now();
  int batch = tower::global_batch(o.batch_size, static_cast<int>(devices.size()), topts.split);
  tower::EvalResult r =
      train::evaluate(trainer, *test_set, batch, o.loader_threads, data::Augment{.mean = prep.mean, .std = prep.std});
  std::int64_t step = meta.count("step") ? std::stoll(meta["step"]) : 0;
  const train::EvalRecord record{.step = step, .epoch = 0, .test_loss = r.loss, .test_acc = r.accuracy,
                                 .examples = r.rows, .seconds = seconds_since(t0), .test_top5 = r.top5,
                                 .classes = r.classes, .confusion = r.confusion};
  reporter.eval(record);
  if (!eval.confusion.empty() && collectives::world().rank() == 0)
    write_confusion(eval.confusion, record, test_set->class_names());
  if (!std::isfinite(r.loss))
    raise<NumericalError>("the test loss of ", model_file.string(), " is ", r.loss, " (", r.rows,
                          " test images): the checkpoint's weights or batch-norm statistics, or the test data, "
                          "contain NaN/Inf. Check the checkpoint (one written after the training loss "
                          "diverged holds NaN), evaluate an earlier ckpt-<step>, or train again with a lower "
                          "--lr or a longer --warmup_epochs");
  FitResult result;
  result.steps = step;
  result.test_loss = r.loss;
  result.test_acc = r.accuracy;
  result.test_top5 = r.top5;
  result.test_examples = r.rows;
  result.last_checkpoint = model_file;
  return result;
}

}  // namespace towerflow::cifar10
