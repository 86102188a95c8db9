#include <catch2/catch.hpp>

#include "core/error.h"
#include "data/cifar.h"
#include "tests/data/helpers.h"

namespace fs = std::filesystem;
using namespace towerflow;
using namespace towerflow::data;
using testing::TempDir;
using testing::require_throws_mentioning;
using testing::write_file;

namespace {

// A pixel value that encodes (record, channel, y, x), so a mis-placed byte is caught.
std::uint8_t pixel(int record, int c, int y, int x) { return static_cast<std::uint8_t>(record * 37 + c * 101 + y * 7 + x * 3); }

// Records laid out as the CIFAR release does: label byte(s), then the R, G and B planes.
std::vector<std::uint8_t> records(int first, int count, int label_bytes, int label_mod = 10) {
  std::vector<std::uint8_t> out;
  for (int r = first; r < first + count; ++r) {
    if (label_bytes == 2) out.push_back(static_cast<std::uint8_t>(r % 20));  // coarse
    out.push_back(static_cast<std::uint8_t>(r % label_mod));
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 32; ++y)
        for (int x = 0; x < 32; ++x) out.push_back(pixel(r, c, y, x));
  }
  return out;
}

void write_cifar10(const fs::path& dir, int per_file = 3) {
  for (int b = 1; b <= 5; ++b)
    write_file(dir / ("data_batch_" + std::to_string(b) + ".bin"), records((b - 1) * per_file, per_file, 1));
  write_file(dir / "test_batch.bin", records(100, 2, 1));
}

}  // namespace

TEST_CASE("CIFAR-10 reads every record of the five train files, in order, as HWC", "[data][cifar]") {
  TempDir tmp;
  write_cifar10(tmp.path());
  Cifar10 train(tmp.path(), Split::Train);
  REQUIRE(train.size() == 15);
  CHECK(train.num_classes() == 10);
  CHECK(train.class_names()[3] == "cat");
  CHECK(train.shape() == ImageShape{32, 32, 3});
  std::vector<std::uint8_t> img(3072);
  for (int i = 0; i < 15; ++i) {
    CHECK(train.read(i, img) == i % 10);
    CHECK(train.label(i) == i % 10);
    int bad = 0;
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x)
        for (int c = 0; c < 3; ++c) bad += img[(y * 32 + x) * 3 + c] != pixel(i, c, y, x);
    CHECK(bad == 0);
  }
  Cifar10 test(tmp.path(), Split::Test);
  REQUIRE(test.size() == 2);
  test.read(1, img);
  CHECK(img[(5 * 32 + 6) * 3 + 2] == pixel(101, 2, 5, 6));
}

TEST_CASE("CIFAR-10 accepts the parent of cifar-10-batches-bin and reads batches.meta.txt", "[data][cifar]") {
  TempDir tmp;
  write_cifar10(tmp / "cifar-10-batches-bin");
  std::ofstream(tmp / "cifar-10-batches-bin/batches.meta.txt") << "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n\n";
  Cifar10 train(tmp.path(), Split::Train);
  CHECK(train.size() == 15);
  CHECK(train.class_names()[9] == "j");
  CHECK(train.directory() == tmp / "cifar-10-batches-bin");
}

TEST_CASE("CIFAR-10: a missing directory says where to get the dataset and how to lay it out", "[data][cifar]") {
  TempDir tmp;
  require_throws_mentioning<NotFound>([&] { Cifar10(tmp / "nowhere", Split::Train); },
                                      {(tmp / "nowhere").string(), "cifar-10-binary.tar.gz", "data_batch_1.bin",
                                       "test_batch.bin", "DatasetKind::Builtin"});
}

TEST_CASE("CIFAR-10: a missing file is named", "[data][cifar]") {
  TempDir tmp;
  write_cifar10(tmp.path());
  fs::remove(tmp / "data_batch_4.bin");
  require_throws_mentioning<NotFound>([&] { Cifar10(tmp.path(), Split::Train); },
                                      {(tmp / "data_batch_4.bin").string(), "missing"});
  CHECK_NOTHROW(Cifar10(tmp.path(), Split::Test));
}

TEST_CASE("CIFAR-10: truncated and oversized files name the file, the byte offset and the record size",
          "[data][cifar]") {
  TempDir tmp;
  write_cifar10(tmp.path());
  auto bytes = records(6, 3, 1);
  SECTION("truncated") {
    bytes.resize(bytes.size() - 100);  // 2 whole records and 2973 bytes
    write_file(tmp / "data_batch_3.bin", bytes);
    require_throws_mentioning<DataError>([&] { Cifar10(tmp.path(), Split::Train); },
                                         {(tmp / "data_batch_3.bin").string(), "9119 bytes", "3073-byte records",
                                          "2973 bytes left over from byte offset 6146"});
  }
  SECTION("oversized") {
    bytes.push_back(0);
    write_file(tmp / "test_batch.bin", bytes);
    require_throws_mentioning<DataError>([&] { Cifar10(tmp.path(), Split::Test); },
                                         {(tmp / "test_batch.bin").string(), "9220 bytes",
                                          "1 bytes left over from byte offset 9219"});
  }
  SECTION("empty") {
    write_file(tmp / "test_batch.bin", {});
    require_throws_mentioning<DataError>([&] { Cifar10(tmp.path(), Split::Test); },
                                         {(tmp / "test_batch.bin").string(), "0 bytes"});
  }
  SECTION("a CIFAR-100 file is not a CIFAR-10 file") {
    write_file(tmp / "test_batch.bin", records(0, 3, 2, 100));
    require_throws_mentioning<DataError>([&] { Cifar10(tmp.path(), Split::Test); }, {"3073-byte records"});
  }
}

TEST_CASE("CIFAR-10: a label out of range names the file, record and byte offset", "[data][cifar]") {
  TempDir tmp;
  write_cifar10(tmp.path());
  auto bytes = records(0, 3, 1);
  bytes[2 * 3073] = 10;  // record 2
  write_file(tmp / "data_batch_5.bin", bytes);
  require_throws_mentioning<DataError>([&] { Cifar10(tmp.path(), Split::Train); },
                                       {(tmp / "data_batch_5.bin").string(), "record 2", "byte offset 6146",
                                        "label 10", "expected 0..9"});
}

TEST_CASE("CIFAR-100 reads coarse and fine labels and checks both ranges", "[data][cifar]") {
  TempDir tmp;
  const fs::path dir = tmp / "cifar-100-binary";
  write_file(dir / "train.bin", records(0, 120, 2, 100));
  write_file(dir / "test.bin", records(0, 4, 2, 100));
  Cifar100 fine(tmp.path(), Split::Train);
  REQUIRE(fine.size() == 120);
  CHECK(fine.num_classes() == 100);
  std::vector<std::uint8_t> img(3072);
  CHECK(fine.read(117, img) == 17);
  CHECK(img[(31 * 32 + 31) * 3 + 1] == pixel(117, 1, 31, 31));
  CHECK(fine.coarse_label(117) == 117 % 20);
  CHECK(fine.fine_label(117) == 17);
  Cifar100 coarse(dir, Split::Train, {.labels = Cifar100Labels::Coarse});
  CHECK(coarse.num_classes() == 20);
  CHECK(coarse.label(57) == 17);

  auto bad = records(0, 4, 2, 100);
  SECTION("coarse label out of range") {
    bad[3 * 3074] = 20;
    write_file(dir / "test.bin", bad);
    require_throws_mentioning<DataError>([&] { Cifar100(dir, Split::Test); },
                                         {"test.bin", "record 3", "byte offset 9222", "coarse label 20", "0..19"});
  }
  SECTION("fine label out of range") {
    bad[1 * 3074 + 1] = 100;
    write_file(dir / "test.bin", bad);
    require_throws_mentioning<DataError>([&] { Cifar100(dir, Split::Test); },
                                         {"record 1", "byte offset 3075", "fine label 100", "0..99"});
  }
  SECTION("truncated") {
    bad.pop_back();
    write_file(dir / "test.bin", bad);
    require_throws_mentioning<DataError>([&] { Cifar100(dir, Split::Test); }, {"3074-byte records"});
  }
  SECTION("missing directory") {
    require_throws_mentioning<NotFound>([&] { Cifar100(tmp / "none", Split::Test); },
                                        {"cifar-100-binary.tar.gz", "train.bin", "test.bin"});
  }
}
