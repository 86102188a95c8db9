// The MPI process group (builds with TOWERFLOW_MPI).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/collectives/context.h"
#include "core/collectives/process_group_impl.h"
#include "core/error.h"
#include "core/log.h"

namespace towerflow::collectives::detail {

namespace {

// Note [Collectives that cannot hang]: MPI's collectives wait forever for a rank that died or
// stopped calling them, and cannot be interrupted. So each group runs its collectives, the
// ordinary blocking ones (MPI_Allreduce, MPI_Bcast, ...), on a thread of its own, and the
// calling thread waits for that thread with a deadline, waking every millisecond to (1) look
// for a failure note from another rank on a communicator of its own (MPI_Improbe, thread-safe)
// and (2) give up after the group's timeout. Giving up leaves the MPI thread blocked; the group
// is then broken, and the process is expected to end (it skips MPI_Finalize, which would wait
// for the blocked call). A rank whose program fails sends every other rank a note with its error
// (announce_failure) and waits a moment for their acknowledgements, so that each of them raises
// PeerFailed naming it and the cause, and exits, rather than being killed by the launcher
// without a word.
// Measured on a 2-core Intel Xeon (AVX-512), 2 processes on one host, towerflow_bench_allreduce:
// the non-blocking forms (MPI_Iallreduce completed by an MPI_Test loop) ran at 60% of
// MPI_Allreduce's speed polled without pause, and 10x slower for 256 KiB and more when the loop
// slept between tests (libnbc advances only inside MPI calls); the blocking call on a thread runs
// at MPI_Allreduce's speed but for the hand-over to and from the thread.

// Note [Stall reports]: a rank whose collective has waited half of stall_warning() sends every
// other rank a note on the failure channel ("I wait in collective #seq of group g", tag
// kStallTag); every waiting rank reads the notes while it polls for failures. At stall_warning()
// it logs what it knows: the ranks whose latest note names the same collective are waiting in it
// too, those with no note for it have not arrived (a rank busy elsewhere reads nothing and sends
// nothing, which is what names it), and those waiting in another group's collective are named
// with it. It says so again after 2x, 4x, ... the warning, until the collective completes or the
// timeout breaks the group. Collectives are numbered per group, in the order every rank calls
// them; groups are numbered in the order duplicate() makes them (the world is 0), the same on
// every rank since MPI_Comm_dup is collective. Every rank also keeps its last kRecent
// collectives (recent_collectives()) for the post-mortem.
constexpr int kFailureTag = 7301;
constexpr int kAckTag = 7302;
constexpr int kStallTag = 7303;
constexpr std::size_t kRecent = 64;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return str("MPI error ", code);
  return std::string(text, static_cast<std::size_t>(len));
}

// A text message with `tag` on `comm` from any rank, if one has arrived: its text and sender.
std::optional<std::pair<std::string, int>> receive_text(MPI_Comm comm, int tag) {
  int flag = 0;
  MPI_Message message;
  MPI_Status status;
  if (MPI_Improbe(MPI_ANY_SOURCE, tag, comm, &flag, &message, &status) != MPI_SUCCESS || !flag) return std::nullopt;
  int count = 0;
  MPI_Get_count(&status, MPI_CHAR, &count);
  std::string text(static_cast<std::size_t>(std::max(count, 0)), '\0');
  MPI_Mrecv(text.data(), count, MPI_CHAR, &message, MPI_STATUS_IGNORE);
  return std::pair{std::move(text), status.MPI_SOURCE};
}

// What the world and its duplicates share: the failure channel and what is known of failures.
struct Shared {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, hosts = 1;
  MPI_Comm failures = MPI_COMM_NULL;
  std::mutex mu;
  std::string failure;  // the first failure heard of, or the timeout that broke the group
  std::atomic<bool> broken{false};
  bool announced = false;
  std::string library;

  // Stall reports and the recent collectives (Note [Stall reports]); under mu.
  struct Note {
    int group = 0;
    std::int64_t seq = 0;
    std::string op;
  };
  struct Entered {
    int group = 0;
    std::int64_t seq = 0;
    const char* op = "";  // a literal: entering a collective allocates nothing
    std::size_t bytes = 0;
    CollectiveContext context;  // the step and what it carries, from the calling thread
    double started_s = 0, waited_s = 0;
    bool done = false;
  };
  int next_group = 1;
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::map<int, Note> waiting;  // rank -> the collective its latest note names
  std::deque<Entered> recent;
  std::list<std::pair<std::string, MPI_Request>> notes_out;  // notes being sent, with their bytes

  // Reads every stall note that has arrived; frees the notes this rank has finished sending.
  void poll_stalls() {
    while (auto received = receive_text(failures, kStallTag)) {
      Note note;
      std::istringstream in(received->first);
      in >> note.group >> note.seq >> std::ws;
      std::getline(in, note.op);
      std::lock_guard lock(mu);
      waiting[received->second] = std::move(note);
    }
    std::lock_guard lock(mu);
    for (auto it = notes_out.begin(); it != notes_out.end();) {
      int done = 0;
      MPI_Test(&it->second, &done, MPI_STATUS_IGNORE);
      it = done ? notes_out.erase(it) : std::next(it);
    }
  }

  // Tells every other rank that this one waits in collective `seq` of `group`.
  void send_stall_note(int group, std::int64_t seq, const std::string& op) {
    std::lock_guard lock(mu);
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      auto& [text, request] = notes_out.emplace_back(str(group, " ", seq, " ", op), MPI_REQUEST_NULL);
      if (MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, r, kStallTag, failures, &request) !=
          MPI_SUCCESS)
        notes_out.pop_back();
    }
  }

  // The stall report of this rank, waiting `waited` in collective `seq` of `group`.
  std::string stall_report(int group, std::int64_t seq, const std::string& op, std::size_t bytes,
                           const CollectiveContext& context, double waited, double timeout_s) {
    std::lock_guard lock(mu);
    std::vector<int> here, absent;
    std::string elsewhere;
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const auto it = waiting.find(r);
      if (it == waiting.end() || (it->second.group == group && it->second.seq < seq)) {
        absent.push_back(r);
      } else if (it->second.group == group && it->second.seq == seq) {
        here.push_back(r);
      } else {
        elsewhere += str(elsewhere.empty() ? "" : ", ", "rank ", r, " in ", it->second.op, " #", it->second.seq,
                         " of ", group_name(it->second.group));
      }
    }
    auto ranks = [](const std::vector<int>& v) {
      std::string s;
      for (int r : v) s += str(s.empty() ? "" : ", ", r);
      return s.empty() ? std::string("none") : s;
    };
    const std::string at = describe(context);
    return str("stall: rank ", rank, " has waited ", std::round(waited * 10) / 10, " s in ", op, " #", seq, " of ",
               group_name(group), at.empty() ? std::string() : " at " + at, bytes > 0 ? str(" (", bytes, " bytes)") : std::string(), "; waiting in it too: ", ranks(here),
               "; not arrived: ", ranks(absent), elsewhere.empty() ? "" : "; waiting elsewhere: " + elsewhere,
               ". The collective gives up ", timeout_s, " s after it began (TOWERFLOW_COLLECTIVE_TIMEOUT); "
               "TOWERFLOW_STALL_WARNING sets when this is said");
  }

  static std::string group_name(int group) {
    return group == 0 ? std::string("the world") : str("group ", group, " (a duplicate of the world)");
  }

  [[noreturn]] void raise_broken() {
    std::lock_guard lock(mu);
    raise<PeerFailed>(failure);
  }

  // A failure note from another rank, if one has arrived: records it, acknowledges it, and
  // raises PeerFailed.
  void poll_failures() {
    if (broken.load(std::memory_order_acquire)) raise_broken();
    const auto received = receive_text(failures, kFailureTag);
    if (!received) return;
    const auto& [text, source] = *received;
    MPI_Request ack;
    if (MPI_Isend(nullptr, 0, MPI_CHAR, source, kAckTag, failures, &ack) == MPI_SUCCESS) MPI_Request_free(&ack);
    {
      std::lock_guard lock(mu);
      if (failure.empty()) failure = str("rank ", source, " failed: ", text);
    }
    broken.store(true, std::memory_order_release);
    raise_broken();
  }

  void break_with(std::string why) {
    {
      std::lock_guard lock(mu);
      if (failure.empty()) failure = std::move(why);
    }
    broken.store(true, std::memory_order_release);
    raise_broken();
  }
};

// The thread that makes one group's MPI calls (Note [Collectives that cannot hang]).
class CallThread {
 public:
  CallThread() : thread_([this] { loop(); }) {}
  ~CallThread() {
    bool blocked;
    {
      std::lock_guard lock(mu_);
      quit_ = true;
      blocked = busy_;
    }
    cv_.notify_all();
    // A call that never returned (the group is broken): the thread cannot be joined.
    if (blocked) thread_.detach();
    else thread_.join();
  }

  void post(std::function<int()> call) {
    {
      std::lock_guard lock(mu_);
      call_ = std::move(call);
      done_ = false;
      busy_ = true;
    }
    cv_.notify_all();
  }
  // Waits up to `slice` for the posted call; its MPI status when it has returned.
  std::optional<int> wait_for(std::chrono::microseconds slice) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, slice, [&] { return done_; })) return std::nullopt;
    return result_;
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || (busy_ && !done_); });
      if (quit_ && !(busy_ && !done_)) return;
      std::function<int()> call = std::move(call_);
      lock.unlock();
      const int r = call();
      lock.lock();
      result_ = r;
      done_ = true;
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<int()> call_;
  bool busy_ = false, done_ = true, quit_ = false;
  int result_ = MPI_SUCCESS;
  std::thread thread_;
};

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, std::shared_ptr<Shared> shared, bool world)
      : comm_(comm), shared_(std::move(shared)), world_(world), calls_(std::make_unique<CallThread>()) {
    if (!world_) {
      std::lock_guard lock(shared_->mu);
      group_ = shared_->next_group++;
    }
  }

  ~MpiProcessGroup() override {
    calls_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (!world_) {
      MPI_Comm_free(&comm_);
      return;
    }
    // After a failure a collective may still be pending: MPI_Finalize could wait for it forever.
    if (shared_->broken.load()) return;
    // Stall notes still on their way: MPI_Finalize completes them (their bytes live in Shared,
    // which outlives it).
    for (auto& note : shared_->notes_out) MPI_Request_free(&note.second);
    MPI_Comm_free(&comm_);
    MPI_Comm_free(&shared_->failures);
    MPI_Finalize();
  }

  int rank() const override { return shared_->rank; }
  int size() const override { return shared_->size; }
  int local_rank() const override { return shared_->local_rank; }
  int local_size() const override { return shared_->local_size; }

  void all_reduce_sum(std::span<float> data) override {
    all_reduce(data.data(), data.size(), MPI_FLOAT, MPI_SUM, "all-reduce", data.size_bytes());
  }
  void all_reduce_sum(std::span<double> data) override {
    all_reduce(data.data(), data.size(), MPI_DOUBLE, MPI_SUM, "all-reduce", data.size_bytes());
  }
  void all_reduce_max(std::span<std::int64_t> data) override {
    all_reduce(data.data(), data.size(), MPI_INT64_T, MPI_MAX, "all-reduce (max)", data.size_bytes());
  }

  void broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= size())
      raise<InvalidArgument>("broadcast root ", root, " does not exist; ranks are 0..", size() - 1);
    call("broadcast", data.size_bytes(), [this, data, root] {
      return MPI_Bcast(data.data(), count(data.size()), MPI_BYTE, root, comm_);
    });
  }

  void all_gather(std::span<const std::byte> send, std::span<std::byte> out) override {
    if (out.size() != send.size() * static_cast<std::size_t>(size()))
      raise<InvalidArgument>("all_gather over ", size(), " processes: the output has ", out.size(),
                             " bytes for ", send.size(), " from each");
    call("all-gather", out.size_bytes(), [this, send, out] {
      return MPI_Allgather(send.data(), count(send.size()), MPI_BYTE, out.data(), count(send.size()), MPI_BYTE,
                           comm_);
    });
  }

  void barrier() override {
    call("barrier", 0, [this] { return MPI_Barrier(comm_); });
  }

  void check_peers() override { shared_->poll_failures(); }

  std::unique_ptr<ProcessGroup> duplicate() override {
    MPI_Comm dup = MPI_COMM_NULL;
    check(MPI_Comm_dup(comm_, &dup), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    auto g = std::make_unique<MpiProcessGroup>(dup, shared_, false);
    g->set_timeout(timeout());
    g->set_stall_warning(stall_warning());
    return g;
  }

  void announce_failure(const std::string& reason) override {
    Shared& s = *shared_;
    {
      std::lock_guard lock(s.mu);
      // A rank that fails because another did has nothing to add.
      if (s.announced || !s.failure.empty()) return;
      s.announced = true;
    }
    std::vector<MPI_Request> sends;
    for (int r = 0; r < s.size; ++r) {
      if (r == s.rank) continue;
      MPI_Request q;
      if (MPI_Isend(reason.data(), count(reason.size()), MPI_CHAR, r, kFailureTag, s.failures, &q) == MPI_SUCCESS)
        sends.push_back(q);
    }
    // Wait (briefly) until every other rank has read the note, so that each can say why it stops
    // before the launcher, seeing this rank exit with an error, ends the job.
    int acks = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (acks < s.size - 1 && std::chrono::steady_clock::now() < deadline) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kAckTag, s.failures, &flag, &status) == MPI_SUCCESS && flag) {
        MPI_Recv(nullptr, 0, MPI_CHAR, status.MPI_SOURCE, kAckTag, s.failures, MPI_STATUS_IGNORE);
        ++acks;
      } else if (MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, s.failures, &flag, &status) == MPI_SUCCESS && flag) {
        // That rank failed too (the same bad option on every rank): it will not acknowledge.
        int count = 0;
        MPI_Get_count(&status, MPI_CHAR, &count);
        std::string text(static_cast<std::size_t>(std::max(count, 0)), '\0');
        MPI_Recv(text.data(), count, MPI_CHAR, status.MPI_SOURCE, kFailureTag, s.failures, MPI_STATUS_IGNORE);
        ++acks;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    for (MPI_Request& q : sends) MPI_Request_free(&q);
  }

  std::string recent_collectives() const override {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    std::lock_guard lock(shared_->mu);
    for (const Shared::Entered& e : shared_->recent) {
      nlohmann::ordered_json entry = {{"group", e.group}, {"seq", e.seq}, {"op", e.op}, {"bytes", e.bytes}};
      if (e.context.step > 0) entry["step"] = e.context.step;
      if (e.context.purpose) entry["purpose"] = describe({.purpose = e.context.purpose, .index = e.context.index});
      entry.update({{"started_s", e.started_s}, {"waited_s", e.waited_s}, {"done", e.done}});
      out.push_back(std::move(entry));
    }
    return out.dump();
  }

  std::string name() const override {
    return str("MPI (", shared_->library, "), ", size(), " processes on ", shared_->hosts,
               shared_->hosts == 1 ? " host" : " hosts");
  }

 private:
  static int count(std::size_t n) {
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      raise<InvalidArgument>("a collective of ", n, " elements is larger than MPI's int count allows; split it");
    return static_cast<int>(n);
  }

  void check(int code, const char* call) {
    if (code != MPI_SUCCESS)
      shared_->break_with(str(call, " failed on rank ", rank(), ": ", mpi_error_text(code),
                              " (another rank may have died)"));
  }

  void all_reduce(void* data, std::size_t n, MPI_Datatype type, MPI_Op op, const char* what, std::size_t bytes) {
    const int c = count(n);
    call(what, bytes, [this, data, c, type, op] { return MPI_Allreduce(MPI_IN_PLACE, data, c, type, op, comm_); });
  }

  // Note [Collectives that cannot hang]: runs `mpi_call` on the group's thread and waits for it.
  // Note [Stall reports]: notes and reports while it waits; the entry in the recent collectives.
  void call(const char* what, std::size_t bytes, std::function<int()> mpi_call) {
    shared_->poll_failures();
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const std::int64_t seq = ++seq_;
    const CollectiveContext context = current_context();
    {
      std::lock_guard lock(shared_->mu);
      shared_->recent.push_back({.group = group_, .seq = seq, .op = what, .bytes = bytes, .context = context,
                                 .started_s = std::chrono::duration<double>(start - shared_->start).count()});
      if (shared_->recent.size() > kRecent) shared_->recent.pop_front();
    }
    const auto finish = [&](bool done) {
      std::lock_guard lock(shared_->mu);
      for (auto it = shared_->recent.rbegin(); it != shared_->recent.rend(); ++it)
        if (it->group == group_ && it->seq == seq) {
          it->waited_s = std::chrono::duration<double>(Clock::now() - start).count();
          it->done = done;
          break;
        }
    };
    calls_->post(std::move(mpi_call));
    bool noted = false;
    auto next_report = stall_warning();
    // Most collectives return within microseconds: wait briefly before polling for failures.
    auto slice = std::chrono::microseconds(200);
    for (;;) {
      if (const auto status = calls_->wait_for(slice)) {
        finish(true);
        check(*status, what);
        return;
      }
      slice = std::chrono::microseconds(1000);
      try {
        shared_->poll_failures();
      } catch (...) {
        finish(false);
        throw;
      }
      const auto waited = Clock::now() - start;
      if (shared_->size > 1 && waited >= stall_warning() / 2) {
        if (!noted) shared_->send_stall_note(group_, seq, what);
        noted = true;
        shared_->poll_stalls();
        if (waited >= next_report) {
          log_warning(shared_->stall_report(group_, seq, what, bytes, context, std::chrono::duration<double>(waited).count(),
                                            timeout().count() / 1000.0));
          next_report *= 2;
        }
      }
      if (waited > timeout()) {
        finish(false);
        shared_->break_with(str("an MPI ", what, bytes > 0 ? str(" of ", bytes, " bytes") : std::string(),
                                " did not complete within ", timeout().count() / 1000.0, " s on rank ", rank(),
                                ": another rank died, hangs or is far behind (raise "
                                "TOWERFLOW_COLLECTIVE_TIMEOUT, in seconds, if a rank is legitimately that slow)"));
      }
    }
  }

  MPI_Comm comm_;
  std::shared_ptr<Shared> shared_;
  bool world_;
  int group_ = 0;         // Note [Stall reports]
  std::int64_t seq_ = 0;  // collectives entered on this group
  std::unique_ptr<CallThread> calls_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      raise<DeviceError>("MPI_Init_thread failed; check the MPI installation and the launcher's environment");
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE)
    raise<DeviceError>("this MPI library gives thread level ", provided, ", but towerflow's towers call MPI from "
                       "several threads and need MPI_THREAD_MULTIPLE; use an MPI built with thread support "
                       "(Open MPI from Debian has it)");
  auto shared = std::make_shared<Shared>();
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &shared->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &shared->size);
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, shared->rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &shared->local_rank);
  MPI_Comm_size(local, &shared->local_size);
  MPI_Comm_free(&local);
  int first_on_host = shared->local_rank == 0 ? 1 : 0;
  MPI_Allreduce(&first_on_host, &shared->hosts, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_dup(MPI_COMM_WORLD, &shared->failures);
  MPI_Comm_set_errhandler(shared->failures, MPI_ERRORS_RETURN);
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string library(version, static_cast<std::size_t>(len));
  library = library.substr(0, library.find_first_of(",\n"));
  shared->library = library;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::make_unique<MpiProcessGroup>(comm, std::move(shared), true);
}

}  // namespace towerflow::collectives::detail
