// TensorBoard event files: the record framing and checksums against TensorBoard's own Python
// implementation (bytes checked in below), and files read back record by record.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "event.pb.h"  // generated from io/event.proto
#include "io/atomic_file.h"
#include "io/summary_writer.h"
#include "train/fit_test_util.h"

namespace tw = towerflow;
using towerflow::train::testing::TempDir;

namespace {

std::string from_hex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

std::uint64_t le(std::string_view b, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[static_cast<std::size_t>(i)]);
  return v;
}

// Every record of a TFRecord file, each checksum verified.
std::vector<tw::io::proto::Event> read_events(const std::filesystem::path& path) {
  const std::string f = tw::io::read_file(path);
  std::vector<tw::io::proto::Event> out;
  std::size_t at = 0;
  while (at < f.size()) {
    REQUIRE(at + 12 <= f.size());
    const std::uint64_t n = le(std::string_view(f).substr(at, 8), 8);
    REQUIRE(le(std::string_view(f).substr(at + 8, 4), 4) == tw::io::masked_crc32c(std::string_view(f).substr(at, 8)));
    REQUIRE(at + 12 + n + 4 <= f.size());
    const std::string_view data = std::string_view(f).substr(at + 12, n);
    REQUIRE(le(std::string_view(f).substr(at + 12 + n, 4), 4) == tw::io::masked_crc32c(data));
    tw::io::proto::Event e;
    REQUIRE(e.ParseFromArray(data.data(), static_cast<int>(data.size())));
    out.push_back(e);
    at += 12 + n + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("CRC-32C and TFRecord framing match TensorBoard's implementation", "[io][tensorboard]") {
  CHECK(tw::io::crc32c("123456789") == 0xE3069283u);          // the CRC-32C check value (RFC 3720)
  CHECK(tw::io::masked_crc32c("123456789") == 0xc78ab0e5u);   // tensorboard's masked_crc32c
  // tensorboard.summary.writer.record_writer.RecordWriter(b"hello, towerflow")
  CHECK(tw::io::tfrecord("hello, towerflow") ==
        from_hex("100000000000000095fbfe1868656c6c6f2c20746f776572666c6f77949abfe3"));
}

TEST_CASE("event.proto serialises as TensorBoard's Event", "[io][tensorboard]") {
  tw::io::proto::Event e;
  e.set_wall_time(1.5);
  e.set_step(7);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag("train/loss");
  v->set_simple_value(0.25f);
  // event_pb2.Event(wall_time=1.5, step=7, summary=Summary(value=[Value(tag=..., simple_value=0.25)]))
  CHECK(e.SerializeAsString() == from_hex("09000000000000f83f10072a130a110a0a747261696e2f6c6f7373150000803e"));
}

TEST_CASE("a SummaryWriter file holds the version, scalars, histograms and restarts, in order", "[io][tensorboard]") {
  TempDir dir;
  std::filesystem::path path;
  {
    tw::io::SummaryWriter w(dir.path / "logs");
    w.scalar("train/loss", 0.5, 10);
    w.histogram("weights/fc", std::vector<float>{0.0f, 1.0f, -1.0f, 2.5f, NAN}, 10);
    w.session_start(11);
    w.flush();
    path = w.path();
  }
  CHECK_THAT(path.filename().string(), Catch::StartsWith("events.out.tfevents."));
  auto events = read_events(path);
  REQUIRE(events.size() == 4);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[1].step() == 10);
  CHECK(events[1].summary().value(0).tag() == "train/loss");
  CHECK(events[1].summary().value(0).simple_value() == 0.5f);
  const auto& h = events[2].summary().value(0).histo();
  CHECK(h.num() == 4);  // NaN left out
  CHECK(h.min() == -1.0);
  CHECK(h.max() == 2.5);
  CHECK(h.sum() == 2.5);
  CHECK(h.sum_squares() == Approx(8.25));
  double total = 0;
  for (double c : h.bucket()) total += c;
  CHECK(total == 4);
  REQUIRE(h.bucket_limit_size() == h.bucket_size());
  for (int i = 1; i < h.bucket_limit_size(); ++i) CHECK(h.bucket_limit(i) > h.bucket_limit(i - 1));
  // Each value sits in the first bucket whose limit is above it (empty runs are collapsed); for
  // x > 0 that limit is TensorFlow's next edge 1e-12 * 1.1^k above x.
  for (double x : {-1.0, 0.0, 1.0, 2.5}) {
    int b = 0;
    while (h.bucket_limit(b) <= x) ++b;
    INFO(x);
    CHECK(h.bucket(b) >= 1);
    if (x > 0) {
      double edge = 1e-12;
      while (edge <= x) edge *= 1.1;
      CHECK(h.bucket_limit(b) == edge);
    }
  }
  CHECK(events[3].step() == 11);
  CHECK(events[3].session_log().status() == tw::io::proto::SessionLog::START);
  // A second writer opens a second file.
  tw::io::SummaryWriter again(dir.path / "logs");
  CHECK(again.path() != path);
}
