#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <map>
#include <set>

#include "core/error.h"
#include "core/memory/allocator.h"
#include "data/builtin.h"
#include "data/loader.h"
#include "tests/data/helpers.h"

using namespace towerflow;
using namespace towerflow::data;
using testing::require_throws_mentioning;

namespace {

// A small dataset whose pixels encode the item index, so any row can be traced to its source.
class Indexed : public Dataset {
 public:
  explicit Indexed(std::int64_t n, std::int64_t fail_at = -1) : n_(n), fail_at_(fail_at) {}
  std::int64_t size() const override { return n_; }
  int num_classes() const override { return 7; }
  const std::vector<std::string>& class_names() const override {
    static const std::vector<std::string> names = {"a", "b", "c", "d", "e", "f", "g"};
    return names;
  }
  ImageShape shape() const override { return {4, 4, 3}; }
  std::int32_t read(std::int64_t i, std::span<std::uint8_t> out) const override {
    if (i == fail_at_) raise<DataError>("item ", i, " is corrupt");
    reads_.fetch_add(1);
    for (std::size_t p = 0; p < 48; ++p) out[p] = static_cast<std::uint8_t>((i * 13 + p) % 256);
    return label(i);
  }
  std::int32_t label(std::int64_t i) const override { return static_cast<std::int32_t>(i % 7); }
  std::string describe() const override { return "indexed"; }
  mutable std::atomic<int> reads_{0};

 private:
  std::int64_t n_, fail_at_;
};

struct Snapshot {
  int n, global_n, global_offset;
  std::int64_t epoch, step;
  std::vector<std::int32_t> labels;
  std::vector<std::int64_t> indices;
  std::vector<float> images;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snap(const Batch& b) {
  return {b.n,          b.global_n, b.global_offset, b.epoch, b.index_in_epoch, b.labels, b.indices,
          std::vector<float>(b.valid_images().begin(), b.valid_images().end())};
}

std::vector<Snapshot> run_epoch(Loader& loader) {
  std::vector<Snapshot> out;
  for (const Batch& b : loader) out.push_back(snap(b));
  return out;
}

}  // namespace

TEST_CASE("Batches are identical for the same seed whatever the number of threads", "[data][loader]") {
  const Builtin data(Split::Train, {.train_size = 300});
  std::vector<std::vector<Snapshot>> runs;
  for (int threads : {0, 1, 2, 5}) {
    Loader loader(data, {.batch = 32, .augment = cifar_augment(8), .seed = 9, .drop_last = false,
                         .threads = threads, .prefetch = 2});
    run_epoch(loader);                // epoch 0
    runs.push_back(run_epoch(loader));  // epoch 1
  }
  REQUIRE(runs[0].size() == 10);
  CHECK(runs[0].back().n == 300 - 9 * 32);
  CHECK(runs[0][0].epoch == 1);
  for (std::size_t r = 1; r < runs.size(); ++r) CHECK(runs[r] == runs[0]);
}

TEST_CASE("Each row is the augmented dataset item it names, with its label", "[data][loader]") {
  const Builtin data(Split::Test, {.test_size = 64});
  const Augment aug = cifar_augment(4);
  Loader loader(data, {.batch = 16, .augment = aug, .seed = 3, .threads = 2});
  loader.set_epoch(4);
  const Augmenter reference(aug, data.shape());
  std::vector<std::uint8_t> raw(3072);
  std::vector<float> expected(3072);
  int rows = 0;
  for (const Batch& b : loader) {
    REQUIRE(b.n == 16);
    CHECK((b.h == 32 && b.w == 32 && b.c == 3));
    for (int j = 0; j < b.n; ++j) {
      const std::int32_t label = data.read(b.indices[j], raw);
      CHECK(b.labels[j] == label);
      reference.apply(raw.data(), expected.data(), 3, 4, b.indices[j]);
      const auto got = b.image(j);
      REQUIRE(std::equal(got.begin(), got.end(), expected.begin()));
      ++rows;
    }
  }
  CHECK(rows == 64);
}

TEST_CASE("Shards of all ranks together cover the epoch exactly once", "[data][loader]") {
  const Indexed data(103);
  for (bool drop_last : {true, false}) {
    for (int world : {1, 2, 3, 4}) {
      const int batch = 12;
      std::map<std::int64_t, int> seen;
      std::vector<std::int64_t> steps;
      std::vector<std::vector<std::int64_t>> global_rows;  // step -> indices in rank order
      for (int rank = 0; rank < world; ++rank) {
        Loader loader(data, {.batch = batch, .seed = 5, .drop_last = drop_last, .rank = rank, .world_size = world,
                             .threads = 1});
        loader.set_epoch(2);
        std::int64_t count = 0;
        for (const Batch& b : loader) {
          if (global_rows.size() <= static_cast<std::size_t>(b.index_in_epoch)) global_rows.resize(b.index_in_epoch + 1);
          auto& row = global_rows[static_cast<std::size_t>(b.index_in_epoch)];
          CHECK(b.global_offset == static_cast<int>(row.size()));  // ranks in order tile the global batch
          row.insert(row.end(), b.indices.begin(), b.indices.end());
          for (auto i : b.indices) ++seen[i];
          ++count;
        }
        steps.push_back(count);
        CHECK(count == loader.steps_per_epoch());
      }
      INFO("world " << world << " drop_last " << drop_last);
      CHECK(std::set<std::int64_t>(steps.begin(), steps.end()).size() == 1);  // ranks step in lockstep
      const std::int64_t covered = drop_last ? 103 / batch * batch : 103;
      CHECK(static_cast<std::int64_t>(seen.size()) == covered);
      for (const auto& [index, times] : seen) REQUIRE(times == 1);
      // The global batches are the same as a single process would make.
      Loader single(data, {.batch = batch, .seed = 5, .drop_last = drop_last, .threads = 0});
      single.set_epoch(2);
      std::size_t s = 0;
      for (const Batch& b : single) CHECK(std::vector<std::int64_t>(b.indices.begin(), b.indices.end()) == global_rows[s++]);
    }
  }
}

TEST_CASE("Epochs are shuffled from the seed: same seed same order, new epoch new order", "[data][loader]") {
  const Indexed data(50);
  auto order = [&](std::uint64_t seed, std::int64_t epoch, bool shuffle = true) {
    Loader loader(data, {.batch = 10, .shuffle = shuffle, .seed = seed, .threads = 1});
    loader.set_epoch(epoch);
    std::vector<std::int64_t> all;
    for (const Batch& b : loader) all.insert(all.end(), b.indices.begin(), b.indices.end());
    return all;
  };
  const auto a = order(1, 0);
  CHECK(a == order(1, 0));
  CHECK(a != order(1, 1));
  CHECK(a != order(2, 0));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == order(1, 0, false));  // a permutation of 0..49
  CHECK(std::is_sorted(sorted.begin(), sorted.end()));
  // Range-for passes advance the epoch.
  Loader loader(data, {.batch = 10, .seed = 1, .threads = 2});
  std::vector<std::int64_t> epochs;
  for (int e = 0; e < 3; ++e)
    for (const Batch& b : loader) epochs.push_back(b.epoch);
  CHECK(epochs == std::vector<std::int64_t>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2});
}

TEST_CASE("An epoch can start at step k, giving the rest of that epoch exactly", "[data][loader]") {
  const Builtin data(Split::Test, {.test_size = 100});
  Loader loader(data, {.batch = 8, .augment = cifar_augment(), .seed = 4, .threads = 2});
  loader.set_epoch(3);
  const auto full = run_epoch(loader);
  REQUIRE(full.size() == 12);
  loader.set_epoch(3, 7);
  const auto tail = run_epoch(loader);
  REQUIRE(tail.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(tail[i] == full[7 + i]);
  CHECK(loader.next_epoch() == 4);
  require_throws_mentioning<InvalidArgument>([&] { loader.set_epoch(0, 13); }, {"start step 13", "12 steps"});
  loader.set_epoch(5, 12);  // resuming right at the end of epoch 5: nothing left of it
  CHECK(run_epoch(loader).empty());
  CHECK(run_epoch(loader).front().epoch == 6);
}

TEST_CASE("Workers prefetch the next epoch while the consumer is between epochs", "[data][loader]") {
  const Indexed data(100);
  Loader loader(data, {.batch = 10, .augment = {}, .seed = 8, .threads = 2, .prefetch = 3});
  const auto epoch0 = run_epoch(loader);
  REQUIRE(epoch0.size() == 10);
  // Without begin(), the workers fill the pool (4 buffers) with epoch 1's first batches.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (data.reads_.load() < 140 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(data.reads_.load() == 140);
  const auto epoch1 = run_epoch(loader);  // continues with them
  // Nothing was made twice: epochs 0 and 1, plus at most 4 batches of epoch 2 by now.
  CHECK(data.reads_.load() >= 200);
  CHECK(data.reads_.load() <= 240);
  // The same batches as a loader that starts at epoch 1 directly.
  Loader fresh(data, {.batch = 10, .augment = {}, .seed = 8, .threads = 1});
  fresh.set_epoch(1);
  CHECK(run_epoch(fresh) == epoch1);
  // Going elsewhere discards the prefetched epoch 2 and still gives the right batches.
  loader.set_epoch(1, 4);
  const auto tail = run_epoch(loader);
  REQUIRE(tail.size() == 6);
  CHECK(tail.front() == epoch1[4]);
}

TEST_CASE("Stopping mid-epoch is clean, and the loader is reusable afterwards", "[data][loader]") {
  const Indexed data(2000);
  for (int round = 0; round < 5; ++round) {
    data.reads_ = 0;
    Loader loader(data, {.batch = 10, .threads = 3, .prefetch = 3});
    int seen = 0;
    for (const Batch& b : loader) {
      (void)b;
      if (++seen == 3 + round) break;  // leave with workers mid-batch
    }
    // The workers stopped at the prefetch bound: at most 3 batches beyond the one held.
    CHECK(data.reads_.load() <= (seen + 3) * 10);
    const auto again = run_epoch(loader);  // a fresh pass after an abandoned one
    CHECK(again.size() == 200);
    CHECK(again.front().epoch == 1);
    loader.start();  // destroyed with a pass running
  }
}

TEST_CASE("A worker's error reaches the consumer at the failing batch", "[data][loader]") {
  const Indexed data(40, /*fail_at=*/17);
  for (int threads : {0, 2}) {
    Loader loader(data, {.batch = 8, .shuffle = false, .threads = threads});
    int good = 0;
    require_throws_mentioning<DataError>(
        [&] {
          for (const Batch& b : loader) {
            (void)b;
            ++good;
          }
        },
        {"item 17 is corrupt"});
    CHECK(good == 2);  // batches 0 and 1 came through; batch 2 holds item 17
    // The loader survives the error: a later pass from step 3 runs normally.
    loader.set_epoch(0, 3);
    CHECK(run_epoch(loader).size() == 2);
  }
}

TEST_CASE("Batch buffers come from the given allocator, once, and are recycled", "[data][loader]") {
  const Indexed data(64);
  std::atomic<int> allocations{0}, frees{0};
  HostAllocator counting{
      .allocate = [&](std::size_t bytes) { ++allocations; return aligned_host_allocator().allocate(bytes); },
      .deallocate = [&](void* p, std::size_t bytes) { ++frees; aligned_host_allocator().deallocate(p, bytes); },
      .name = "counting"};
  {
    Loader loader(data, {.batch = 4, .threads = 2, .prefetch = 3, .allocator = counting});
    CHECK(allocations == 4);  // max(prefetch, threads) + 1
    for (int e = 0; e < 3; ++e)
      for (const Batch& b : loader) CHECK(b.images.allocator_name() == "counting");
    CHECK(allocations == 4);
  }
  CHECK(frees == 4);
}

TEST_CASE("Keep-last splits the final batch over ranks, a rank may get no rows", "[data][loader]") {
  const Indexed data(13);
  std::vector<int> last_n;
  for (int rank = 0; rank < 4; ++rank) {
    Loader loader(data, {.batch = 8, .drop_last = false, .rank = rank, .world_size = 4, .threads = 0});
    CHECK(loader.steps_per_epoch() == 2);
    CHECK(loader.local_batch() == 2);
    const auto e = run_epoch(loader);
    CHECK(e[0].n == 2);
    CHECK(e[1].global_n == 5);
    last_n.push_back(e[1].n);
  }
  CHECK(last_n == std::vector<int>{1, 1, 1, 2});
  const Indexed three(3);
  Loader tiny(three, {.batch = 8, .drop_last = false, .rank = 0, .world_size = 4, .threads = 0});
  CHECK(run_epoch(tiny).at(0).n == 0);
}

TEST_CASE("Bad loader options are InvalidArguments with a fix", "[data][loader]") {
  const Indexed data(20);
  require_throws_mentioning<InvalidArgument>([&] { Loader(data, {.batch = 10, .world_size = 4}); },
                                             {"global batch 10", "4 ranks", "LoaderOptions::batch = 8 or 12"});
  require_throws_mentioning<InvalidArgument>([&] { Loader(data, {.batch = 8, .rank = 2, .world_size = 2}); },
                                             {"rank 2", "0..1"});
  require_throws_mentioning<InvalidArgument>([&] { Loader(data, {.batch = 32}); },
                                             {"fewer images than one batch of 32", "drop_last = false"});
  require_throws_mentioning<InvalidArgument>([&] { Loader(data, {.batch = 0}); }, {"batch size 0"});
  require_throws_mentioning<InvalidArgument>([&] { Loader(data, {.prefetch = 0}); }, {"prefetch 0"});
  require_throws_mentioning<InvalidArgument>([&] { Loader(data, {.batch = 4, .augment = {.cutout = -2}}); },
                                             {"cutout size -2"});
}

TEST_CASE("Batch buffers can come from a core/memory Allocator or SubAllocator", "[data][loader]") {
  const Builtin data(Split::Test, {.test_size = 40});
  auto reference = [&](const LoaderOptions& o) {
    Loader loader(data, o);
    return run_epoch(loader);
  };
  const LoaderOptions base{.batch = 8, .augment = cifar_augment(), .seed = 2, .threads = 2};
  const auto expected = reference(base);

  auto pool = make_bfc_allocator(make_host_sub_allocator(), {.device_name = "/cpu:0", .limit_bytes = 64 << 20});
  LoaderOptions from_pool = base;
  from_pool.allocator = host_allocator_from(*pool);
  {
    Loader loader(data, from_pool);
    CHECK(pool->stats().live_allocs == 5);  // max(prefetch 4, threads 2) + 1 buffers
    CHECK(run_epoch(loader) == expected);
  }
  CHECK(pool->stats().live_allocs == 0);

  auto sub = make_host_sub_allocator();
  LoaderOptions from_sub = base;
  from_sub.allocator = host_allocator_from(*sub);
  CHECK(reference(from_sub) == expected);
}

TEST_CASE("A shard function picks this rank's rows, in ranges, even more of a partial batch than of a full one",
          "[data][loader]") {
  const Indexed data(20);
  // Rows 0 and 6 of a full batch of 16; all 4 rows of the final partial batch.
  auto shard = [](int n, std::int64_t, std::int64_t) {
    return n == 16 ? std::vector<std::pair<int, int>>{{0, 1}, {6, 7}} : std::vector<std::pair<int, int>>{{0, n}};
  };
  Loader loader(data, {.batch = 16, .shuffle = false, .drop_last = false, .rank = 1, .world_size = 3,
                       .shard = shard, .threads = 0});
  Loader whole(data, {.batch = 16, .shuffle = false, .drop_last = false, .threads = 0});
  const auto mine = run_epoch(loader), all = run_epoch(whole);
  REQUIRE(mine.size() == 2);
  CHECK(mine[0].n == 2);
  CHECK(mine[0].global_n == 16);
  CHECK(mine[0].indices == std::vector<std::int64_t>{all[0].indices[0], all[0].indices[6]});
  CHECK(mine[1].n == 4);  // twice the rows this rank takes of a full batch
  CHECK(mine[1].indices == all[1].indices);
  // The batch need not divide by world_size when a shard function says who takes what (16 / 3).
  // A range outside the batch is refused, naming it.
  Loader bad(data, {.batch = 16, .drop_last = true, .rank = 0, .world_size = 2,
                    .shard = [](int n, std::int64_t, std::int64_t) { return std::vector<std::pair<int, int>>{{n - 1, n + 1}}; }, .threads = 0});
  CHECK_THROWS_WITH(run_epoch(bad), Catch::Contains("rows [15, 17) of a global batch of 16"));
}

TEST_CASE("Mixup and CutMix mix each row with the global batch's previous row, the same on every shard", "[data][loader][mix]") {
  const Builtin data(Split::Test, {.test_size = 64});
  const Augment aug = cifar_augment(4);
  const Augmenter reference(aug, data.shape());
  const ImageShape shape = data.shape();
  for (const MixOptions mix : {MixOptions{.mixup_alpha = 0.4f}, MixOptions{.cutmix_alpha = 1.0f},
                               MixOptions{.mixup_alpha = 0.4f, .cutmix_alpha = 1.0f}}) {
    Loader plain(data, {.batch = 16, .augment = aug, .seed = 3, .threads = 0});
    Loader mixed(data, {.batch = 16, .augment = aug, .mix = mix, .seed = 3, .threads = 2});
    // Rows 5..11 of every global batch, as a rank holding them loads them.
    Loader shard(data, {.batch = 16, .augment = aug, .mix = mix, .seed = 3,
                        .shard = [](int, std::int64_t, std::int64_t) { return std::vector<std::pair<int, int>>{{5, 12}}; }, .threads = 0});
    std::set<MixChoice::Kind> kinds;
    auto p = plain.begin();
    auto s = shard.begin();
    for (const Batch& m : mixed) {
      const Batch& a = *p;
      const MixChoice c = choose_mix(mix, shape, 3, 0, m.index_in_epoch);
      kinds.insert(c.kind);
      REQUIRE(c.kind != MixChoice::Kind::None);
      CHECK(m.mix == c.lambda);
      CHECK((c.lambda > 0 && c.lambda <= 1));
      if (c.kind == MixChoice::Kind::CutMix)
        CHECK(c.lambda == Approx(1.0 - double((c.y1 - c.y0) * (c.x1 - c.x0)) / 1024));
      for (int j = 0; j < 16; ++j) {
        const int partner = (j + 15) % 16;
        CHECK(m.mix_labels[j] == a.labels[partner]);
        CHECK(m.labels[j] == a.labels[j]);
        const auto own = a.image(j), other = a.image(partner), got = m.image(j);
        std::vector<float> expected(own.begin(), own.end());
        if (c.kind == MixChoice::Kind::Mixup) {
          for (std::size_t k = 0; k < expected.size(); ++k) expected[k] = c.lambda * own[k] + (1 - c.lambda) * other[k];
        } else {  // inside the box the partner's pixels, outside its own
          for (int y = c.y0; y < c.y1; ++y)
            for (int x = c.x0; x < c.x1; ++x)
              for (int ch = 0; ch < 3; ++ch) expected[(y * 32 + x) * 3 + ch] = other[(y * 32 + x) * 3 + ch];
        }
        REQUIRE(std::equal(got.begin(), got.end(), expected.begin()));
        if (j >= 5 && j < 12) {
          const auto sg = (*s).image(j - 5);
          CHECK(std::equal(sg.begin(), sg.end(), got.begin()));
          CHECK((*s).mix_labels[j - 5] == m.mix_labels[j]);
        }
      }
      ++p;
      ++s;
    }
    CHECK(kinds.size() == (mix.mixup_alpha > 0 && mix.cutmix_alpha > 0 ? 2u : 1u));
  }
}

TEST_CASE("Mix lambdas follow Beta(alpha, alpha), and a bad alpha is refused", "[data][mix]") {
  // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
  for (float alpha : {0.2f, 1.0f}) {
    double sum = 0, sq = 0;
    const int n = 4000;
    for (int step = 0; step < n; ++step) {
      const double l = choose_mix({.mixup_alpha = alpha}, {32, 32, 3}, 11, 2, step).lambda;
      sum += l;
      sq += l * l;
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    CHECK(mean == Approx(0.5).margin(0.02));
    CHECK(var == Approx(1.0 / (4 * (2 * alpha + 1))).epsilon(0.08));
  }
  CHECK(choose_mix({}, {32, 32, 3}, 1, 0, 0).kind == MixChoice::Kind::None);
  const Builtin data(Split::Test, {.test_size = 16});
  CHECK_THROWS_AS(Loader(data, {.batch = 8, .mix = {.mixup_alpha = -1}}), InvalidArgument);
}

TEST_CASE("A shard function is asked for each step's rows by epoch and step, from every worker thread alike",
          "[data][loader]") {
  const Indexed data(64);
  // Step s of epoch e takes 2 + (e + s) % 3 rows from the front of its global batch of 8.
  auto shard = [](int, std::int64_t epoch, std::int64_t step) {
    return std::vector<std::pair<int, int>>{{0, 2 + static_cast<int>((epoch + step) % 3)}};
  };
  for (int threads : {0, 3}) {
    INFO(threads << " threads");
    Loader loader(data, {.batch = 8, .shuffle = false, .shard = shard, .threads = threads});
    CHECK(loader.lookahead() == (threads == 0 ? 0 : 4));  // max(prefetch 4, 3 threads) + 1 buffers, one in use
    for (std::int64_t epoch : {0, 1}) {
      loader.set_epoch(epoch);
      std::int64_t step = 0;
      for (const Batch& b : loader) {
        CHECK(b.index_in_epoch == step);
        CHECK(b.n == 2 + (epoch + step) % 3);
        ++step;
      }
      CHECK(step == 8);
    }
  }
}
