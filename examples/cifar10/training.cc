#include "examples/cifar10/training.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/platform/logical.h"
#include "core/platform/platform.h"
#include "core/platform/registry.h"
#include "data/data.h"
#include "examples/cifar10/checkpoint.h"
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io/model_state.h"
#include "models/models.h"
#include "optim/optim.h"
#include "tower/tower.h"

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

std::unique_ptr<data::Dataset> open(const TrainOptions& o, data::Split split) {
  data::DatasetOptions dopts;
  dopts.folder.height = 32;
  dopts.folder.width = 32;
  dopts.builtin.train_size = o.builtin_train_size;
  dopts.builtin.test_size = o.builtin_test_size;
  return data::open_dataset(dataset_kind(o), o.data_dir, split, dopts);
}

optim::LrSchedule make_schedule(const TrainOptions& o, std::int64_t total_steps, std::int64_t steps_per_epoch) {
  std::string spec = o.schedule;
  auto warmup = static_cast<std::int64_t>(std::llround(o.warmup_epochs * static_cast<double>(steps_per_epoch)));
  if (warmup > 0) spec = str("warmup:", warmup, ",", spec);
  return optim::parse_schedule(spec, o.lr, total_steps);
}

// "random crops of the image padded by 4, horizontal flips, cutout 12x12", or "none".
std::string describe(const data::Augment& a) {
  std::vector<std::string> parts;
  if (a.crop_padding > 0) parts.push_back(str("random crops of the image padded by ", a.crop_padding));
  if (a.flip) parts.push_back("horizontal flips");
  if (a.cutout > 0) parts.push_back(str("cutout ", a.cutout, "x", a.cutout));
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out.empty() ? "none" : out;
}

tower::TrainerOptions trainer_options(const TrainOptions& o) {
  tower::TrainerOptions t;
  t.reduction = tower::parse_reduction(o.reduction);
  t.split = tower::parse_split(o.split);
  t.batch_norm = o.batch_norm == "sync" ? tower::BatchNormMode::Synchronised : tower::BatchNormMode::PerTower;
  t.label_smoothing = static_cast<float>(o.label_smoothing);
  if (o.split_remainder == "spread") t.remainder = tower::Remainder::Spread;
  else if (o.split_remainder != "error")
    raise<InvalidArgument>("--split_remainder \"", o.split_remainder, "\" is not known; use error or spread");
  return t;
}

// Evaluates on every row of a dataset (no augmentation, the final partial batch kept).
tower::EvalResult evaluate(tower::Trainer& trainer, const data::Dataset& test, int batch, int threads) {
  data::Loader loader(test, {.batch = batch, .shuffle = false, .drop_last = false, .threads = threads});
  double loss_sum = 0;
  tower::EvalResult total;
  for (const data::Batch& b : loader) {
    tower::EvalResult r = trainer.evaluate(b);
    loss_sum += r.loss * static_cast<double>(r.rows);
    total.correct += r.correct;
    total.rows += r.rows;
  }
  if (total.rows > 0) {
    total.loss = loss_sum / static_cast<double>(total.rows);
    total.accuracy = static_cast<double>(total.correct) / static_cast<double>(total.rows);
  }
  return total;
}

// A fresh run must not mix with an earlier one's files: checkpoints of another run would be
// resumed later, and metrics.jsonl would interleave two runs.
int clear_train_dir(io::CheckpointDir& dir) {
  int removed = dir.prune(0) + dir.remove_stale();
  int n = 0;
  for (const auto& c : dir.list()) {
    fs::remove_all(c.path);
    ++n;
  }
  std::error_code ec;
  if (fs::remove(dir.path() / "metrics.jsonl", ec)) ++removed;
  return removed + n;
}

// Adds what helps with out-of-memory to the allocator's message.
[[noreturn]] void raise_out_of_memory(const OutOfMemory& e, const std::vector<Device>& devices, const TrainOptions& o) {
  std::ostringstream os;
  os << e.what() << "\nallocators:";
  for (const auto& d : devices) {
    auto s = device_allocator(d).stats();
    os << "\n  " << d.str() << ": in use " << format_byte_size(s.bytes_in_use) << ", peak "
       << format_byte_size(s.peak_bytes_in_use) << ", limit " << format_byte_size(s.bytes_limit) << ", pool "
       << format_byte_size(s.pool_bytes) << ", largest free block " << format_byte_size(s.largest_free_block);
  }
  bool any_gpu = std::any_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_gpu(); });
  const Device& first = devices.front();
  os << "\nto fit: a smaller batch (--batch_size " << std::max(1, o.batch_size / 2) << ", now " << o.batch_size << ")";
  if (any_gpu)
    os << ", pools that grow on demand (--allow_growth), a larger share of GPU memory "
          "(--per_process_gpu_memory_fraction 0.95)";
  os << ", or a larger per-device limit (--memory_limit " << (first.is_gpu() ? "gpu:" : "cpu:") << first.index
     << "=<MiB>)";
  throw OutOfMemory(os.str());
}

void warn_on_changed_options(const io::Metadata& meta, const TrainOptions& now) {
  auto it = meta.find("options");
  if (it == meta.end()) return;
  nlohmann::json then = nlohmann::json::parse(it->second, nullptr, false);
  if (then.is_discarded()) return;
  nlohmann::json cur = nlohmann::json::parse(to_json(now));
  for (const char* key : {"model", "batch_size", "seed", "epochs", "max_steps", "lr", "schedule", "optimizer",
                          "momentum", "weight_decay", "warmup_epochs", "split", "batch_norm", "dataset", "data_dir",
                          "cutout", "label_smoothing"}) {
    if (then.contains(key) && then[key] != cur[key])
      log_warning(str("--resume: ", key, " was ", then[key].dump(), " in the interrupted run and is ", cur[key].dump(),
                      " now; the run continues with the new value and will not reproduce the uninterrupted one"));
  }
}

// A resumed run repeats the steps after its checkpoint: drop the interrupted run's records of
// them (and a line cut short by the kill) so metrics.jsonl reads as one uninterrupted run.
void truncate_metrics(const fs::path& path, std::int64_t step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::istringstream in(io::read_file(path));
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    if (j["step"].get<std::int64_t>() <= step) kept += line + "\n";
  }
  io::write_file_atomically(path, kept);
}

std::string memory_summary(const std::vector<Device>& devices) {
  std::string out;
  for (const auto& d : devices) {
    auto s = device_allocator(d).stats();
    out += (out.empty() ? "" : ", ") + d.str() + " " + format_byte_size(s.peak_bytes_in_use);
  }
  return out;
}

}  // namespace

std::vector<Device> choose_devices(const TrainOptions& o, ProcessOptions& process) {
  bool explicit_list = !o.devices.empty() && o.devices != "all";
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
        listed.push_back(Device::parse(n));
      } catch (const InvalidArgument& e) {
        raise<InvalidArgument>("--devices: ", e.what());
      }
    }
    if (listed.empty()) raise<InvalidArgument>("--devices \"", o.devices, "\" names no device; write e.g. /cpu:0,/cpu:1 or all");
    // Naming /cpu:3 asks for four logical CPU devices unless the options already say how many.
    int max_cpu = -1;
    for (const auto& d : listed)
      if (d.is_cpu()) max_cpu = std::max(max_cpu, d.index);
    if (max_cpu >= 1 && !cpu_configured) process.device_count["CPU"] = max_cpu + 1;
  } else if (!has_gpu && !cpu_configured && o.num_gpus <= 0) {
    // Note [Two CPU towers by default]: on a machine without a GPU, "every visible device" would
    // be one CPU device and no towers at all; two logical CPU devices, each with half of the
    // host's threads, run the same multi-tower path a multi-GPU machine runs.
    process.device_count["CPU"] = 2;
  }

  const auto& all = initialise_devices(process);
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

RunResult run_training(const TrainOptions& o, ProcessOptions process, Reporter& reporter, const RunHooks& hooks) {
  auto run_start = Clock::now();
  std::vector<Device> devices = choose_devices(o, process);

  auto train_set = open(o, data::Split::Train);
  auto test_set = open(o, data::Split::Test);
  tower::TrainerOptions topts = trainer_options(o);
  int batch = tower::global_batch(o.batch_size, static_cast<int>(devices.size()), topts.split);
  // The built-in set already varies position, scale and colour, so it gets no crop or flip;
  // cutout, when asked for, applies to every dataset.
  data::Augment augment = dataset_kind(o) == data::DatasetKind::Builtin ? data::eval_transform() : data::cifar_augment();
  augment.cutout = o.cutout;
  if (const data::ImageShape shape = train_set->shape(); o.cutout > std::max(shape.h, shape.w))
    raise<InvalidArgument>("--cutout ", o.cutout, " is larger than the ", shape.h, "x", shape.w,
                           " training images; use 0 (none) .. ", std::max(shape.h, shape.w), " (16 is usual for CIFAR-10)");
  data::Loader loader(*train_set, {.batch = batch, .augment = augment, .seed = o.seed, .threads = o.loader_threads});
  const std::int64_t steps_per_epoch = loader.steps_per_epoch();
  if (steps_per_epoch == 0)
    raise<InvalidArgument>("--batch_size ", batch, " is larger than the training set (", train_set->size(),
                           " images); use a batch of at most ", train_set->size());
  const std::int64_t total_steps = o.max_steps > 0 ? o.max_steps : o.epochs * steps_per_epoch;
  const int total_epochs = static_cast<int>((total_steps + steps_per_epoch - 1) / steps_per_epoch);

  try {
    models::ModelOptions mopts{.num_classes = train_set->num_classes(), .seed = o.seed};
    tower::Trainer trainer(models::factory(o.model, mopts), devices, topts);
    auto optimizer = optim::make_optimizer(
        trainer.parameters(), {.name = o.optimizer, .lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
    optimizer->set_schedule(make_schedule(o, total_steps, steps_per_epoch));

    io::CheckpointDir ckpt_dir(o.train_dir);
    TrainingPosition pos;
    std::string resumed_from = "no (a new run)";
    if (o.resume) {
      ckpt_dir.remove_stale();
      if (auto latest = ckpt_dir.latest()) {
        CheckpointInfo info = load_checkpoint(latest->path, trainer.model(), *optimizer);
        trainer.broadcast_from_replica0();
        pos = info.position;
        warn_on_changed_options(info.metadata, o);
        resumed_from = str(latest->path.string(), " (step ", pos.step, ")");
        truncate_metrics(fs::path(o.train_dir) / "metrics.jsonl", pos.step);
      } else {
        log_warning(str("--resume: no checkpoint in ", o.train_dir, "; starting a new run"));
      }
    } else if (int removed = clear_train_dir(ckpt_dir); removed > 0) {
      log_info(str("a new run in ", o.train_dir, ": removed ", removed,
                   " checkpoint(s)/metrics of an earlier run there (--resume continues a run)"));
    }

    reporter.open_metrics(fs::path(o.train_dir) / "metrics.jsonl");
    io::Metadata ckpt_meta{{"model", o.model},
                           {"num_classes", std::to_string(train_set->num_classes())},
                           {"seed", std::to_string(o.seed)},
                           {"devices", join(devices)},
                           {"options", to_json(o)},
                           {"producer", "towerflow cifar10_train"}};

    // ---- start-up block -----------------------------------------------------------------------
    Reporter::Fields fields{
        {"model", str(o.model, " (", trainer.model().num_parameters(), " parameters, ", train_set->num_classes(), " classes)")},
        {"train data", train_set->describe()},
        {"test data", test_set->describe()},
        {"augmentation", describe(augment)},
        {"towers", trainer.describe()}};
    for (const auto& d : devices) fields.emplace_back("device " + d.str(), device_info(d).description);
    fields.emplace_back("device options", to_string(process_options()));
    std::vector<int> rows = tower::split_batch(batch, devices, topts.split, topts.remainder);
    std::string per_tower;
    for (int r : rows) per_tower += (per_tower.empty() ? "" : " + ") + std::to_string(r);
    fields.emplace_back("batch", str(batch, " global (", per_tower, " per tower)"));
    const std::string warmup =
        o.warmup_epochs > 0 ? str(" after ", o.warmup_epochs, o.warmup_epochs == 1 ? " warm-up epoch" : " warm-up epochs")
                            : "";
    fields.emplace_back("optimizer", str(optimizer->name(), ", lr ", o.lr, ", momentum ", o.momentum, ", weight decay ",
                                         o.weight_decay, ", schedule ", o.schedule, warmup));
    if (o.label_smoothing > 0) fields.emplace_back("loss", str("cross-entropy with label smoothing ", o.label_smoothing));
    fields.emplace_back("length", str(total_steps, " steps (", total_epochs, total_epochs == 1 ? " epoch" : " epochs",
                                      " of ", steps_per_epoch, " steps)"));
    const std::string when = o.save_every > 0 ? str("every ", o.save_every, " steps and at the end") : "at the end only";
    const std::string kept = o.keep_checkpoints > 0 ? str("newest ", o.keep_checkpoints, " kept") : "all kept";
    fields.emplace_back("checkpoints", str(o.train_dir, ", ", when, ", ", kept));
    fields.emplace_back("resumed", resumed_from);
    reporter.block("start", "towerflow cifar10_train", fields);

    // ---- the loop -----------------------------------------------------------------------------
    RunResult result;
    auto save = [&](const TrainingPosition& p) {
      trainer.sync();
      result.last_checkpoint = save_checkpoint(ckpt_dir, trainer.model(), *optimizer, p, ckpt_meta, o.keep_checkpoints);
    };
    double window_loss = 0, window_acc = 0, window_seconds = 0;
    std::int64_t window_steps = 0, window_images = 0;
    double train_seconds = 0;
    std::int64_t train_images = 0;
    TimeLeft time_left;
    tower::EvalResult last_eval;
    bool evaluated_at_end = false;
    std::int64_t step = pos.step;

    for (std::int64_t epoch = pos.epoch; step < total_steps; ++epoch) {
      loader.set_epoch(epoch, epoch == pos.epoch ? pos.step_in_epoch : 0);
      auto t0 = Clock::now();
      std::int64_t last_index = -1;
      for (const data::Batch& b : loader) {
        last_index = b.index_in_epoch;
        float loss = trainer.forward_backward(b);
        if (!std::isfinite(loss)) {
          reporter.epoch_end();
          auto latest = ckpt_dir.latest();
          raise<NumericalError>(
              "the loss is ", loss, " at step ", step + 1, " (epoch ", epoch + 1, "); training stopped without applying that step. ",
              latest ? str("The last good checkpoint is ", latest->path.string(), " (step ", latest->step, "); ")
                     : std::string("No checkpoint was written yet; "),
              "lower the learning rate (--lr ", o.lr, " now), add --warmup_epochs, or check the data, then ",
              latest ? "continue with --resume" : "start again");
        }
        optimizer->step();
        ++step;
        const auto& m = trainer.last_step();
        window_loss += loss;
        window_acc += m.accuracy;
        window_images += m.rows;
        ++window_steps;
        if (hooks.abort_after_step && hooks.abort_after_step(step)) {
          reporter.epoch_end();
          result.steps = step;
          result.aborted = true;
          return result;
        }
        const bool last = step >= total_steps;
        if (step % o.log_every == 0 || last || b.index_in_epoch + 1 == steps_per_epoch) {
          double dt = seconds_since(t0);
          window_seconds += dt;
          train_seconds += dt;
          train_images += window_images;
          double img_per_s = window_seconds > 0 ? static_cast<double>(window_images) / window_seconds : 0;
          time_left.add_steps(window_steps, window_seconds);
          reporter.train({.step = step,
                          .total_steps = total_steps,
                          .epoch = static_cast<double>(epoch) + static_cast<double>(b.index_in_epoch + 1) / steps_per_epoch,
                          .epochs = total_epochs,
                          .loss = window_loss / window_steps,
                          .acc = window_acc / window_steps,
                          .lr = optimizer->lr(),
                          .img_per_s = img_per_s,
                          .eta_s = time_left.seconds(total_steps - step,
                                                     evals_left(step / steps_per_epoch, total_epochs, o.eval_every))});
          window_loss = window_acc = window_seconds = 0;
          window_steps = window_images = 0;
          t0 = Clock::now();
        }
        TrainingPosition here{step, epoch, b.index_in_epoch + 1};
        if (here.step_in_epoch == steps_per_epoch) here = {step, epoch + 1, 0};
        if (o.save_every > 0 && step % o.save_every == 0 && !last) {
          auto ts = Clock::now();
          save(here);
          t0 += Clock::now() - ts;  // checkpoint time is not training throughput
        }
        if (last) {
          loader.stop();
          break;
        }
      }
      reporter.epoch_end();
      const bool at_end = step >= total_steps;
      const bool epoch_done = last_index + 1 == steps_per_epoch;
      if (at_end || (o.eval_every > 0 && epoch_done && (epoch + 1) % o.eval_every == 0)) {
        auto te = Clock::now();
        last_eval = evaluate(trainer, *test_set, batch, o.loader_threads);
        const double eval_seconds = seconds_since(te);
        time_left.add_eval(eval_seconds);
        reporter.eval({.step = step,
                       .epoch = static_cast<double>(step) / static_cast<double>(steps_per_epoch),
                       .test_loss = last_eval.loss,
                       .test_acc = last_eval.accuracy,
                       .examples = last_eval.rows,
                       .seconds = eval_seconds});
        evaluated_at_end = at_end;
      }
    }
    if (!evaluated_at_end) {  // a resumed run that had nothing left to do
      last_eval = evaluate(trainer, *test_set, batch, o.loader_threads);
      reporter.eval({.step = step, .epoch = static_cast<double>(step) / steps_per_epoch, .test_loss = last_eval.loss,
                     .test_acc = last_eval.accuracy, .examples = last_eval.rows});
    }
    auto latest = ckpt_dir.latest();
    if (!latest || latest->step != step) save({step, step / steps_per_epoch, step % steps_per_epoch});
    else result.last_checkpoint = latest->path;

    result.steps = step;
    result.test_loss = last_eval.loss;
    result.test_acc = last_eval.accuracy;
    result.train_img_per_s = train_seconds > 0 ? static_cast<double>(train_images) / train_seconds : 0;

    // ---- summary ------------------------------------------------------------------------------
    double wall = seconds_since(run_start);
    nlohmann::ordered_json j;
    j["test_acc"] = result.test_acc;
    j["test_loss"] = result.test_loss;
    j["steps"] = result.steps;
    j["img_per_s"] = std::round(result.train_img_per_s * 10) / 10;
    j["wall_s"] = std::round(wall * 10) / 10;
    j["checkpoint"] = result.last_checkpoint.string();
    nlohmann::ordered_json peaks;
    for (const auto& d : devices) peaks[d.str()] = device_allocator(d).stats().peak_bytes_in_use;
    j["peak_bytes"] = peaks;
    reporter.summary({{"test accuracy", str(std::round(result.test_acc * 10000) / 100, "% top-1 (", last_eval.rows, " images)")},
                      {"test loss", str(result.test_loss)},
                      {"throughput", str(std::lround(result.train_img_per_s), " images/s (training steps only)")},
                      {"steps", str(result.steps, " in ", format_duration(wall), " wall-clock")},
                      {"peak memory", memory_summary(devices)},
                      {"checkpoint", result.last_checkpoint.string()}},
                     j.dump());
    return result;
  } catch (const OutOfMemory& e) {
    raise_out_of_memory(e, devices, o);
  }
}

RunResult run_evaluation(const TrainOptions& o, const EvalOptions& eval, ProcessOptions process, Reporter& reporter) {
  fs::path model_file = resolve_model_file(eval.checkpoint);
  std::string model = eval.model;
  io::Metadata meta;
  if (fs::exists(model_file.parent_path() / kStateFile)) meta = read_checkpoint_info(model_file.parent_path()).metadata;
  if (model.empty()) model = meta.count("model") ? meta["model"] : o.model;

  std::vector<Device> devices = choose_devices(o, process);
  auto test_set = open(o, data::Split::Test);
  tower::TrainerOptions topts = trainer_options(o);
  topts.remainder = tower::Remainder::Spread;
  tower::Trainer trainer(models::factory(model, {.num_classes = test_set->num_classes(), .seed = o.seed}), devices, topts);
  io::load_module(trainer.model(), model_file, {.destination = "the model " + model});
  trainer.broadcast_from_replica0();

  reporter.block("start", "towerflow cifar10_eval",
                 {{"checkpoint", model_file.string()},
                  {"model", model},
                  {"test data", test_set->describe()},
                  {"towers", trainer.describe()}});
  auto t0 = Clock::now();
  int batch = tower::global_batch(o.batch_size, static_cast<int>(devices.size()), topts.split);
  tower::EvalResult r = evaluate(trainer, *test_set, batch, o.loader_threads);
  std::int64_t step = meta.count("step") ? std::stoll(meta["step"]) : 0;
  reporter.eval({.step = step, .epoch = 0, .test_loss = r.loss, .test_acc = r.accuracy, .examples = r.rows,
                 .seconds = seconds_since(t0)});
  RunResult result;
  result.steps = step;
  result.test_loss = r.loss;
  result.test_acc = r.accuracy;
  result.last_checkpoint = model_file;
  return result;
}

}  // namespace towerflow::cifar10
