#pragma once
// FakeNccl: a test double of NCCL's semantics, not a communicator. It implements NcclBackend
// (core/collectives/nccl_ranks.h) with host memory and the callers' threads, so that NcclRanks,
// the NCCL communicator's real logic, runs on any machine. What it models, from NCCL's
// documentation and source:
// - Runtime connect: the first collective on each rank of a fresh communicator blocks inside the
//   launch call until every rank (plus `absent_peers` that never come, standing for ranks of
//   another process that died) has entered its first collective, as NCCL >= 2.22 connects its
//   channels inside the first collective. Only ncclCommAbort of that rank releases it.
// - A collective completes once every rank has enqueued it (the kernel waits for its peers);
//   ranks' collectives are matched by their order on each rank. The sum is taken in rank order.
// - set_async_error(rank, text): ncclCommGetAsyncError reports it on that rank from then on, and
//   no collective completes any more (an asynchronous error stops progress).
// - never_complete: collectives are enqueued but never complete (a kernel spinning until abort).
// - ncclCommAbort(rank) from any thread, also while a call on that rank is in flight, releases
//   that call; the double counts every later call on an aborted rank (a use of a freed
//   communicator) in calls_after_abort().
// Every call is logged per rank ("launch", "record", "query", "async", "abort"), so a test can
// see the order in which the logic drove a rank.

#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/collectives/nccl_ranks.h"

namespace towerflow::collectives::testing {

// The state of one fake NCCL clique, shared by the test and the FakeNccl that NcclRanks owns.
class FakeNcclWorld {
 public:
  explicit FakeNcclWorld(int ranks) : n_(ranks), rank_(ranks) {}

  // Test controls.
  void set_absent_peers(int k) {
    std::lock_guard l(mu_);
    absent_peers_ = k;
  }
  void set_never_complete(bool v) {
    std::lock_guard l(mu_);
    never_complete_ = v;
  }
  void set_async_error(int rank, std::string text) {
    std::lock_guard l(mu_);
    rank_[rank].async_error = std::move(text);
  }
  void clear_faults() {
    std::lock_guard l(mu_);
    absent_peers_ = 0;
    never_complete_ = false;
    for (auto& r : rank_) r.async_error.clear();
  }

  // Observations.
  template <typename F>
  auto locked(F f) const {
    std::lock_guard l(mu_);
    return f();
  }
  int inits() const { return locked([&] { return inits_; }); }
  int calls_after_abort() const { return locked([&] { return calls_after_abort_; }); }
  bool aborted(int rank) const { return locked([&] { return rank_[rank].aborted; }); }
  std::vector<std::string> log(int rank) const { return locked([&] { return rank_[rank].log; }); }
  int blocked_in_first_launch() const { return locked([&] { return blocked_in_connect_; }); }

  // NcclBackend's calls (FakeNccl forwards here).
  NcclState init(int total_ranks) {
    std::lock_guard l(mu_);
    ++inits_;
    for (auto& r : rank_) {
      r.aborted = r.connected = r.entered_first = false;
      r.enqueued = r.mark = 0;
      r.init_polls = 2;  // creation reports ncclInProgress twice, then ncclSuccess
      r.log.clear();
    }
    ops_.clear();
    completed_ = 0;
    return total_ranks == n_ ? NcclState::in_progress()
                             : NcclState::failed("the fake models one process: total ranks must be local ranks");
  }

  struct Op {
    enum Kind { kSum, kBroadcast, kGather } kind = kSum;
    int root = 0;
    std::vector<float*> out;
    std::vector<const float*> in;
    std::size_t count = 0;
    int arrived = 0;
  };

  NcclState launch(int p, Op::Kind kind, const float* in, float* out, std::size_t count, int root) {
    std::unique_lock l(mu_);
    Rank& r = rank_[p];
    if (!usable(p, "launch")) return NcclState::failed("invalid usage: the communicator was aborted");
    if (!r.connected) {
      // Runtime connect: wait inside the call for every peer's first collective.
      r.entered_first = true;
      ++blocked_in_connect_;
      cv_.notify_all();
      cv_.wait(l, [&] { return r.aborted || all_entered_first(); });
      --blocked_in_connect_;
      if (r.aborted) return NcclState::failed("the communicator was aborted while connecting");
      r.connected = true;
    }
    const int k = r.enqueued++;
    Op& op = ops_[k];
    if (op.out.empty()) {
      op.out.assign(n_, nullptr);
      op.in.assign(n_, nullptr);
      op.kind = kind;
      op.root = root;
      op.count = count;
    }
    op.out[p] = out;
    op.in[p] = in;
    if (++op.arrived == n_) progress();
    return NcclState::success();
  }

  NcclState record(int p) {
    std::lock_guard l(mu_);
    if (!usable(p, "record")) return NcclState::failed("invalid usage: the communicator was aborted");
    rank_[p].mark = rank_[p].enqueued;
    return NcclState::success();
  }
  NcclState query(int p) {
    std::lock_guard l(mu_);
    if (!usable(p, "query")) return NcclState::failed("invalid usage: the communicator was aborted");
    return completed_ >= rank_[p].mark ? NcclState::success() : NcclState::in_progress();
  }
  NcclState async_error(int p) {
    std::lock_guard l(mu_);
    if (!usable(p, "async")) return NcclState::failed("invalid usage: the communicator was aborted");
    Rank& r = rank_[p];
    if (!r.async_error.empty()) return NcclState::failed(r.async_error);
    if (r.init_polls > 0) return --r.init_polls, NcclState::in_progress();
    return NcclState::success();
  }
  void abort(int p) {
    std::lock_guard l(mu_);
    rank_[p].log.push_back("abort");
    rank_[p].aborted = true;
    cv_.notify_all();
  }
  NcclState finalize(int p) {
    std::lock_guard l(mu_);
    if (!usable(p, "finalize")) return NcclState::failed("invalid usage: the communicator was aborted");
    return NcclState::success();
  }

 private:
  struct Rank {
    bool aborted = false, connected = false, entered_first = false;
    int enqueued = 0, mark = 0, init_polls = 0;
    std::string async_error;
    std::vector<std::string> log;
  };

  bool usable(int p, const char* call) {
    rank_[p].log.push_back(call);
    if (!rank_[p].aborted) return true;
    ++calls_after_abort_;
    return false;
  }
  bool all_entered_first() const {
    if (absent_peers_ > 0) return false;
    for (const Rank& r : rank_)
      if (!r.entered_first) return false;
    return true;
  }
  // Runs every fully enqueued collective, in order, unless the clique is stalled.
  void progress() {
    if (never_complete_) return;
    for (const Rank& r : rank_)
      if (!r.async_error.empty()) return;
    for (auto it = ops_.find(completed_); it != ops_.end() && it->second.arrived == n_;
         it = ops_.find(completed_)) {
      Op& op = it->second;
      if (op.kind == Op::kSum) {
        std::vector<float> sum(op.count, 0.0f);
        for (int p = 0; p < n_; ++p)
          for (std::size_t i = 0; i < op.count; ++i) sum[i] += op.in[p][i];
        for (int p = 0; p < n_; ++p) std::memcpy(op.out[p], sum.data(), op.count * sizeof(float));
      } else if (op.kind == Op::kBroadcast) {
        std::vector<float> v(op.in[op.root], op.in[op.root] + op.count);
        for (int p = 0; p < n_; ++p) std::memcpy(op.out[p], v.data(), op.count * sizeof(float));
      } else {
        for (int p = 0; p < n_; ++p)
          for (int q = 0; q < n_; ++q) std::memcpy(op.out[p] + q * op.count, op.in[q], op.count * sizeof(float));
      }
      ops_.erase(it);
      ++completed_;
    }
  }

  const int n_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Rank> rank_;
  std::map<int, Op> ops_;  // by position in every rank's sequence
  int completed_ = 0;
  int absent_peers_ = 0;
  bool never_complete_ = false;
  int inits_ = 0;
  int calls_after_abort_ = 0;
  int blocked_in_connect_ = 0;
};

// NcclBackend over a FakeNcclWorld.
class FakeNccl final : public NcclBackend {
 public:
  explicit FakeNccl(std::shared_ptr<FakeNcclWorld> world, int ranks) : world_(std::move(world)), n_(ranks) {}
  int ranks() const override { return n_; }
  std::vector<std::byte> unique_id() override { return std::vector<std::byte>(8, std::byte{42}); }
  NcclState init(std::span<const std::byte>, int total_ranks, int) override { return world_->init(total_ranks); }
  NcclState all_reduce(int p, std::span<float> data, const QueueEvent* ready) override {
    if (ready != nullptr) ready->synchronize();
    return world_->launch(p, FakeNcclWorld::Op::kSum, data.data(), data.data(), data.size(), 0);
  }
  NcclState broadcast(int p, std::span<float> data, int root) override {
    return world_->launch(p, FakeNcclWorld::Op::kBroadcast, data.data(), data.data(), data.size(), root);
  }
  NcclState all_gather(int p, std::span<const float> send, std::span<float> out) override {
    return world_->launch(p, FakeNcclWorld::Op::kGather, send.data(), out.data(), send.size(), 0);
  }
  NcclState barrier(int p) override {
    return world_->launch(p, FakeNcclWorld::Op::kSum, &scratch_in_, &scratch_out_[p % 8], 1, 0);
  }
  NcclState record_done(int p) override { return world_->record(p); }
  NcclState query_done(int p) override { return world_->query(p); }
  NcclState async_error(int p) override { return world_->async_error(p); }
  void abort(int p) override { world_->abort(p); }
  NcclState finalize_all() override {
    for (int p = 0; p < n_; ++p)
      if (NcclState s = world_->finalize(p); !s.ok()) return s;
    return NcclState::in_progress();
  }
  void destroy(int) override {}
  std::string version() const override { return "fake NCCL"; }

 private:
  std::shared_ptr<FakeNcclWorld> world_;
  int n_;
  float scratch_in_ = 1.0f;
  float scratch_out_[8] = {};
};

}  // namespace towerflow::collectives::testing
