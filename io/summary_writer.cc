#include "io/summary_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "event.pb.h"  // generated from io/event.proto

namespace towerflow::io {
namespace fs = std::filesystem;
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// TensorFlow's default histogram bucket limits (tensorflow/core/lib/histogram/histogram.cc):
// 1e-12 growing by 10% up to 1e20, mirrored below zero, a bucket for zero, DBL_MAX last.
const std::vector<double>& default_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
    pos.push_back(std::numeric_limits<double>::max());
    std::vector<double> all;
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return limits;
}

}  // namespace

std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(std::string_view(out).substr(0, 8)), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

SummaryWriter::SummaryWriter(const fs::path& logdir) {
  std::error_code ec;
  fs::create_directories(logdir, ec);
  if (ec) raise<DataError>("cannot create the event file directory ", logdir.string(), ": ", ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  static std::atomic<int> counter{0};
  // TensorFlow's name: time, host, pid and a counter, so files sort in the order they were made.
  path_ = logdir / str("events.out.tfevents.", static_cast<long long>(now_seconds()), ".", host, ".", ::getpid(), ".",
                       counter++);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) raise<DataError>("cannot create the event file ", path_.string(), ": ", std::strerror(errno));
  proto::Event e;
  e.set_wall_time(now_seconds());
  e.set_file_version("brain.Event:2");
  write(e.SerializeAsString());
}

SummaryWriter::~SummaryWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SummaryWriter::write(const std::string& event_bytes) {
  const std::string record = tfrecord(event_bytes);
  std::size_t done = 0;
  while (done < record.size()) {
    ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      raise<DataError>("cannot write the event file ", path_.string(), ": ", std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
}

void SummaryWriter::scalar(std::string_view tag, double value, std::int64_t step) {
  proto::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  write(e.SerializeAsString());
}

void SummaryWriter::histogram(std::string_view tag, std::span<const float> values, std::int64_t step) {
  const auto& limits = default_bucket_limits();
  std::vector<double> counts(limits.size(), 0.0);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0, sum_squares = 0, num = 0;
  for (float f : values) {
    const double x = f;
    if (!std::isfinite(x)) continue;
    // The first bucket whose limit is above x (TensorFlow's Histogram::Add).
    const auto b = static_cast<std::size_t>(std::upper_bound(limits.begin(), limits.end(), x) - limits.begin());
    counts[std::min(b, limits.size() - 1)] += 1;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
    sum_squares += x * x;
    num += 1;
  }
  proto::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  auto* h = v->mutable_histo();
  h->set_min(num > 0 ? lo : 0.0);
  h->set_max(num > 0 ? hi : 0.0);
  h->set_num(num);
  h->set_sum(sum);
  h->set_sum_squares(sum_squares);
  // Runs of empty buckets collapse into one (TensorFlow's EncodeToProto without preserve_zero_buckets).
  for (std::size_t i = 0; i < counts.size();) {
    double end = limits[i], count = counts[i];
    ++i;
    if (count <= 0)
      while (i < counts.size() && counts[i] <= 0) end = limits[i++];
    h->add_bucket_limit(end);
    h->add_bucket(count);
  }
  write(e.SerializeAsString());
}

void SummaryWriter::session_start(std::int64_t step) {
  proto::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  e.mutable_session_log()->set_status(proto::SessionLog::START);
  write(e.SerializeAsString());
}

void SummaryWriter::flush() {
  if (::fsync(fd_) != 0) raise<DataError>("cannot flush the event file ", path_.string(), ": ", std::strerror(errno));
}

}  // namespace towerflow::io
