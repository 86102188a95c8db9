#pragma once
// SummaryWriter: TensorBoard event files, as TensorFlow and PyTorch's SummaryWriter write them.
//
//   io::SummaryWriter tb{"runs/r20"};            // runs/r20/events.out.tfevents.<time>.<host>.<pid>.<n>
//   tb.scalar("train/loss", 0.42, step);
//   tb.histogram("weights/fc.weight", values, step);
//   tb.flush();
//   // tensorboard --logdir runs
//
// Contract:
// - A file is a sequence of TFRecords (a little-endian uint64 length, the masked CRC32C of those 8
//   bytes, the data, the masked CRC32C of the data) whose data are serialized Event protocol
//   buffers (io/event.proto: TensorFlow's field numbers); the first holds file_version
//   "brain.Event:2". Each writer opens a new file, never appending to an existing one.
// - session_start(step) writes TensorFlow's SessionLog START at `step`: TensorBoard then drops
//   what an earlier, interrupted writer logged at that step or later, so a resumed run's curve is
//   continuous.
// - Records are written through to the file as they come (not fsynced); flush() also fsyncs.
// - Errors: DataError naming the path and the reason. Not thread-safe: one thread writes.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "io/crc32c.h"

namespace towerflow::io {

// TFRecord's masked form of crc32c(data) (io/crc32c.h).
std::uint32_t masked_crc32c(std::string_view data);
// One TFRecord around `data`.
std::string tfrecord(std::string_view data);

class SummaryWriter {
 public:
  // Creates logdir if needed and a new event file in it.
  explicit SummaryWriter(const std::filesystem::path& logdir);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  void scalar(std::string_view tag, double value, std::int64_t step);
  // TensorFlow's default buckets (edges growing by 10% from 1e-12, mirrored below zero); NaN and
  // infinite values are left out.
  void histogram(std::string_view tag, std::span<const float> values, std::int64_t step);
  void session_start(std::int64_t step);
  void flush();

  const std::filesystem::path& path() const { return path_; }

 private:
  void write(const std::string& event_bytes);

  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace towerflow::io
