#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/data.h"
#include "optim/optim.h"
#include "tower/tower.h"
#include "train/fit_fixtures.h"
#include "train/train.h"

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::train;
using namespace towerflow::train::testing;

namespace {

EvalRecord eval_of(EvalSet set, double loss, double acc, std::int64_t step = 0) {
  return {.step = step, .set = set, .test_loss = loss, .test_acc = acc, .test_top5 = acc};
}

// What on_start sees, for hooks driven by hand with synthetic evaluations.
struct Start {
  Setup s;
  FitOptions options;
  StartInfo info(bool with_validation, std::optional<CheckpointInfo> resumed = std::nullopt) {
    return {.trainer = s.trainer, .optimizer = s.sgd, .train_set = s.train, .test_set = &s.test,
            .validation_set = with_validation ? &s.train : nullptr, .options = options,
            .plan = {.steps_per_epoch = 4, .total_steps = 40, .epochs = 10}, .resumed = std::move(resumed)};
  }
};

}  // namespace

TEST_CASE("a watched metric resolves against the run, counts only its set, and improves by more than min_delta",
          "[train][monitor]") {
  fresh_devices();
  Start st;
  MetricWatch loss({.metric = "loss"});
  loss.start(st.info(true), "w");
  CHECK(loss.name() == "val_loss");
  CHECK_FALSE(loss.see(eval_of(EvalSet::Test, 1.0, 0.5)).has_value());  // the final test evaluation
  CHECK(loss.see(eval_of(EvalSet::Validation, 2.0, 0.1)) == true);     // the first always improves
  CHECK(loss.see(eval_of(EvalSet::Validation, 2.5, 0.1)) == false);
  CHECK(loss.see(eval_of(EvalSet::Validation, std::nan(""), 0.1)) == false);  // never better
  CHECK(loss.since_best() == 2);
  CHECK(loss.see(eval_of(EvalSet::Validation, 1.5, 0.1)) == true);
  CHECK(*loss.best() == 1.5);
  CHECK(loss.since_best() == 0);

  MetricWatch acc({.metric = "acc", .min_delta = 0.01});
  acc.start(st.info(false), "w");
  CHECK(acc.name() == "test_acc");
  CHECK(acc.see(eval_of(EvalSet::Test, 1, 0.50)) == true);
  CHECK(acc.see(eval_of(EvalSet::Test, 1, 0.505)) == false);  // within min_delta
  CHECK(acc.see(eval_of(EvalSet::Test, 1, 0.52)) == true);

  MetricWatch val({.metric = "val_top5"});
  CHECK_THROWS_WITH(val.start(st.info(false), "w"), Catch::Contains("has none") && Catch::Contains("test_top5"));
  MetricWatch bad({.metric = "val_accuracy"});
  CHECK_THROWS_WITH(bad.start(st.info(true), "w"), Catch::Contains("\"val_accuracy\" is not known"));
  CHECK_THROWS_AS(MetricWatch({.metric = "loss", .min_delta = -1}), tw::InvalidArgument);

  // Its state goes into a checkpoint's metadata and comes back on resume (the same metric only).
  tw::io::Metadata meta;
  loss.save(meta, "w");
  MetricWatch again({.metric = "val_loss"});
  again.start(st.info(true, CheckpointInfo{.metadata = meta}), "w");
  CHECK(*again.best() == 1.5);
  MetricWatch other({.metric = "val_acc"});
  other.start(st.info(true, CheckpointInfo{.metadata = meta}), "w");
  CHECK_FALSE(other.best().has_value());
}

TEST_CASE("ReduceLrOnPlateau multiplies the schedule after patience, waits its cooldown, stops at min_lr, and resumes",
          "[train][monitor][plateau]") {
  fresh_devices();
  Start st;
  st.s.sgd.set_schedule(tw::optim::cosine_schedule(0.1, 100));
  ReduceLrOnPlateau plateau({.metric = "val_loss"}, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.02});
  const StartInfo info = st.info(true);
  plateau.on_start(info);
  const auto& sched = st.s.sgd.schedule();
  CHECK(sched(10) == Approx(tw::optim::cosine_schedule(0.1, 100)(10)));
  st.s.sgd.set_lr(0.1);  // the rate of "the last step", as the optimizer would hold it
  const auto v = [](double loss) { return eval_of(EvalSet::Validation, loss, 0); };
  plateau.on_eval(v(1.0));  // best
  plateau.on_eval(v(1.0));  // 1 without improvement
  CHECK(plateau.reductions() == 0);
  plateau.on_eval(v(1.1));  // 2: reduce
  CHECK(plateau.reductions() == 1);
  CHECK(plateau.scale() == Approx(0.5));
  CHECK(st.s.sgd.schedule()(10) == Approx(0.5 * tw::optim::cosine_schedule(0.1, 100)(10)));
  st.s.sgd.set_lr(0.05);
  plateau.on_eval(v(1.2));  // cooldown: not counted
  plateau.on_eval(v(1.2));  // 1
  CHECK(plateau.reductions() == 1);
  tw::io::Metadata meta;
  plateau.save_state(meta);
  plateau.on_eval(v(1.2));  // 2: reduce to 0.025
  CHECK(plateau.scale() == Approx(0.25));
  st.s.sgd.set_lr(0.025);
  plateau.on_eval(v(1.2));  // cooldown
  plateau.on_eval(v(1.2));
  plateau.on_eval(v(1.2));  // reduce, but not below min_lr 0.02
  CHECK(plateau.scale() == Approx(0.25 * 0.02 / 0.025));
  st.s.sgd.set_lr(0.02);
  const int at_min = plateau.reductions();
  for (int i = 0; i < 6; ++i) plateau.on_eval(v(1.3));
  CHECK(plateau.reductions() == at_min);  // at min_lr: nothing more
  plateau.on_end({});
  CHECK(st.s.sgd.schedule()(10) == Approx(tw::optim::cosine_schedule(0.1, 100)(10)));  // the schedule as it was

  // Resumed from the state saved after the first reduction: the same scale, best and count.
  ReduceLrOnPlateau resumed({.metric = "val_loss"}, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.02});
  resumed.on_start(st.info(true, CheckpointInfo{.metadata = meta}));
  CHECK(resumed.scale() == Approx(0.5));
  CHECK(*resumed.watch().best() == 1.0);
  CHECK(resumed.watch().since_best() == 1);
  st.s.sgd.set_lr(0.05);
  resumed.on_eval(v(1.2));
  CHECK(resumed.scale() == Approx(0.25));
  resumed.on_end({});

  CHECK_THROWS_AS(ReduceLrOnPlateau({}, {.factor = 1.0}), tw::InvalidArgument);
  CHECK_THROWS_AS(ReduceLrOnPlateau({}, {.patience = 0}), tw::InvalidArgument);
}

TEST_CASE("EarlyStopping ends a run whose metric stops improving, the final evaluation and checkpoint following",
          "[train][monitor][early_stop]") {
  fresh_devices();
  TempDir dir;
  Setup s;
  FitOptions o = tiny(dir.path);
  o.epochs = 6;
  o.schedule = schedule("constant", 0.0);  // nothing learns: the loss is the same at every evaluation
  EarlyStopping stop({.metric = "test_loss"}, 2);
  Recorder rec;
  FitResult r = fit(s.trainer, s.sgd, s.train, &s.test, o, {&stop, &rec});
  CHECK(r.stopped_early);
  CHECK(r.steps == 12);  // evaluations at 4 (best), 8 (1), 12 (2: stop)
  CHECK_THAT(r.stop_reason, Catch::Contains("early stopping") && Catch::Contains("test_loss") &&
                                Catch::Contains("2 evaluations"));
  CHECK(r.last_checkpoint == dir.path / "ckpt-0000000012");
  CHECK(rec.events.back() == "end:12");
  const auto meta = read_checkpoint_info(r.last_checkpoint).metadata;
  CHECK(meta.at("early_stop.metric") == "test_loss");
  CHECK(meta.at("early_stop.since") == "2");
}

TEST_CASE("KeepBest keeps the best evaluation's checkpoint, a resumed run goes on from its best, a new run moves it aside",
          "[train][monitor][keep_best]") {
  fresh_devices();
  TempDir full_dir, cut_dir;
  auto run = [](const fs::path& dir, bool resume, std::int64_t stop_at) {
    Setup s;
    FitOptions o = tiny(dir);
    o.epochs = 4;
    o.resume = resume;
    o.metadata = {{"model", "mlp"}};
    KeepBest best({.metric = "test_acc"}, dir / "best");
    std::vector<double> accs;
    std::vector<std::int64_t> steps;
    LambdaHook h;
    h.eval = [&](const EvalRecord& e) {
      accs.push_back(e.test_acc);
      steps.push_back(e.step);
      if (e.step == stop_at) h.stop_training("cut");
    };
    fit(s.trainer, s.sgd, s.train, &s.test, o, {&best, &h});
    return std::make_tuple(accs, steps, best.last_saved());
  };
  auto [accs, steps, saved] = run(full_dir.path, false, -1);
  REQUIRE(accs.size() == 4);
  // The first evaluation with the highest accuracy.
  std::size_t at = 0;
  for (std::size_t i = 1; i < accs.size(); ++i)
    if (accs[i] > accs[at]) at = i;
  const fs::path best_dir = full_dir.path / "best" / tw::io::CheckpointDir::name_for_step(steps[at]);
  CHECK(saved == best_dir);
  CHECK(tw::io::CheckpointDir(full_dir.path / "best").list().size() == 1);
  const auto meta = read_checkpoint_info(best_dir).metadata;
  CHECK(meta.at("best_metric") == "test_acc");
  CHECK(std::stod(meta.at("best_value")) == Approx(accs[at]));
  CHECK(meta.at("model") == "mlp");
  CHECK(read_checkpoint_info(best_dir).position.step == steps[at]);

  // Cut after the second evaluation and resumed: the same best checkpoint at the end.
  fresh_devices();
  run(cut_dir.path, false, 8);
  fresh_devices();
  run(cut_dir.path, true, -1);
  const fs::path cut_best = cut_dir.path / "best" / tw::io::CheckpointDir::name_for_step(steps[at]);
  REQUIRE(fs::exists(cut_best));
  CHECK(tw::io::CheckpointDir(cut_dir.path / "best").list().size() == 1);
  CHECK(tensors_of(cut_best / kModelFile) == tensors_of(best_dir / kModelFile));

  // A new run in that train_dir refuses, naming the best checkpoint's folder; moving aside takes it too.
  fresh_devices();
  {
    Setup s;
    KeepBest best({.metric = "test_acc"}, full_dir.path / "best");
    FitOptions o = tiny(full_dir.path);
    CHECK_THROWS_WITH(fit(s.trainer, s.sgd, s.train, &s.test, o, {&best}), Catch::Contains("best"));
    o.start_over = StartOver::MoveAside;
    o.max_steps = 1;
    fit(s.trainer, s.sgd, s.train, &s.test, o, {&best});
    CHECK(tw::io::CheckpointDir(full_dir.path / "best").list().size() == 1);  // the new run's own
  }
}
