#include "core/collectives/process_group.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/collectives/process_group_impl.h"
#include "core/error.h"

namespace towerflow::collectives {

namespace {

class SingleProcessGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  void all_reduce_sum(std::span<float>) override {}
  void all_reduce_sum(std::span<double>) override {}
  void all_reduce_max(std::span<std::int64_t>) override {}
  void broadcast(std::span<std::byte>, int root) override { check_root(root); }
  void all_gather(std::span<const std::byte> send, std::span<std::byte> out) override {
    if (out.size() != send.size())
      raise<InvalidArgument>("all_gather over one process: the output has ", out.size(), " bytes for ", send.size());
    std::memcpy(out.data(), send.data(), send.size());
  }
  void barrier() override {}
  std::unique_ptr<ProcessGroup> duplicate() override { return std::make_unique<SingleProcessGroup>(); }
  void announce_failure(const std::string&) override {}
  std::string name() const override { return "one process"; }

 private:
  static void check_root(int root) {
    if (root != 0) raise<InvalidArgument>("broadcast root ", root, " does not exist in a world of one process (rank 0)");
  }
};

std::chrono::milliseconds timeout_from_environment() { return collective_timeout(std::chrono::milliseconds(30'000)); }

// Note [Hierarchical all-reduce]: the towers of a process sum their buffers with the local
// communicator (one pass over shared memory, every tower's thread helping), then only participant
// 0 of each process exchanges the process's sum with the other processes, and a local broadcast
// hands the result to the other towers. Across processes that moves one buffer per process instead
// of one per tower, which is what crosses the slow link; inside, the fused shared-memory
// all-reduce is already the cheapest possible. With one device per process the local steps are
// no-ops and this is a plain MPI all-reduce.
class HierarchicalCommunicator final : public Communicator {
 public:
  HierarchicalCommunicator(std::unique_ptr<Communicator> local, ProcessGroup& processes)
      : local_(std::move(local)), processes_(processes) {
    for (const Device& d : local_->devices())
      if (!d.is_cpu())
        raise<InvalidArgument>("reducing across processes through host memory needs CPU devices; ", d,
                               " is a GPU (GPUs of several processes reduce with NCCL)");
  }

  const std::vector<Device>& devices() const override { return local_->devices(); }

  void all_reduce_sum(int participant, std::span<float> data) override {
    local_->all_reduce_sum(participant, data);
    if (processes_.size() == 1) return;
    if (participant == 0) cross(data);
    local_->broadcast(participant, data, 0);
  }

  void broadcast(int participant, std::span<float> data, int root) override {
    const int l = size();
    if (root < 0 || root >= l * processes_.size())
      raise<InvalidArgument>("broadcast root ", root, " does not exist; participants are 0..", l * processes_.size() - 1);
    local_->broadcast(participant, data, root % l);
    if (processes_.size() == 1) return;
    if (participant == 0) cross([&] { processes_.broadcast(std::as_writable_bytes(data), root / l); });
    local_->broadcast(participant, data, 0);
  }

  void all_gather(int participant, std::span<const float> send, std::span<float> out) override {
    const int l = size(), p = processes_.size();
    if (out.size() != send.size() * static_cast<std::size_t>(l * p))
      raise<InvalidArgument>("all_gather: participant ", participant, " has an output of ", out.size(),
                             " values for ", l * p, " participants of ", send.size());
    const std::size_t block = send.size() * static_cast<std::size_t>(l);
    const std::size_t mine = block * static_cast<std::size_t>(processes_.rank());
    local_->all_gather(participant, send, out.subspan(mine, block));
    if (p == 1) return;
    if (participant == 0)
      cross([&] {
        std::vector<float> block_copy(out.begin() + static_cast<std::ptrdiff_t>(mine),
                                      out.begin() + static_cast<std::ptrdiff_t>(mine + block));
        processes_.all_gather(std::as_bytes(std::span<const float>(block_copy)), std::as_writable_bytes(out));
      });
    local_->broadcast(participant, out, 0);
  }

  void barrier(int participant) override {
    local_->barrier(participant);
    if (processes_.size() == 1) return;
    if (participant == 0) cross([&] { processes_.barrier(); });
    local_->barrier(participant);
  }

  // A failed tower aborts the local exchange; the other processes learn of it from
  // announce_failure when the error leaves this process (train::fit), or from their timeout.
  void abort(const std::string& reason) override { local_->abort(reason); }
  void reset() override { local_->reset(); }

  std::string name() const override {
    if (processes_.size() == 1) return local_->name();
    return str(local_->name(), " in each of ", processes_.size(), " processes, then ", processes_.name());
  }
  std::string recent_collectives() const override { return local_->recent_collectives(); }

 private:
  void cross(std::span<float> data) {
    cross([&] { processes_.all_reduce_sum(data); });
  }
  // Participant 0's part across processes. Should it fail, the other local participants are
  // released (they wait in the broadcast that follows) with the same error.
  template <typename F>
  void cross(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      local_->abort(e.what());
      throw;
    }
  }

  std::unique_ptr<Communicator> local_;
  ProcessGroup& processes_;
};

}  // namespace

std::string ProcessGroup::broadcast(std::string value, int root) {
  std::int64_t n = static_cast<std::int64_t>(value.size());
  broadcast(std::as_writable_bytes(std::span<std::int64_t>(&n, 1)), root);
  value.resize(static_cast<std::size_t>(n));
  broadcast(std::as_writable_bytes(std::span<char>(value.data(), value.size())), root);
  return value;
}

std::vector<std::string> ProcessGroup::all_gather(const std::string& value) {
  const int p = size();
  std::int64_t n = static_cast<std::int64_t>(value.size());
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(p));
  all_gather(std::as_bytes(std::span<const std::int64_t>(&n, 1)), std::as_writable_bytes(std::span<std::int64_t>(lengths)));
  std::int64_t longest = 0;
  for (auto l : lengths) longest = std::max(longest, l);
  std::string padded = value;
  padded.resize(static_cast<std::size_t>(longest), '\0');
  std::string all(static_cast<std::size_t>(longest) * static_cast<std::size_t>(p), '\0');
  all_gather(std::as_bytes(std::span<const char>(padded.data(), padded.size())),
             std::as_writable_bytes(std::span<char>(all.data(), all.size())));
  std::vector<std::string> out;
  for (int r = 0; r < p; ++r)
    out.push_back(all.substr(static_cast<std::size_t>(r * longest), static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)])));
  return out;
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v); s != nullptr && *s != '\0') return true;
  return false;
}

namespace {
// A duration in seconds from the environment variable `name`, else `fallback`.
std::chrono::milliseconds seconds_from_environment(const char* name, std::chrono::milliseconds fallback,
                                                   const char* example) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(s > 0) || s > 86400)
    raise<InvalidArgument>(name, "='", v, "' is not a number of seconds between 0 and 86400; set it to e.g. ", example,
                           ", or unset it for the default of ", fallback.count() / 1000.0, " seconds");
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
}
}  // namespace

std::chrono::milliseconds collective_timeout(std::chrono::milliseconds fallback) {
  return seconds_from_environment("TOWERFLOW_COLLECTIVE_TIMEOUT", fallback, "30");
}

std::chrono::milliseconds stall_warning(std::chrono::milliseconds fallback) {
  return seconds_from_environment("TOWERFLOW_STALL_WARNING", fallback, "5");
}

ProcessGroup& world() {
  static std::once_flag once;
  static std::unique_ptr<ProcessGroup> group;
  std::call_once(once, [] {
    const auto timeout = timeout_from_environment();
    const auto warning = stall_warning(std::chrono::milliseconds(5'000));
    group = launched_by_mpi() ? detail::make_mpi_world() : make_single_process_group();
    group->set_timeout(timeout);
    group->set_stall_warning(warning);
  });
  return *group;
}

std::unique_ptr<ProcessGroup> make_single_process_group() { return std::make_unique<SingleProcessGroup>(); }

void check_same_on_every_rank(ProcessGroup& group, std::string_view what, const std::string& value,
                              std::string_view fix) {
  if (group.size() == 1) return;
  const std::vector<std::string> all = group.all_gather(value);
  std::string differing;
  for (int r = 1; r < group.size(); ++r)
    if (all[static_cast<std::size_t>(r)] != all[0])
      differing += str(differing.empty() ? "" : ", ", "rank ", r, " has ", all[static_cast<std::size_t>(r)]);
  if (differing.empty()) return;
  raise<InvalidArgument>("the ranks disagree on ", what, ": rank 0 has ", all[0], ", ", differing, "; ", fix);
}

std::unique_ptr<Communicator> make_hierarchical_communicator(std::unique_ptr<Communicator> local,
                                                             ProcessGroup& processes) {
  return std::make_unique<HierarchicalCommunicator>(std::move(local), processes);
}

}  // namespace towerflow::collectives
