#include "train/fit.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/collectives/context.h"
#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "core/version.h"
#include "core/platform/registry.h"
#include "data/data.h"
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io/train_dir_lock.h"
#include "optim/optimizer.h"
#include "tower/trainer.h"
#include "train/step_window.h"

namespace towerflow::train {
namespace fs = std::filesystem;

struct StopRequest {
  bool requested = false;
  bool evaluate = true;
  std::string reason;
};

void Hook::stop_training(std::string reason, bool evaluate) {
  if (stop_ && !stop_->requested) {
    stop_->requested = true;
    stop_->evaluate = evaluate;
    stop_->reason = std::move(reason);
  }
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string utc_text(std::time_t t, const char* format) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::time_t mtime_of(const fs::path& p) {
  std::error_code ec;
  auto ft = fs::last_write_time(p, ec);
  if (ec) return 0;
  return std::chrono::system_clock::to_time_t(std::chrono::file_clock::to_sys(ft));
}

// A fresh identity for a new run: its start time and 32 random bits.
std::string new_run_id() {
  std::random_device rd;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%08x", static_cast<unsigned>(rd()));
  return utc_text(std::time(nullptr), "%Y%m%dT%H%M%SZ-") + suffix;
}

// What an earlier run left in a train_dir: its checkpoints and the hooks' files.
struct EarlierRun {
  std::vector<io::CheckpointInfo> checkpoints;
  std::vector<fs::path> files;
  bool empty() const { return checkpoints.empty() && files.empty(); }
  std::string describe() const {
    std::string out;
    if (!checkpoints.empty()) {
      const auto& latest = checkpoints.back();
      out = str(checkpoints.size(), checkpoints.size() == 1 ? " checkpoint" : " checkpoints", " (the latest ",
                latest.path.filename().string(), ", step ", latest.step, ", written ",
                utc_text(mtime_of(latest.path / kStateFile), "%Y-%m-%d %H:%M UTC"), ")");
    }
    for (const auto& f : files) out += (out.empty() ? "" : " and ") + f.filename().string();
    return out;
  }
};

EarlierRun earlier_run(const io::CheckpointDir& dir, const std::vector<Hook*>& hooks) {
  EarlierRun e;
  e.checkpoints = dir.list();
  for (const Hook* h : hooks)
    for (const auto& f : h->files()) {
      std::error_code ec;
      const bool there = fs::is_directory(f, ec) ? !fs::is_empty(f, ec) : fs::is_regular_file(f, ec) && fs::file_size(f, ec) > 0;
      if (there) e.files.push_back(f);
    }
  return e;
}


// The loader's next batch; the wait for it is a span of the trace.
const data::Batch* wait_for_batch(data::Loader& loader) {
  const trace::Span span("data", "wait for batch");
  return loader.next();
}

}  // namespace

ScheduleFactory schedule(std::string spec, double lr, double warmup_epochs) {
  return [spec = std::move(spec), lr, warmup_epochs](const Plan& p) {
    std::string s = spec;
    auto warmup = static_cast<std::int64_t>(std::llround(warmup_epochs * static_cast<double>(p.steps_per_epoch)));
    if (warmup >= p.total_steps)
      raise<InvalidArgument>("a warm-up of ", warmup_epochs, " epochs (", warmup, " steps) is not shorter than the run (",
                             p.total_steps, " steps of ", p.steps_per_epoch, " per epoch): the learning rate would never reach ", lr,
                             "; shorten the warm-up (schedule()'s warmup_epochs) or lengthen the run (FitOptions::epochs, "
                             "or FitOptions::max_steps)");
    if (warmup > 0) s = str("warmup:", warmup, ",", s);
    return optim::parse_schedule(s, lr, p.total_steps);
  };
}

Plan plan(const data::Dataset& train_set, const FitOptions& o) {
  if (o.batch < 1) raise<InvalidArgument>("FitOptions::batch = ", o.batch, " is invalid; a batch has at least 1 row");
  if (o.epochs < 1 && o.max_steps <= 0)
    raise<InvalidArgument>("FitOptions::epochs = ", o.epochs, " is invalid; use 1 or more (or set FitOptions::max_steps)");
  Plan p;
  p.steps_per_epoch = train_set.size() / o.batch;
  if (p.steps_per_epoch == 0)
    raise<InvalidArgument>("FitOptions::batch = ", o.batch, " is larger than the training set (", train_set.size(),
                           " images); use FitOptions::batch = ", train_set.size(), " or less");
  p.total_steps = o.max_steps > 0 ? o.max_steps : o.epochs * p.steps_per_epoch;
  p.epochs = static_cast<int>((p.total_steps + p.steps_per_epoch - 1) / p.steps_per_epoch);
  return p;
}

tower::EvalResult evaluate(tower::Trainer& trainer, const data::Dataset& set, int batch, int loader_threads,
                           const data::Augment& transform, const std::vector<data::TestView>& views) {
  // Each process evaluates an even slice of every batch; the trainer sums the results.
  const int rank = trainer.processes().rank(), world = trainer.processes().size();
  auto slice = [rank, world](int n, std::int64_t, std::int64_t) {
    return std::vector<std::pair<int, int>>{{static_cast<int>(static_cast<std::int64_t>(n) * rank / world),
                                             static_cast<int>(static_cast<std::int64_t>(n) * (rank + 1) / world)}};
  };
  data::Loader loader(set, {.batch = batch, .augment = transform, .shuffle = false, .drop_last = false, .rank = rank,
                            .world_size = world, .shard = slice, .threads = loader_threads});
  double loss_sum = 0;
  tower::EvalResult total;
  for (const data::Batch& b : loader) {
    tower::EvalResult r = trainer.evaluate(b, views);
    loss_sum += r.loss * static_cast<double>(r.rows);
    total.correct += r.correct;
    total.correct_top5 += r.correct_top5;
    total.rows += r.rows;
    if (total.confusion.empty()) {
      total.classes = r.classes;
      total.confusion.assign(r.confusion.size(), 0);
    }
    for (std::size_t k = 0; k < r.confusion.size() && k < total.confusion.size(); ++k) total.confusion[k] += r.confusion[k];
  }
  if (total.rows > 0) {
    total.loss = loss_sum / static_cast<double>(total.rows);
    total.accuracy = static_cast<double>(total.correct) / static_cast<double>(total.rows);
    total.top5 = static_cast<double>(total.correct_top5) / static_cast<double>(total.rows);
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

// Checkpoint metadata: an auto split's shares in force after the checkpoint's step (JSON array).
constexpr const char* kSplitSharesKey = "towerflow.split_shares";

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
  void start_new_run(int& removed, fs::path& moved_aside);
  fs::path move_aside(const std::vector<io::CheckpointInfo>& checkpoints, const std::vector<fs::path>& files,
                      const std::string& what);
  void move_newer_aside(const io::CheckpointInfo& from);
  void resume_split(const io::Metadata& metadata, std::int64_t step);
  void save(const TrainingPosition& p, bool final = false);
  void prune();
  void evaluate_now(std::int64_t step);
  void final_evaluation(std::int64_t step);
  void evaluate_set(std::int64_t step, EvalSet which);
  void agree_on_stop();

  tower::Trainer& trainer_;
  optim::Optimizer& optimizer_;
  const data::Dataset& train_set_;
  const data::Dataset* test_set_;
  const FitOptions& o_;
  const std::vector<Hook*>& hooks_;
  StopRequest stop_;
  Plan plan_;
  std::optional<io::TrainDirLock> lock_;  // rank 0's, held for the run (declared first: released last)
  std::optional<io::CheckpointDir> dir_;
  io::Metadata metadata_;
  std::string run_id_;
  std::map<fs::path, std::string> run_of_;  // checkpoint directory -> its run_id
  FitResult result_;
  double optimizer_seconds_ = 0;
  std::int64_t evaluated_at_ = -1;  // the step of the last evaluation during training
  std::int64_t tested_at_ = -1;     // with a validation set: the step of the test set's evaluation
  bool final_ = false;              // in the final evaluation (FitOptions::final_views apply)
  std::int64_t saved_at_ = -1;      // the step of the last checkpoint this run wrote or resumed from
  collectives::ProcessGroup& processes_ = trainer_.processes();
  const bool rank0_ = processes_.rank() == 0;
};

// Note [Stopping together]: a hook may ask to stop on one rank only (a time limit, a signal, a
// checkpoint that failed on rank 0): every rank must leave the loop at the same step, or the
// others would wait in the next step's collectives. So after every step's hooks and at every
// epoch's end the ranks combine their requests (any rank's request stops all; any rank's "no
// evaluation" skips it), one all-reduce of two integers.
void Loop::agree_on_stop() {
  if (processes_.size() == 1) return;
  std::array<std::int64_t, 2> asked{stop_.requested ? 1 : 0, stop_.requested && !stop_.evaluate ? 1 : 0};
  processes_.all_reduce_max(std::span<std::int64_t>(asked));
  if (asked[0] && !stop_.requested) {
    stop_.requested = true;
    stop_.reason = "another rank asked to stop";
  }
  if (asked[1]) stop_.evaluate = false;
}

// A new run in train_dir: nothing of an earlier run may be there, unless start_over says what to
// do with it (see fit.h).
void Loop::start_new_run(int& removed, fs::path& moved_aside) {
  EarlierRun earlier = earlier_run(*dir_, hooks_);
  if (earlier.empty()) return;
  const std::string found = earlier.describe();
  // Asked to resume, but the earlier run left no checkpoint (it stopped before its first): its
  // files are kept aside rather than refused or mixed in.
  const StartOver mode = o_.resume && o_.start_over == StartOver::Refuse ? StartOver::MoveAside : o_.start_over;
  switch (mode) {
    case StartOver::Refuse:
      throw TrainDirInUse(str("train_dir ", o_.train_dir.string(), " holds an earlier run: ", found,
                              "; nothing was changed. Resume that run, start over (moving its files aside or "
                              "deleting them), or use another train_dir"),
                          o_.train_dir, found);
    case StartOver::MoveAside:
      moved_aside = move_aside(earlier.checkpoints, earlier.files, "the earlier run's files");
      log_info(str("a new run in ", o_.train_dir.string(), ": the earlier run's ", found, " moved to ", moved_aside.string()));
      return;
    case StartOver::Delete:
      removed = dir_->remove(earlier.checkpoints);
      for (const auto& f : earlier.files) removed += fs::remove_all(f) > 0 ? 1 : 0;
      log_info(str("a new run in ", o_.train_dir.string(), ": deleted the earlier run's ", found));
      return;
  }
}

// Moves checkpoints and files of train_dir into a new train_dir/earlier-<UTC time>/ and returns it.
fs::path Loop::move_aside(const std::vector<io::CheckpointInfo>& checkpoints, const std::vector<fs::path>& files,
                          const std::string& what) {
  fs::path to = o_.train_dir / ("earlier-" + utc_text(std::time(nullptr), "%Y%m%dT%H%M%SZ"));
  for (int n = 2; fs::exists(to); ++n) to.replace_filename(str(to.filename().string(), "-", n));
  try {
    fs::create_directories(to);
    for (const auto& c : checkpoints) fs::rename(c.path, to / c.path.filename());
    for (const auto& f : files) fs::rename(f, to / f.filename());
  } catch (const fs::filesystem_error& e) {
    raise<DataError>("could not move ", what, " in ", o_.train_dir.string(), " to ", to.string(), ": ",
                     e.code().message(), " (", e.path1().string(), "); what was moved is there, the rest where it was");
  }
  return to;
}

// Resuming from an older checkpoint than the newest (resume_from): the newer ones are this run's
// future as it once went, and are kept, moved aside, rather than replaced as the run reaches
// their steps.
void Loop::move_newer_aside(const io::CheckpointInfo& from) {
  std::vector<io::CheckpointInfo> newer;
  for (const auto& c : dir_->list())
    if (c.step > from.step) newer.push_back(c);
  if (newer.empty()) return;
  const fs::path to = move_aside(newer, {}, "the newer checkpoints");
  log_warning(str("resume from ", from.path.filename().string(), " (step ", from.step, "): the ", newer.size(),
                  newer.size() == 1 ? " newer checkpoint (" : " newer checkpoints (", newer.front().path.filename().string(),
                  newer.size() == 1 ? "" : str(" .. ", newer.back().path.filename().string()), ") moved to ", to.string(),
                  ", so that this run writes its own"));
}

// An auto split (tower::AutoSplit) goes on from the shares its checkpoint recorded, when they are
// for as many towers as this run has; otherwise it starts even again, saying why.
void Loop::resume_split(const io::Metadata& metadata, std::int64_t step) {
  if (trainer_.split_shares().empty()) return;
  const auto it = metadata.find(kSplitSharesKey);
  if (it == metadata.end()) {
    if (rank0_) log_warning("resume: the checkpoint records no auto split; the split starts even and is measured again");
    return;
  }
  std::vector<double> shares;
  try {
    shares = nlohmann::json::parse(it->second).get<std::vector<double>>();
  } catch (const std::exception&) {
    raise<DataError>("the checkpoint's ", kSplitSharesKey, " is '", it->second,
                     "', not a list of numbers; resume from another checkpoint, or remove the key to start the split even");
  }
  if (shares.size() != static_cast<std::size_t>(trainer_.global_towers())) {
    if (rank0_)
      log_warning(str("resume: the checkpoint's auto split is for ", shares.size(), " towers and this run has ",
                      trainer_.global_towers(), "; the split starts even and is measured again"));
    return;
  }
  trainer_.set_split_shares(shares, step + 1);
  if (rank0_) log_info(str("resume: the auto split goes on from the checkpoint's shares ", it->second));
}

void Loop::save(const TrainingPosition& p, bool final) {
  if (!dir_) return;
  const trace::Span span("io", "checkpoint");
  auto t0 = Clock::now();
  trainer_.sync();
  each([&](Hook& h) { h.save_state(metadata_); });
  if (const std::vector<double> shares = trainer_.split_shares(p.step + 1); !shares.empty())
    metadata_[kSplitSharesKey] = nlohmann::json(shares).dump();
  try {
    std::vector<optim::NamedState> hook_tensors;
    each([&](Hook& h) {
      for (auto& t : h.save_tensors()) hook_tensors.push_back(std::move(t));
    });
    result_.last_checkpoint = save_checkpoint(*dir_, trainer_.model(), optimizer_, p, metadata_, 0,
                                              trainer_.loss_scaler(), hook_tensors);
  } catch (const DataError& e) {
    if (final || o_.checkpoint_errors == CheckpointErrors::Stop) throw;
    log_warning(str("the checkpoint of step ", p.step, " was not written: ", e.what(),
                    "; training goes on (the earlier checkpoints are as they were)"));
    return;
  }
  saved_at_ = p.step;
  prune();
  CheckpointRecord r{.path = result_.last_checkpoint, .position = p, .seconds = seconds_since(t0)};
  each([&](Hook& h) { h.on_checkpoint(r); });
}

// Note [Rotation deletes only this run's checkpoints]: a train_dir may hold checkpoints of
// another run (copied in, or left by a run that was resumed from an older step); keep_checkpoints
// counts and deletes only those whose run_id is this run's.
void Loop::prune() {
  if (o_.keep_checkpoints <= 0) return;
  std::vector<io::CheckpointInfo> ours;
  for (const auto& c : dir_->list()) {
    auto it = run_of_.find(c.path);
    if (it == run_of_.end()) {
      std::string id;
      try {
        auto meta = read_checkpoint_info(c.path).metadata;
        if (auto m = meta.find("run_id"); m != meta.end()) id = m->second;
      } catch (const Error&) {
        id = "(unreadable)";  // not ours to delete
      }
      it = run_of_.emplace(c.path, id).first;
    }
    if (it->second == run_id_) ours.push_back(c);
  }
  if (ours.size() <= static_cast<std::size_t>(o_.keep_checkpoints)) return;
  ours.resize(ours.size() - static_cast<std::size_t>(o_.keep_checkpoints));
  dir_->remove(ours);
  for (const auto& c : ours) run_of_.erase(c.path);
}

// During training: the validation set when there is one, else the test set.
void Loop::evaluate_now(std::int64_t step) {
  if (o_.validation_set) evaluate_set(step, EvalSet::Validation);
  else if (test_set_) evaluate_set(step, EvalSet::Test);
  evaluated_at_ = step;
}

// At the end: whichever set has not been evaluated at this step (a run stopped by a hook after a
// validation still reports its test set). With final views the test set is evaluated again
// through them even when its plain evaluation was at this step: both records are kept.
void Loop::final_evaluation(std::int64_t step) {
  final_ = true;
  const bool views = test_set_ && !data::plain_views(o_.final_views);
  if (evaluated_at_ != step || (views && !o_.validation_set)) evaluate_now(step);
  if (o_.validation_set && test_set_ && tested_at_ != step) {
    evaluate_set(step, EvalSet::Test);
    tested_at_ = step;
  }
}

void Loop::evaluate_set(std::int64_t step, EvalSet which) {
  const data::Dataset& set = which == EvalSet::Validation ? *o_.validation_set : *test_set_;
  auto t0 = Clock::now();
  // Evaluation images are normalised as the training images are, and not augmented.
  const data::Augment transform{.mean = o_.augment.mean, .std = o_.augment.std};
  const bool with_views = final_ && which == EvalSet::Test && !data::plain_views(o_.final_views);
  tower::EvalResult e = evaluate(trainer_, set, o_.eval_batch > 0 ? o_.eval_batch : o_.batch, o_.loader_threads,
                                 transform, with_views ? o_.final_views : std::vector<data::TestView>{});
  const double seconds = seconds_since(t0);
  if (which == EvalSet::Validation) {
    result_.val_loss = e.loss;
    result_.val_acc = e.accuracy;
    result_.val_top5 = e.top5;
    result_.val_examples = e.rows;
  } else {
    result_.test_loss = e.loss;
    result_.test_acc = e.accuracy;
    result_.test_top5 = e.top5;
    result_.test_examples = e.rows;
  }
  EvalRecord r{.step = step,
               .epoch = static_cast<double>(step) / static_cast<double>(plan_.steps_per_epoch),
               .set = which,
               .test_loss = e.loss,
               .test_acc = e.accuracy,
               .examples = e.rows,
               .seconds = seconds,
               .test_top5 = e.top5,
               .classes = e.classes,
               .confusion = e.confusion,
               .views = with_views ? static_cast<int>(o_.final_views.size()) : 1};
  each([&](Hook& h) { h.on_eval(r); });
  // A model that computes NaN or Inf on held-out data has diverged even when the training loss
  // of the last step was finite (an update can overflow the weights it leaves behind). The hooks
  // have shown the evaluation; the run stops before a checkpoint of that state is written.
  if (!std::isfinite(e.loss)) {
    const std::string_view name = which == EvalSet::Validation ? "validation" : "test";
    auto latest = dir_ ? dir_->latest() : std::nullopt;
    raise<NumericalError>(
        "the ", name, " loss is ", e.loss, " at step ", step, " (", e.rows, " ", name,
        " images): the model's weights or batch-norm statistics, or the ", name, " data, contain NaN/Inf; "
        "training stopped without saving this state. ",
        latest ? str("The last checkpoint is ", latest->path.string(), " (step ", latest->step,
                     "; it may hold the same state if it was written after the weights diverged); ")
               : std::string("No checkpoint was written yet; "),
        "lower the learning rate (", optimizer_.lr(), " now), warm it up, or check the data, then ",
        latest ? "resume from that checkpoint" : "start again");
  }
}

FitResult Loop::run() {
  const auto run_start = Clock::now();
  plan_ = plan(train_set_, o_);
  trainer_.check_batch(o_.batch);  // before anything is read or written
  if (o_.schedule) optimizer_.set_schedule(o_.schedule(plan_));
  // Each process loads only its towers' rows of every global batch.
  data::Loader loader(train_set_, {.batch = o_.batch, .augment = o_.augment, .mix = o_.mix, .seed = o_.seed,
                                   .rank = processes_.rank(), .world_size = processes_.size(),
                                   .shard = [this](int n, std::int64_t epoch, std::int64_t index) {
                                     return trainer_.shard(n, epoch * plan_.steps_per_epoch + index + 1);
                                   },
                                   .threads = o_.loader_threads});
  // An auto split's new shares apply only to batches the loader has not cut yet.
  trainer_.set_split_delay(loader.lookahead() + 1);

  // ---- where the run starts -----------------------------------------------------------------
  TrainingPosition pos;
  std::optional<CheckpointInfo> resumed;
  fs::path resumed_from, moved_aside;
  std::vector<optim::NamedState> resumed_tensors;
  int removed = 0;
  // Across processes, rank 0 alone looks after train_dir (it writes the checkpoints); every rank
  // loads the checkpoint rank 0 chose.
  if (!o_.resume_from.empty() && !o_.resume)
    raise<InvalidArgument>("resume_from ", o_.resume_from.string(), " is given but resume is not; set both to continue "
                           "from that checkpoint");
  if (!o_.train_dir.empty()) {
    // One run per train_dir: taken before anything there is read or written (io/train_dir_lock.h).
    if (rank0_) {
      lock_.emplace(o_.train_dir);
      dir_.emplace(o_.train_dir);
    }
    if (o_.resume) {
      std::string chosen;
      if (rank0_ && !o_.resume_from.empty()) {
        const io::CheckpointInfo c = find_checkpoint(o_.train_dir, o_.resume_from.string());
        verify_checkpoint(c.path);  // the one asked for: damage is an error, not a reason to pick another
        move_newer_aside(c);
        chosen = c.path.string();
      } else if (rank0_) {
        if (auto intact = newest_intact_checkpoint(o_.train_dir)) chosen = intact->path.string();
      }
      chosen = processes_.broadcast(chosen, 0);
      if (!chosen.empty()) {
        resumed_tensors = load_hook_tensors(chosen);  // read and verified before the model changes
        resumed = load_checkpoint(chosen, trainer_.model(), optimizer_, trainer_.loss_scaler());
        trainer_.broadcast_from_replica0();
        pos = resumed->position;
        resume_split(resumed->metadata, pos.step);
        saved_at_ = pos.step;
        resumed_from = chosen;
        if (auto id = resumed->metadata.find("run_id"); id != resumed->metadata.end()) run_id_ = id->second;
      } else if (rank0_) {
        log_warning(str("resume: no checkpoint in ", o_.train_dir.string(), "; starting a new run"));
      }
    }
    if (rank0_) {
      if (!resumed) start_new_run(removed, moved_aside);
      dir_->remove_stale();
    }
  } else if (o_.resume) {
    raise<InvalidArgument>("resume needs a train_dir to resume from");
  }
  if (!resumed) run_id_ = processes_.broadcast(new_run_id(), 0);
  metadata_ = o_.metadata;
  metadata_["run_id"] = run_id_;
  metadata_["seed"] = std::to_string(o_.seed);
  metadata_["towerflow_version"] = version();
  metadata_["towerflow_commit"] = commit();
  std::string devices;
  for (const auto& d : trainer_.devices()) devices += (devices.empty() ? "" : ", ") + d.str();
  metadata_["devices"] = devices;

  StartInfo start{.trainer = trainer_,
                  .optimizer = optimizer_,
                  .train_set = train_set_,
                  .test_set = test_set_,
                  .validation_set = o_.validation_set,
                  .options = o_,
                  .plan = plan_,
                  .position = pos,
                  .resumed = resumed,
                  .resumed_from = resumed_from,
                  .removed_files = removed,
                  .moved_aside = moved_aside,
                  .run_id = run_id_,
                  .resumed_tensors = std::move(resumed_tensors)};
  each([&](Hook& h) { h.on_start(start); });

  // ---- the loop -----------------------------------------------------------------------------
  const std::int64_t spe = plan_.steps_per_epoch;
  const auto counters = [&] {
    const tower::TrainerTimings& t = trainer_.timings();
    return StepCounters{.compute_s = t.compute_seconds, .reduction_s = t.reduction_seconds,
                        .optimizer_s = optimizer_seconds_};
  };
  StepWindow window(counters());
  double train_seconds = 0;
  std::int64_t train_images = 0;
  std::int64_t step = pos.step;

  // Whether the end of `epoch` brings an evaluation (at the end of the run there is one anyway).
  const auto evaluates_after = [&](std::int64_t epoch) {
    return (test_set_ || o_.validation_set) && o_.eval_every > 0 && (epoch + 1) % o_.eval_every == 0;
  };
  std::optional<TrainingPosition> save_after_eval;  // a checkpoint of an epoch's last step
  for (std::int64_t epoch = pos.epoch; step < plan_.total_steps && !stop_.requested; ++epoch) {
    loader.set_epoch(epoch, epoch == pos.epoch ? pos.step_in_epoch : 0);
    auto t0 = Clock::now();
    auto waiting_since = t0;  // for the next batch
    std::int64_t last_index = -1;
    loader.start();
    for (const data::Batch* next = wait_for_batch(loader); next; next = wait_for_batch(loader)) {
      const data::Batch& b = *next;
      window.add_data_wait(seconds_since(waiting_since));
      last_index = b.index_in_epoch;
      float loss;
      {
        const trace::Span span("phase", "forward_backward");
        const collectives::ContextScope at_step({.step = step + 1});  // for stall reports
        tower::HostBatch host = tower::HostBatch::of(b);
        host.step = step + 1;  // the auto split's schedule and the loader's shard agree on it
        loss = trainer_.forward_backward(host);
      }
      if (!std::isfinite(loss)) {
        each([&](Hook& h) { h.on_epoch_end(epoch); });
        auto latest = dir_ ? dir_->latest() : std::nullopt;
        raise<NumericalError>(
            "the loss is ", loss, " at step ", step + 1, " (epoch ", epoch + 1,
            "); training stopped without applying that step. ",
            latest ? str("The last good checkpoint is ", latest->path.string(), " (step ", latest->step, "); ")
                   : std::string("No checkpoint was written yet; "),
            "lower the learning rate (", optimizer_.lr(), " now), warm it up, or check the data",
            trainer_.options().precision == Precision::Fp16
                ? " (under fp16 the forward itself may have overflowed fp16's 65504, which no loss scale "
                  "fixes: TrainerOptions::precision = Precision::Bf16 has fp32's range)"
                : "",
            ", then ",
            latest ? "resume from that checkpoint" : "start again");
      }
      {
        // The whole update as the loop sees it (the trainer's timings count only its threads' part).
        const trace::Span span("optimizer", "optimizer step");
        auto to = Clock::now();
        optimizer_.step();
        optimizer_seconds_ += seconds_since(to);
      }
      ++step;
      const auto& m = trainer_.last_step();
      StepInfo si{.step = step,
                  .epoch = epoch,
                  .index_in_epoch = b.index_in_epoch,
                  .loss = loss,
                  .accuracy = m.accuracy,
                  .rows = m.rows,
                  .lr = optimizer_.lr()};
      window.add_step(loss, m.accuracy, m.rows);
      each([&](Hook& h) { h.on_step(si); });
      agree_on_stop();

      const bool last = step >= plan_.total_steps || stop_.requested;
      if (step % o_.log_every == 0 || last || b.index_in_epoch + 1 == spe) {
        const double dt = seconds_since(t0);
        train_seconds += dt;
        train_images += window.images();
        TrainRecord r = window.close(dt, counters());
        r.step = step;
        r.total_steps = plan_.total_steps;
        r.epoch = static_cast<double>(epoch) + static_cast<double>(b.index_in_epoch + 1) / spe;
        r.epochs = plan_.epochs;
        r.lr = optimizer_.lr();
        if (const tower::LossScaler* ls = trainer_.loss_scaler()) {
          r.loss_scale = ls->scale();
          r.skipped_steps = ls->state().skipped_steps;
        }
        if (!trainer_.split_shares().empty()) r.split = m.global_split;
        each([&](Hook& h) { h.on_log(r); });
        t0 = Clock::now();
      }
      TrainingPosition here{step, epoch, b.index_in_epoch + 1};
      if (here.step_in_epoch == spe) here = {step, epoch + 1, 0};
      if (o_.save_every > 0 && step % o_.save_every == 0 && !last) {
        if (here.step_in_epoch == 0 && evaluates_after(epoch)) {
          save_after_eval = here;  // so that the hooks' state it holds includes this evaluation
        } else {
          auto ts = Clock::now();
          save(here);
          t0 += Clock::now() - ts;  // checkpoint time is not training throughput
        }
      }
      if (last) {
        loader.stop();
        break;
      }
      waiting_since = Clock::now();
    }
    each([&](Hook& h) { h.on_epoch_end(epoch); });
    agree_on_stop();
    const bool at_end = step >= plan_.total_steps || stop_.requested;
    const bool epoch_done = last_index + 1 == spe;
    const bool skip = stop_.requested && !stop_.evaluate;
    if (!skip && (at_end || (epoch_done && evaluates_after(epoch)))) evaluate_now(step);
    agree_on_stop();  // a hook's request from on_eval
    if (save_after_eval && !stop_.requested && step < plan_.total_steps) save(*save_after_eval);
    save_after_eval.reset();
  }
  // A resumed run that had nothing left to do, or one stopped by a hook during an evaluation.
  if (!stop_.requested || stop_.evaluate) final_evaluation(step);

  // The final checkpoint, unless this run already wrote (or resumed from) this step's: a newer
  // damaged checkpoint passed over at resume is replaced, not reported as the last one.
  if (dir_ && saved_at_ != step) save({step, step / spe, step % spe}, /*final=*/true);
  // Rank 0 alone writes; every rank names the checkpoint (train_dir/ckpt-<step>, where rank 0
  // wrote it or raised, which would have stopped every rank), e.g. in "stopped by SIGTERM" lines.
  if (!o_.train_dir.empty()) result_.last_checkpoint = o_.train_dir / io::CheckpointDir::name_for_step(step);
  result_.steps = step;
  result_.train_img_per_s = train_seconds > 0 ? static_cast<double>(train_images) / train_seconds : 0;
  result_.stopped_early = stop_.requested;
  result_.stop_reason = stop_.reason;
  result_.run_id = run_id_;
  result_.wall_seconds = seconds_since(run_start);
  each([&](Hook& h) { h.on_end(result_); });
  return result_;
}

namespace {
// A run that fails in its collectives (any failure across processes; among one process's towers,
// a collective that was aborted) leaves the last collectives it entered in the train dir for the
// post-mortem: train_dir/collectives.rank<R>.json across processes, train_dir/collectives.json in
// one, holding {"processes": ProcessGroup::recent_collectives, "towers":
// Trainer::tower_collectives} (Note [Stall reports] in core/collectives/mpi_process_group.cc,
// Note [Stall reports among towers] in core/collectives/tower_waits.cc). Best effort: the run's
// own error is the one to report.
void record_collectives(const tower::Trainer& trainer, const fs::path& train_dir) noexcept {
  if (train_dir.empty()) return;
  try {
    collectives::ProcessGroup& processes = trainer.processes();
    const bool across = processes.size() > 1;
    const fs::path path = train_dir / (across ? str("collectives.rank", processes.rank(), ".json") : "collectives.json");
    nlohmann::ordered_json record = {{"processes", nlohmann::json::parse(processes.recent_collectives())},
                                     {"towers", nlohmann::json::parse(trainer.tower_collectives())}};
    io::write_file_atomically(path, record.dump() + "\n");
    log_warning(str(across ? str("rank ", processes.rank(), "'s") : std::string("the"), " last collectives: ", path.string()));
  } catch (const std::exception&) {
  }
}
}  // namespace

FitResult fit(tower::Trainer& trainer, optim::Optimizer& optimizer, const data::Dataset& train_set,
              const data::Dataset* test_set, const FitOptions& options, const std::vector<Hook*>& hooks) {
  try {
    try {
      Loop loop(trainer, optimizer, train_set, test_set, options, hooks);
      return loop.run();
    } catch (const collectives::PeerFailed&) {
      // Another rank's failure (that rank has told everyone), or a collective that timed out.
      record_collectives(trainer, options.train_dir);
      throw;
    } catch (const std::exception& e) {
      // Every other rank stops too, naming this one and the cause (Note [Collectives that cannot hang]).
      trainer.processes().announce_failure(e.what());
      if (trainer.processes().size() > 1 || dynamic_cast<const collectives::CollectiveAborted*>(&e))
        record_collectives(trainer, options.train_dir);
      throw;
    }
  } catch (const OutOfMemory& e) {
    throw explain_out_of_memory(e, trainer.devices(), options.batch);
  }
}

OutOfMemory explain_out_of_memory(const OutOfMemory& e, const std::vector<Device>& devices, int global_batch) {
  const bool any_gpu = std::any_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_gpu(); });
  const std::string first = devices.empty() ? std::string("/cpu:0") : devices.front().str();
  return OutOfMemory(str(
      e.what(), "\nallocators:\n", allocator_report(devices), "\nto fit: a smaller global batch (FitOptions::batch = ",
      std::max(1, global_batch / 2), ", now ", global_batch, ")",
      any_gpu ? ", GPU pools that grow on demand (ProcessOptions::allow_growth = true), a larger share of GPU memory "
                "(ProcessOptions::per_process_gpu_memory_fraction = 0.95)"
              : "",
      ", or a larger memory limit for ", first, " (ProcessOptions::memory_limit_mb[", first, "])"));
}

}  // namespace towerflow::train
