#include "train/fit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/platform/registry.h"
#include "data/data.h"
#include "io/checkpoint_dir.h"
#include "optim/optimizer.h"
#include "tower/trainer.h"
#include "train/reporter.h"

namespace towerflow::train {
namespace fs = std::filesystem;

struct StopRequest {
  bool requested = false;
  std::string reason;
};

void Hook::stop_training(std::string reason) {
  if (stop_ && !stop_->requested) {
    stop_->requested = true;
    stop_->reason = std::move(reason);
  }
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A new run must not mix with an earlier one's checkpoints: they would be resumed later.
int clear_checkpoints(io::CheckpointDir& dir) {
  int removed = dir.remove_stale();
  for (const auto& c : dir.list()) {
    fs::remove_all(c.path);
    ++removed;
  }
  return removed;
}

}  // namespace

ScheduleFactory schedule(std::string spec, double lr, double warmup_epochs) {
  return [spec = std::move(spec), lr, warmup_epochs](const Plan& p) {
    std::string s = spec;
    auto warmup = static_cast<std::int64_t>(std::llround(warmup_epochs * static_cast<double>(p.steps_per_epoch)));
    if (warmup > 0) s = str("warmup:", warmup, ",", s);
    return optim::parse_schedule(s, lr, p.total_steps);
  };
}

Plan plan(const data::Dataset& train_set, const FitOptions& o) {
  if (o.batch < 1) raise<InvalidArgument>("batch ", o.batch, " must be at least 1");
  if (o.epochs < 1 && o.max_steps <= 0)
    raise<InvalidArgument>("epochs ", o.epochs, " must be at least 1 (or set max_steps)");
  Plan p;
  p.steps_per_epoch = train_set.size() / o.batch;
  if (p.steps_per_epoch == 0)
    raise<InvalidArgument>("batch ", o.batch, " is larger than the training set (", train_set.size(),
                           " images); use a batch of at most ", train_set.size());
  p.total_steps = o.max_steps > 0 ? o.max_steps : o.epochs * p.steps_per_epoch;
  p.epochs = static_cast<int>((p.total_steps + p.steps_per_epoch - 1) / p.steps_per_epoch);
  return p;
}

tower::EvalResult evaluate(tower::Trainer& trainer, const data::Dataset& set, int batch, int loader_threads) {
  data::Loader loader(set, {.batch = batch, .shuffle = false, .drop_last = false, .threads = loader_threads});
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

std::string allocator_report(const std::vector<Device>& devices) {
  std::ostringstream os;
  for (const auto& d : devices) {
    auto s = device_allocator(d).stats();
    os << (os.tellp() > 0 ? "\n" : "") << "  " << d.str() << ": in use " << format_byte_size(s.bytes_in_use)
       << ", peak " << format_byte_size(s.peak_bytes_in_use) << ", limit " << format_byte_size(s.bytes_limit)
       << ", pool " << format_byte_size(s.pool_bytes) << ", largest free block "
       << format_byte_size(s.largest_free_block);
  }
  return os.str();
}

// The loop's state, and the hooks' way to stop it (Hook is a friend of Loop).
class Loop {
 public:
  Loop(tower::Trainer& trainer, optim::Optimizer& optimizer, const data::Dataset& train_set,
       const data::Dataset* test_set, const FitOptions& options, const std::vector<Hook*>& hooks)
      : trainer_(trainer), optimizer_(optimizer), train_set_(train_set), test_set_(test_set), o_(options),
        hooks_(hooks) {
    for (Hook* h : hooks_) h->stop_ = &stop_;
  }
  ~Loop() {
    for (Hook* h : hooks_) h->stop_ = nullptr;
  }

  FitResult run();

 private:
  template <typename F>
  void each(F&& f) {
    for (Hook* h : hooks_) f(*h);
  }
  void save(const TrainingPosition& p);
  void evaluate_now(std::int64_t step);

  tower::Trainer& trainer_;
  optim::Optimizer& optimizer_;
  const data::Dataset& train_set_;
  const data::Dataset* test_set_;
  const FitOptions& o_;
  const std::vector<Hook*>& hooks_;
  StopRequest stop_;
  Plan plan_;
  std::optional<io::CheckpointDir> dir_;
  io::Metadata metadata_;
  FitResult result_;
  TimeLeft time_left_;
  std::int64_t evaluated_at_ = -1;  // the step of the last evaluation
};

void Loop::save(const TrainingPosition& p) {
  if (!dir_) return;
  auto t0 = Clock::now();
  trainer_.sync();
  result_.last_checkpoint = save_checkpoint(*dir_, trainer_.model(), optimizer_, p, metadata_, o_.keep_checkpoints);
  CheckpointRecord r{.path = result_.last_checkpoint, .position = p, .seconds = seconds_since(t0)};
  each([&](Hook& h) { h.on_checkpoint(r); });
}

void Loop::evaluate_now(std::int64_t step) {
  if (!test_set_) return;
  auto t0 = Clock::now();
  tower::EvalResult e = evaluate(trainer_, *test_set_, o_.eval_batch > 0 ? o_.eval_batch : o_.batch, o_.loader_threads);
  const double seconds = seconds_since(t0);
  time_left_.add_eval(seconds);
  result_.test_loss = e.loss;
  result_.test_acc = e.accuracy;
  result_.test_examples = e.rows;
  evaluated_at_ = step;
  EvalRecord r{.step = step,
               .epoch = static_cast<double>(step) / static_cast<double>(plan_.steps_per_epoch),
               .test_loss = e.loss,
               .test_acc = e.accuracy,
               .examples = e.rows,
               .seconds = seconds};
  each([&](Hook& h) { h.on_eval(r); });
}

FitResult Loop::run() {
  const auto run_start = Clock::now();
  plan_ = plan(train_set_, o_);
  if (o_.schedule) optimizer_.set_schedule(o_.schedule(plan_));
  data::Loader loader(train_set_, {.batch = o_.batch, .augment = o_.augment, .seed = o_.seed, .threads = o_.loader_threads});

  // ---- where the run starts -----------------------------------------------------------------
  TrainingPosition pos;
  std::optional<CheckpointInfo> resumed;
  fs::path resumed_from;
  int removed = 0;
  if (!o_.train_dir.empty()) {
    dir_.emplace(o_.train_dir);
    if (o_.resume) {
      dir_->remove_stale();
      if (auto latest = dir_->latest()) {
        resumed = load_checkpoint(latest->path, trainer_.model(), optimizer_);
        trainer_.broadcast_from_replica0();
        pos = resumed->position;
        resumed_from = latest->path;
      } else {
        log_warning(str("resume: no checkpoint in ", o_.train_dir.string(), "; starting a new run"));
      }
    } else if ((removed = clear_checkpoints(*dir_)) > 0) {
      log_info(str("a new run in ", o_.train_dir.string(), ": removed ", removed,
                   " checkpoint(s) of an earlier run there (resume continues a run)"));
    }
  } else if (o_.resume) {
    raise<InvalidArgument>("resume needs a train_dir to resume from");
  }
  metadata_ = o_.metadata;
  metadata_["seed"] = std::to_string(o_.seed);
  std::string devices;
  for (const auto& d : trainer_.devices()) devices += (devices.empty() ? "" : ", ") + d.str();
  metadata_["devices"] = devices;

  StartInfo start{.trainer = trainer_,
                  .optimizer = optimizer_,
                  .train_set = train_set_,
                  .test_set = test_set_,
                  .options = o_,
                  .plan = plan_,
                  .position = pos,
                  .resumed = resumed,
                  .resumed_from = resumed_from,
                  .removed_files = removed};
  each([&](Hook& h) { h.on_start(start); });

  // ---- the loop -----------------------------------------------------------------------------
  const std::int64_t spe = plan_.steps_per_epoch;
  double window_loss = 0, window_acc = 0, window_seconds = 0;
  std::int64_t window_steps = 0, window_images = 0;
  double train_seconds = 0;
  std::int64_t train_images = 0;
  std::int64_t step = pos.step;

  for (std::int64_t epoch = pos.epoch; step < plan_.total_steps && !stop_.requested; ++epoch) {
    loader.set_epoch(epoch, epoch == pos.epoch ? pos.step_in_epoch : 0);
    auto t0 = Clock::now();
    std::int64_t last_index = -1;
    for (const data::Batch& b : loader) {
      last_index = b.index_in_epoch;
      float loss = trainer_.forward_backward(b);
      if (!std::isfinite(loss)) {
        each([&](Hook& h) { h.on_epoch_end(epoch); });
        auto latest = dir_ ? dir_->latest() : std::nullopt;
        raise<NumericalError>(
            "the loss is ", loss, " at step ", step + 1, " (epoch ", epoch + 1,
            "); training stopped without applying that step. ",
            latest ? str("The last good checkpoint is ", latest->path.string(), " (step ", latest->step, "); ")
                   : std::string("No checkpoint was written yet; "),
            "lower the learning rate (", optimizer_.lr(), " now), warm it up, or check the data, then ",
            latest ? "resume from that checkpoint" : "start again");
      }
      optimizer_.step();
      ++step;
      const auto& m = trainer_.last_step();
      StepInfo si{.step = step,
                  .epoch = epoch,
                  .index_in_epoch = b.index_in_epoch,
                  .loss = loss,
                  .accuracy = m.accuracy,
                  .rows = m.rows,
                  .lr = optimizer_.lr()};
      window_loss += loss;
      window_acc += m.accuracy;
      window_images += m.rows;
      ++window_steps;
      each([&](Hook& h) { h.on_step(si); });

      const bool last = step >= plan_.total_steps || stop_.requested;
      if (step % o_.log_every == 0 || last || b.index_in_epoch + 1 == spe) {
        double dt = seconds_since(t0);
        window_seconds += dt;
        train_seconds += dt;
        train_images += window_images;
        time_left_.add_steps(window_steps, window_seconds);
        TrainRecord r{.step = step,
                      .total_steps = plan_.total_steps,
                      .epoch = static_cast<double>(epoch) + static_cast<double>(b.index_in_epoch + 1) / spe,
                      .epochs = plan_.epochs,
                      .loss = window_loss / window_steps,
                      .acc = window_acc / window_steps,
                      .lr = optimizer_.lr(),
                      .img_per_s = window_seconds > 0 ? static_cast<double>(window_images) / window_seconds : 0,
                      .eta_s = time_left_.seconds(plan_.total_steps - step,
                                                  test_set_ ? evals_left(step / spe, plan_.epochs, o_.eval_every) : 0)};
        each([&](Hook& h) { h.on_log(r); });
        window_loss = window_acc = window_seconds = 0;
        window_steps = window_images = 0;
        t0 = Clock::now();
      }
      TrainingPosition here{step, epoch, b.index_in_epoch + 1};
      if (here.step_in_epoch == spe) here = {step, epoch + 1, 0};
      if (o_.save_every > 0 && step % o_.save_every == 0 && !last) {
        auto ts = Clock::now();
        save(here);
        t0 += Clock::now() - ts;  // checkpoint time is not training throughput
      }
      if (last) {
        loader.stop();
        break;
      }
    }
    each([&](Hook& h) { h.on_epoch_end(epoch); });
    const bool at_end = step >= plan_.total_steps || stop_.requested;
    const bool epoch_done = last_index + 1 == spe;
    if (at_end || (o_.eval_every > 0 && epoch_done && (epoch + 1) % o_.eval_every == 0)) evaluate_now(step);
  }
  // A resumed run that had nothing left to do, or one stopped by a hook during an evaluation.
  if (evaluated_at_ != step) evaluate_now(step);

  if (dir_) {
    auto latest = dir_->latest();
    if (!latest || latest->step != step) save({step, step / spe, step % spe});
    else result_.last_checkpoint = latest->path;
  }
  result_.steps = step;
  result_.train_img_per_s = train_seconds > 0 ? static_cast<double>(train_images) / train_seconds : 0;
  result_.stopped_early = stop_.requested;
  result_.stop_reason = stop_.reason;
  result_.wall_seconds = seconds_since(run_start);
  each([&](Hook& h) { h.on_end(result_); });
  return result_;
}

FitResult fit(tower::Trainer& trainer, optim::Optimizer& optimizer, const data::Dataset& train_set,
              const data::Dataset* test_set, const FitOptions& options, const std::vector<Hook*>& hooks) {
  try {
    Loop loop(trainer, optimizer, train_set, test_set, options, hooks);
    return loop.run();
  } catch (const OutOfMemory& e) {
    const auto& devices = trainer.devices();
    bool any_gpu = std::any_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_gpu(); });
    throw OutOfMemory(str(e.what(), "\nallocators:\n", allocator_report(devices), "\nto fit: a smaller global batch (",
                          std::max(1, options.batch / 2), ", now ", options.batch, ")",
                          any_gpu ? ", GPU pools that grow on demand (allow_growth), a larger share of GPU memory" : "",
                          ", or a larger memory limit for ", devices.front().str()));
  }
}

}  // namespace towerflow::train
