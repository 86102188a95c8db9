// The tower trainer across processes. Run by CTest under mpirun (tests/tower/CMakeLists.txt):
// every rank runs the same test cases, selected by tag ([np2], [np3]); each case trains with
// the job's processes and compares with towers of one process (a world of one, in the same
// program on every rank) over the same global batches. Without mpirun (a world of one) the
// cases have nothing to test and say so.
#include <catch2/catch.hpp>

// GCC 12 warns that the split variant of a Case built in an initializer list "may be used
// uninitialized": a false positive of its -Wmaybe-uninitialized on std::variant temporaries.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/collectives/context.h"
#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/log.h"
#include "core/nn/layers.h"
#include "core/tensor/ops.h"
#include "data/builtin.h"
#include "data/loader.h"
#include "models/models.h"
#include "optim/optim.h"
#include "io/atomic_file.h"
#include "tower/tower.h"
#include "train/train.h"
#include "tests/tower/four_cpu_devices.h"

using namespace towerflow;
using namespace towerflow::tower;
using towerflow::testing::cpus;

namespace {

constexpr int kImage = 8, kChannels = 3, kClasses = 10;

collectives::ProcessGroup& world() { return collectives::world(); }

// Every rank makes the same data from the seed.
struct Data {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
};

Data make_data(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  Data d{std::vector<float>(static_cast<std::size_t>(n) * kImage * kImage * kChannels), std::vector<std::int32_t>(n)};
  for (float& x : d.images) x = g(rng);
  for (auto& y : d.labels) y = static_cast<std::int32_t>(rng() % kClasses);
  return d;
}

// The rows of global batch [offset, offset + B) that this process's towers take (Trainer::shard).
struct Shard {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  HostBatch batch;
};

Shard shard(const Data& d, int offset, int B, const Trainer& trainer) {
  const std::size_t row = kImage * kImage * kChannels;
  Shard s;
  for (auto [b, e] : trainer.shard(B))
    for (int r = b; r < e; ++r) {
      const std::size_t g = static_cast<std::size_t>(offset + r);
      s.images.insert(s.images.end(), d.images.begin() + static_cast<std::ptrdiff_t>(g * row),
                      d.images.begin() + static_cast<std::ptrdiff_t>((g + 1) * row));
      s.labels.push_back(d.labels[g]);
    }
  s.batch = {.images = s.images, .labels = s.labels, .n = static_cast<int>(s.labels.size()),
             .h = kImage, .w = kImage, .c = kChannels, .global_n = B};
  return s;
}

// A small model without batch statistics, or with a batch norm: conv -> [bn] -> relu -> pool -> fc.
class Net : public nn::Module {
 public:
  Net(const Device& d, bool bn) : Module(d) {
    nn::InitRng rng(11);
    conv_ = register_module("conv", std::make_shared<nn::Conv2d>(
                                        d, nn::Conv2dSpec{.in_channels = kChannels, .out_channels = 8, .padding = 1}, rng));
    if (bn) bn_ = register_module("bn", std::make_shared<nn::BatchNorm2d>(d, 8));
    fc_ = register_module("fc", std::make_shared<nn::Linear>(d, 8, kClasses, rng));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = conv_->forward(x);
    h = bn_ ? bn_->forward_relu(h) : relu(h);
    return fc_->forward(global_avg_pool(h));
  }

 private:
  std::shared_ptr<nn::Conv2d> conv_;
  std::shared_ptr<nn::BatchNorm2d> bn_;
  std::shared_ptr<nn::Linear> fc_;
};

nn::ModelFactory net(bool bn) {
  return [bn](const Device& d) { return std::make_shared<Net>(d, bn); };
}

struct Trained {
  std::vector<float> params, buffers;
  std::vector<float> losses;
};

std::vector<float> all_buffers(nn::Module& m) {
  std::vector<float> out;
  for (auto& [name, t] : m.named_buffers()) {
    const auto v = t.to_host();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// K steps of SGD with momentum over consecutive global batches of B rows, with `local` devices
// in each process of `processes`.
Trained train_towers(nn::ModelFactory factory, int local, TrainerOptions options, collectives::ProcessGroup& processes,
              const Data& data, int B, int K) {
  options.processes = &processes;
  Trainer trainer(factory, cpus(local), options);
  optim::Sgd sgd(trainer.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
  Trained out;
  for (int s = 0; s < K; ++s) {
    const Shard sh = shard(data, s * B, B, trainer);
    const float loss = trainer.forward_backward(sh.batch);
    REQUIRE(std::isfinite(loss));
    CHECK(trainer.last_step().rows == B);
    out.losses.push_back(loss);
    sgd.step();
  }
  out.params = trainer.model().flat_parameters().to_host();
  out.buffers = all_buffers(trainer.model());
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 0, err = 0;
  for (float x : b) scale = std::max(scale, std::abs(double(x)));
  for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(double(a[i]) - b[i]));
  return scale > 0 ? err / scale : err;
}

// The parameters are the same on every rank, bit for bit.
void require_same_on_every_rank(const std::vector<float>& v) {
  std::string bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  const auto all = world().all_gather(bytes);
  for (std::size_t r = 1; r < all.size(); ++r) REQUIRE(all[r] == all[0]);
}

struct Case {
  const char* name;
  nn::ModelFactory factory;
  int local;                // devices per process
  TrainerOptions options;
  int reference_towers;     // towers of the one-process run it must equal
  TrainerOptions reference; // its options
  double tolerance;
};

void run_cases(const std::vector<Case>& cases, int B, int K, unsigned seed) {
  const Data data = make_data(B * K, seed);
  auto one = collectives::make_single_process_group();
  for (const Case& c : cases) {
    const Trained multi = train_towers(c.factory, c.local, c.options, world(), data, B, K);
    const Trained ref = train_towers(c.factory, c.reference_towers, c.reference, *one, data, B, K);
    require_same_on_every_rank(multi.params);
    const double e_p = max_rel_diff(multi.params, ref.params);
    const double e_b = multi.buffers.empty() ? 0.0 : max_rel_diff(multi.buffers, ref.buffers);
    INFO(c.name << " (rank " << world().rank() << "): max relative difference, parameters " << e_p
                << ", running statistics " << e_b);
    CHECK(e_p < c.tolerance);
    CHECK(e_b < c.tolerance);
    for (int s = 0; s < K; ++s) CHECK(multi.losses[s] == Approx(ref.losses[s]).epsilon(1e-5));
  }
}

bool need_world(int size) {
  if (world().size() == size) return true;
  WARN("this case needs mpirun -np " << size << "; the world has " << world().size() << " process(es)");
  return false;
}

}  // namespace

TEST_CASE("2 processes x 1 device train as 1 process x 2 devices and as 1 device", "[np2]") {
  if (!need_world(2)) return;
  const TrainerOptions none{};
  const std::vector<Case> cases = {
      {"2x1 all-reduce = 1x2", net(false), 1, {}, 2, {}, 2e-5},
      {"2x1 all-reduce = 1x1", net(false), 1, {}, 1, {}, 2e-5},
      {"2x1 bucketed = 1x2", net(false), 1, {.reduction = AllReduce{.bucket_bytes = 256}}, 2, none, 2e-5},
      {"2x1 parameter device = 1x2", net(false), 1, {.reduction = ParameterDevice{}}, 2, none, 2e-5},
      {"2x1 3:1 = 1x2 3:1", net(false), 1, {.split = WeightedSplit{{3, 1}}}, 2, {.split = WeightedSplit{{3, 1}}}, 2e-5},
      {"2x1 3 micro-batches = 1x2 3 micro-batches", net(false), 1, {.accumulation_steps = 3}, 2,
       {.accumulation_steps = 3}, 2e-5},
      {"2x1 per-tower batch norm = 1x2 per-tower", net(true), 1, {}, 2, {}, 2e-5},
      {"2x1 synchronised batch norm = 1x1", net(true), 1, {.batch_norm = BatchNormMode::Synchronised}, 1, {}, 2e-5},
      {"2x2 all-reduce (4 towers) = 1x4", net(false), 2, {}, 4, {}, 2e-5},
      {"2x2 1:1:2:2, 2 micro-batches = 1x4", net(false), 2,
       {.split = WeightedSplit{{1, 1, 2, 2}}, .accumulation_steps = 2}, 4,
       {.split = WeightedSplit{{1, 1, 2, 2}}, .accumulation_steps = 2}, 2e-5},
      {"2x2 synchronised batch norm, bucketed = 1x1", net(true), 2,
       {.reduction = AllReduce{.bucket_bytes = 256}, .batch_norm = BatchNormMode::Synchronised}, 1, {}, 2e-5},
  };
  run_cases(cases, 24, 3, 5);
}

TEST_CASE("ResNet-20 with synchronised batch norm over 2 processes trains as one tower", "[np2]") {
  if (!need_world(2)) return;
  auto resnet = models::factory("resnet20", {.num_classes = kClasses, .seed = 5});
  // The single-process synchronised batch-norm test's set-up and tolerance.
  run_cases({{"ResNet-20 2x1 sync = 1x1", resnet, 1, {.batch_norm = BatchNormMode::Synchronised}, 1, {}, 2e-5},
             {"ResNet-20 2x1 per tower = 1x2 per tower", resnet, 1, {}, 2, {}, 2e-5}},
            16, 3, 31);
}

TEST_CASE("bf16 across 2 processes trains as bf16 towers of one process", "[np2][bf16]") {
  if (!need_world(2)) return;
  // The gradients cross processes in fp32 (docs/precision.md), so the bf16 products of each
  // tower's rows are the one-process towers' and only the order of fp32 sums differs: the
  // tolerance of the one-process bf16 tower test (tests/tower/test_trainer.cc).
  const TrainerOptions bf16{.precision = Precision::Bf16};
  const std::vector<Case> cases = {
      {"bf16 2x1 all-reduce = 1x2", net(false), 1, bf16, 2, bf16, 2e-5},
      {"bf16 2x1 bucketed = 1x1", net(false), 1, {.reduction = AllReduce{.bucket_bytes = 256}, .precision = Precision::Bf16},
       1, bf16, 2e-5},
      {"bf16 2x1 parameter device, 3 micro-batches = 1x2", net(false), 1,
       {.reduction = ParameterDevice{}, .accumulation_steps = 3, .precision = Precision::Bf16}, 2,
       {.accumulation_steps = 3, .precision = Precision::Bf16}, 2e-5},
      {"bf16 2x1 synchronised batch norm = 1x1", net(true), 1,
       {.batch_norm = BatchNormMode::Synchronised, .precision = Precision::Bf16}, 1, bf16, 2e-5},
  };
  run_cases(cases, 24, 3, 13);
  // And bf16 is not fp32: the same 2-process run in fp32 differs (the comparison can fail).
  const Data data = make_data(24 * 3, 13);
  const Trained b = train_towers(net(false), 1, bf16, world(), data, 24, 3);
  const Trained f = train_towers(net(false), 1, {}, world(), data, 24, 3);
  CHECK(max_rel_diff(b.params, f.params) > 1e-4);
}

TEST_CASE("3 processes with a weighted split train as 3 towers of one process", "[np3]") {
  if (!need_world(3)) return;
  run_cases({{"3x1 2:1:1 = 1x3 2:1:1", net(false), 1, {.split = WeightedSplit{{2, 1, 1}}}, 3,
              {.split = WeightedSplit{{2, 1, 1}}}, 2e-5},
             {"3x1 2:1:1 = 1x1", net(false), 1, {.split = WeightedSplit{{2, 1, 1}}}, 1, {}, 2e-5}},
            24, 3, 9);
  // 26 rows: 9, 9 and 8.
  run_cases({{"3x1 even, spread remainder, sync batch norm = 1x1", net(true), 1,
              {.remainder = Remainder::Spread, .batch_norm = BatchNormMode::Synchronised}, 1, {}, 2e-5}},
            26, 3, 9);
}

TEST_CASE("the comparison can fail: per-tower batch norm over 2 processes is not one tower", "[np2]") {
  if (!need_world(2)) return;
  const Data data = make_data(48, 5);
  auto one = collectives::make_single_process_group();
  const Trained multi = train_towers(net(true), 1, {}, world(), data, 16, 3);
  const Trained ref = train_towers(net(true), 1, {}, *one, data, 16, 3);
  CHECK(max_rel_diff(multi.params, ref.params) > 2e-4);  // 10x the equivalence tolerance
}

TEST_CASE("replicas start from rank 0's parameters whatever each process's factory does", "[np2]") {
  if (!need_world(2)) return;
  const int rank = world().rank();
  auto factory = [rank](const Device& d) {
    return models::factory("tfcnn", {.num_classes = kClasses, .seed = static_cast<std::uint64_t>(100 + rank)})(d);
  };
  Trainer trainer(factory, cpus(1), {.processes = &world()});
  require_same_on_every_rank(trainer.model().flat_parameters().to_host());
  const auto rank0 = models::factory("tfcnn", {.num_classes = kClasses, .seed = 100})(Device::cpu(0));
  CHECK(trainer.model().flat_parameters().to_host() == rank0->flat_parameters().to_host());
}

TEST_CASE("evaluation across processes sums every process's rows, none on some", "[np2]") {
  if (!need_world(2)) return;
  const Data data = make_data(11, 3);
  auto one = collectives::make_single_process_group();
  Trainer multi(net(true), cpus(1), {.processes = &world()});
  Trainer ref(net(true), cpus(1), {.processes = one.get()});
  const std::size_t row = kImage * kImage * kChannels;
  const HostBatch all{.images = data.images, .labels = data.labels, .n = 11, .h = kImage, .w = kImage, .c = kChannels};
  // Rank 0 evaluates all 11 rows, rank 1 none.
  HostBatch mine = all;
  if (world().rank() == 1) mine = {.images = std::span<const float>(data.images).subspan(0, 0),
                                   .labels = std::span<const std::int32_t>(data.labels).subspan(0, 0),
                                   .n = 0, .h = kImage, .w = kImage, .c = kChannels};
  const EvalResult a = multi.evaluate(mine), b = ref.evaluate(all);
  CHECK(a.rows == 11);
  CHECK(a.correct == b.correct);
  CHECK(a.loss == Approx(b.loss).epsilon(1e-6));
  // 7 and 4 rows.
  const int begin = world().rank() == 0 ? 0 : 7, n = world().rank() == 0 ? 7 : 4;
  const HostBatch part{.images = std::span<const float>(data.images).subspan(begin * row, n * row),
                       .labels = std::span<const std::int32_t>(data.labels).subspan(begin, n),
                       .n = n, .h = kImage, .w = kImage, .c = kChannels};
  const EvalResult c = multi.evaluate(part);
  CHECK(c.rows == 11);
  CHECK(c.loss == Approx(b.loss).epsilon(1e-5));
}

TEST_CASE("a loader sharded by the trainer gives each process its towers' rows of the same batches", "[np2]") {
  if (!need_world(2)) return;
  data::Builtin set(data::Split::Train, {.train_size = 100, .test_size = 10});
  auto one = collectives::make_single_process_group();
  Trainer trainer(net(false), cpus(1), {.split = WeightedSplit{{3, 1}}, .processes = &world()});
  data::Loader loader(set, {.batch = 16, .seed = 4, .rank = world().rank(), .world_size = 2,
                            .shard = [&](int n, std::int64_t, std::int64_t step) { return trainer.shard(n, step + 1); },
                            .threads = 0});
  data::Loader whole(set, {.batch = 16, .seed = 4, .threads = 0});
  loader.start();
  whole.start();
  for (int step = 0; step < 3; ++step) {
    const data::Batch* mine = loader.next();
    const data::Batch* all = whole.next();
    REQUIRE(mine != nullptr);
    REQUIRE(all != nullptr);
    CHECK(mine->global_n == 16);
    CHECK(mine->n == (world().rank() == 0 ? 12 : 4));
    std::vector<std::int64_t> expect(all->indices.begin() + (world().rank() == 0 ? 0 : 12),
                                     all->indices.begin() + (world().rank() == 0 ? 12 : 16));
    CHECK(std::vector<std::int64_t>(mine->indices.begin(), mine->indices.begin() + mine->n) == expect);
  }
}

TEST_CASE("a set-up that differs between ranks is refused on every rank, naming both", "[np2]") {
  if (!need_world(2)) return;
  const TrainerOptions options{.split = world().rank() == 0 ? SplitPolicy{EvenSplit{}} : SplitPolicy{WeightedSplit{{1, 3}}},
                               .processes = &world()};
  REQUIRE_THROWS_WITH((Trainer(net(false), cpus(1), options)),
                      Catch::Contains("the ranks disagree on the trainer's set-up") &&
                          Catch::Contains("split even") && Catch::Contains("rank 1 has") &&
                          Catch::Contains("split weights:1,3"));
  REQUIRE_THROWS_WITH((Trainer(net(world().rank() == 1), cpus(1), {.processes = &world()})),
                      Catch::Contains("the ranks disagree") && Catch::Contains("parameters"));
  REQUIRE_THROWS_WITH((Trainer(net(false), cpus(world().rank() + 1), {.processes = &world()})),
                      Catch::Contains("1 devices") && Catch::Contains("2 devices"));
  // fp16's loss scaling decides every step's skip on each rank alone, so its rules must agree.
  const TrainerOptions fp16{.precision = Precision::Fp16,
                            .loss_scale = {.growth_interval = world().rank() == 0 ? 2000 : 100},
                            .processes = &world()};
  REQUIRE_THROWS_WITH((Trainer(net(false), cpus(1), fp16)),
                      Catch::Contains("the ranks disagree") && Catch::Contains("every 2000 good steps") &&
                          Catch::Contains("every 100 good steps"));
}

// These break the job's process group (as a real failure does), so each runs in its own mpirun;
// tests/tower/run_mpi_case.sh expects every rank to pass and mpirun to report the abnormal end.
TEST_CASE("a rank that fails is named, with its error, by every other rank's next collective", "[np2-failure]") {
  if (!need_world(2)) return;
  const auto t0 = std::chrono::steady_clock::now();
  if (world().rank() == 1) {
    world().announce_failure("out of memory on /cpu:0 (injected)");
  } else {
    std::vector<float> grads(1000, 1.0f);
    REQUIRE_THROWS_AS(world().all_reduce_sum(std::span<float>(grads)), collectives::PeerFailed);
    REQUIRE_THROWS_WITH(world().barrier(), Catch::Contains("rank 1 failed: out of memory on /cpu:0 (injected)"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("a rank that does not come is reported after the timeout, not waited for", "[np2-timeout]") {
  if (!need_world(2)) return;
  world().set_timeout(std::chrono::milliseconds(1500));
  const auto t0 = std::chrono::steady_clock::now();
  if (world().rank() == 1) {  // hangs for 3 s, far beyond the timeout
    std::this_thread::sleep_for(std::chrono::seconds(3));
    SUCCEED("rank 1 stayed away from the barrier for 3 s");
    return;
  }
  REQUIRE_THROWS_WITH(world().barrier(), Catch::Contains("did not complete within 1.5 s on rank 0"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  // Stay until rank 1 is done: leaving a broken job ends it, and rank 1 with it.
  std::this_thread::sleep_for(std::chrono::seconds(4));
}

TEST_CASE("a collective that waits names the ranks waiting in it and the rank that has not arrived", "[np3]") {
  if (!need_world(3)) return;
  world().set_stall_warning(std::chrono::milliseconds(400));
  world().barrier();  // every rank starts here
  if (world().rank() == 2) {  // stays away for 2.5 s: the others report it, then it comes
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    world().barrier();
    world().set_stall_warning(std::chrono::milliseconds(5000));
    SUCCEED("rank 2 came to the barrier 2.5 s late");
    return;
  }
  std::vector<std::string> warnings;
  std::mutex mu;
  const LogSink previous = set_log_sink([&](LogLevel level, std::string_view text) {
    std::lock_guard lock(mu);
    if (level == LogLevel::Warning) warnings.emplace_back(text);
  });
  const auto t0 = std::chrono::steady_clock::now();
  {
    const collectives::ContextScope at_step({.step = 12, .purpose = "gradient bucket", .index = 3});
    world().barrier();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  set_log_sink(previous);
  world().set_stall_warning(std::chrono::milliseconds(5000));
  CHECK(waited > 2.0);
  // At 0.4 s, 0.8 s and 1.6 s: the first within the warning threshold of its start.
  REQUIRE(warnings.size() >= 2);
  const int other = 1 - world().rank();
  for (const auto& w : warnings) {
    INFO(w);
    CHECK_THAT(w, Catch::StartsWith(str("stall: rank ", world().rank(), " has waited ")) &&
                      Catch::Contains(" in barrier #") && Catch::Contains("of the world at step 12, gradient bucket 3;") &&
                      Catch::Contains("not arrived: 2"));
  }
  // Both waiting ranks' notes have crossed by the second report.
  CHECK_THAT(warnings[1], Catch::Contains(str("waiting in it too: ", other)));
  // The recent collectives: the barrier, done, after its wait.
  const auto recent = nlohmann::json::parse(world().recent_collectives());
  REQUIRE(recent.is_array());
  REQUIRE_FALSE(recent.empty());
  const auto& last = recent.back();
  CHECK(last["op"] == "barrier");
  CHECK(last["step"] == 12);
  CHECK(last["purpose"] == "gradient bucket 3");
  CHECK(last["group"] == 0);
  CHECK(last["done"] == true);
  CHECK(last["waited_s"].get<double>() > 2.0);
  CHECK(last["seq"].get<std::int64_t>() == recent[recent.size() - 2]["seq"].get<std::int64_t>() + 1);
}

TEST_CASE("a run across processes that fails leaves each rank's last collectives in its train dir", "[np2-record]") {
  if (!need_world(2)) return;
  // One train dir for the job, named by rank 0.
  std::string dir;
  if (world().rank() == 0) {
    char name[] = "/tmp/towerflow-collectives-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    dir = name;
  }
  dir = world().broadcast(dir, 0);
  data::Builtin train_set{data::Split::Train, {.train_size = 64, .test_size = 16}};
  Trainer trainer(net(false), cpus(1), {});
  optim::Sgd sgd(trainer.parameters(), {.lr = 0.01});
  towerflow::train::LambdaHook fail;
  fail.step = [&](const towerflow::train::StepInfo& s) {
    if (world().rank() == 1 && s.step == 2) throw std::runtime_error("a hook failed (injected)");
  };
  const towerflow::train::FitOptions options{.batch = 16, .loader_threads = 0, .max_steps = 6, .train_dir = dir, .save_every = 100};
  CHECK_THROWS(towerflow::train::fit(trainer, sgd, train_set, nullptr, options, {&fail}));
  const std::filesystem::path file = std::filesystem::path(dir) / str("collectives.rank", world().rank(), ".json");
  REQUIRE(std::filesystem::exists(file));
  const auto record = nlohmann::json::parse(io::read_file(file));
  const auto& recent = record["processes"];
  REQUIRE(recent.is_array());
  REQUIRE_FALSE(recent.empty());
  // The gradients' all-reduce of the steps done, in order, with their steps.
  bool reduced = false;
  for (std::size_t i = 0; i < recent.size(); ++i) {
    if (recent[i]["op"] == "all-reduce" && recent[i].value("purpose", "") == "gradients" && recent[i].value("step", 0) == 2)
      reduced = true;
    if (i > 0 && recent[i]["group"] == recent[i - 1]["group"])
      CHECK(recent[i]["seq"].get<std::int64_t>() > recent[i - 1]["seq"].get<std::int64_t>());
  }
  CHECK(reduced);
  // This process's one tower: its part of the same steps.
  REQUIRE(record["towers"].size() == 1);
  CHECK(record["towers"][0]["device"] == "/cpu:0");
  CHECK(record["towers"][0]["recent"].back()["done"] == true);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // both ranks have read their files
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

namespace {
// Net, whose forward sleeps 300 us per row in the process that sets g_slow (a slow rank).
std::atomic<bool> g_slow{false};
class SlowNet : public Net {
 public:
  using Net::Net;
  Tensor forward(const Tensor& x) override {
    if (g_slow) std::this_thread::sleep_for(std::chrono::microseconds(300 * x.shape()[0]));
    return Net::forward(x);
  }
};
nn::ModelFactory slow_net() {
  return [](const Device& d) { return std::make_shared<SlowNet>(d, false); };
}
}  // namespace

TEST_CASE("an auto split across processes gives the slow rank fewer rows, every rank agreeing, and ends "
          "with the parameters of one process replaying its splits", "[np2]") {
  if (!need_world(2)) return;
  data::Builtin set(data::Split::Train, {.train_size = 512, .test_size = 16});
  constexpr int kSteps = 14;
  g_slow = world().rank() == 1;
  Trainer trainer(slow_net(), cpus(1), {.split = AutoSplit{}, .processes = &world()});
  optim::Sgd sgd(trainer.parameters(), {.lr = 0.05, .momentum = 0.9});
  std::vector<std::vector<int>> splits;
  towerflow::train::LambdaHook record;
  record.step = [&](const towerflow::train::StepInfo&) { splits.push_back(trainer.last_step().global_split); };
  // Two loader threads: a new split applies 5 steps after the step that measured it.
  towerflow::train::fit(trainer, sgd, set, nullptr, {.batch = 32, .loader_threads = 2, .max_steps = kSteps}, {&record});
  g_slow = false;
  REQUIRE(splits.size() == kSteps);
  // Every rank ran the same splits: even until the first measured step's split applies (step 7).
  const std::string mine = nlohmann::json(splits).dump();
  for (const std::string& other : world().all_gather(mine)) CHECK(other == mine);
  for (int s = 0; s < 6; ++s) CHECK(splits[s] == std::vector<int>{16, 16});
  INFO(mine);
  CHECK(splits.back()[1] < 16);  // the slow rank's tower: fewer rows
  CHECK(splits.back()[1] >= 1);

  // One process with two towers, told each step's split: the same model.
  auto one = collectives::make_single_process_group();
  Trainer replay(slow_net(), cpus(2), {.split = AutoSplit{}, .processes = one.get()});
  optim::Sgd sgd1(replay.parameters(), {.lr = 0.05, .momentum = 0.9});
  std::vector<std::vector<int>> replayed;
  towerflow::train::LambdaHook force;
  force.step = [&](const towerflow::train::StepInfo& s) {
    replayed.push_back(replay.last_step().global_split);
    if (s.step < kSteps) {
      const std::vector<int>& next = splits[static_cast<std::size_t>(s.step)];
      replay.set_split_shares({next[0] / 32.0, next[1] / 32.0}, s.step + 1);
    }
  };
  towerflow::train::fit(replay, sgd1, set, nullptr, {.batch = 32, .loader_threads = 0, .max_steps = kSteps}, {&force});
  CHECK(replayed == splits);
  const auto a = trainer.model().flat_parameters().to_host(), b = replay.model().flat_parameters().to_host();
  REQUIRE(a.size() == b.size());
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  CHECK(err / scale < 1e-5);
}
