#include <catch2/catch.hpp>

#include <cstring>
#include <functional>

#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace tw = towerflow;
using namespace towerflow::io;
using towerflow::io::testing::fixture;
using towerflow::io::testing::TempDir;

namespace {

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span(v));
}

template <typename T>
std::vector<T> values(const SafetensorsFile& f, const std::string& name) {
  auto d = f.data(f.at(name));
  std::vector<T> out(d.size() / sizeof(T));
  std::memcpy(out.data(), d.data(), d.size());
  return out;
}

std::string header_of(const std::string& file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return file.substr(8, n);
}

// Rebuilds a file with a replaced header (length prefix recomputed) and the given data buffer.
std::string with_header(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const tw::DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

}  // namespace

TEST_CASE("a file written by the Python reference reads back with its values and metadata", "[io][safetensors]") {
  auto f = SafetensorsFile::load(fixture("torch_mixed.safetensors"));
  CHECK(f.metadata() == Metadata{{"step", "42"}, {"format", "pt"}});
  CHECK(f.entries().size() == 6);

  const auto& w = f.at("weight");
  CHECK(w.dtype == DType::F32);
  CHECK(w.shape == Shape{2, 3});
  CHECK(values<float>(f, "weight") == std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f});
  CHECK(values<std::int64_t>(f, "counts") == std::vector<std::int64_t>{1, -2, 3'000'000'000});
  CHECK(values<std::uint16_t>(f, "half") == std::vector<std::uint16_t>{0x3800, 0x3c00, 0xc000, 0x7bff});
  CHECK(f.at("empty").shape == Shape{0, 4});
  CHECK(f.data(f.at("empty")).empty());
  CHECK(f.at("scalar").shape.empty());
  CHECK(values<float>(f, "scalar") == std::vector<float>{3.25f});
  CHECK(values<double>(f, "layer.0.bias") == std::vector<double>{1.5, -2.5});
  CHECK(f.find("nope") == nullptr);
  CHECK_THROWS_AS(f.at("nope"), tw::NotFound);
}

TEST_CASE("the writer reproduces the Python reference byte for byte", "[io][safetensors]") {
  std::string reference = read_file(fixture("torch_plain.safetensors"));
  std::vector<float> conv(24), var{0.5f, 1.25f, 2.0f};
  for (int i = 0; i < 24; ++i) conv[i] = (static_cast<float>(i) - 7.0f) / 3.0f;
  std::vector<std::int64_t> tracked{17};
  std::vector<std::uint8_t> mask{1, 0, 1};
  std::vector<TensorView> t{
      {"mask", DType::BOOL, {3}, bytes_of(mask)},
      {"conv.weight", DType::F32, {2, 3, 2, 2}, bytes_of(conv)},
      {"bn.running_var", DType::F32, {3}, bytes_of(var)},
      {"bn.num_batches_tracked", DType::I64, {}, bytes_of(tracked)},
  };
  std::string mine = serialize_safetensors(t);
  CHECK(header_of(mine) == header_of(reference));
  CHECK(mine == reference);
}

TEST_CASE("write then read round-trips every dtype, shapes and metadata", "[io][safetensors]") {
  TempDir dir;
  std::vector<double> a{1.0, -2.0, 3.5};
  std::vector<std::int32_t> b{7, -8, 9, 10, 11, 12};
  std::vector<std::uint8_t> c{255};
  std::vector<std::uint16_t> d{0x3f80, 0xbf80};  // bf16 1, -1
  std::vector<TensorView> t{{"a", DType::F64, {3}, bytes_of(a)},
                            {"b", DType::I32, {2, 1, 3}, bytes_of(b)},
                            {"c", DType::U8, {1, 1}, bytes_of(c)},
                            {"d", DType::BF16, {2}, bytes_of(d)}};
  Metadata meta{{"step", "100"}, {"options", "{\"lr\": 0.1}"}};
  save_safetensors(dir / "x.safetensors", t, meta);
  auto f = SafetensorsFile::load(dir / "x.safetensors");
  CHECK(f.metadata() == meta);
  CHECK(values<double>(f, "a") == a);
  CHECK(values<std::int32_t>(f, "b") == b);
  CHECK(f.at("b").shape == Shape{2, 1, 3});
  CHECK(values<std::uint8_t>(f, "c") == c);
  CHECK(f.at("d").dtype == DType::BF16);
  CHECK(values<std::uint16_t>(f, "d") == d);
  // Data starts 8-aligned and every tensor is aligned to its element size.
  std::string raw = read_file(dir / "x.safetensors");
  CHECK((8 + header_of(raw).size()) % 8 == 0);
  for (const auto& e : f.entries()) CHECK(e.begin % dtype_size(e.dtype) == 0);
}

TEST_CASE("metadata that is not UTF-8 (a Latin-1 path) is written with U+FFFD, not refused", "[io][safetensors]") {
  TempDir dir;
  std::vector<float> a{1.0f};
  std::vector<TensorView> t{{"a", DType::F32, {1}, bytes_of(a)}};
  save_safetensors(dir / "x.safetensors", t, {{"data_dir", "/data/caf\xe9"}});
  auto f = SafetensorsFile::load(dir / "x.safetensors");
  CHECK(f.metadata().at("data_dir") == "/data/caf\xef\xbf\xbd");
  CHECK(values<float>(f, "a") == a);
}

TEST_CASE("bad tensors to write are refused with their name", "[io][safetensors]") {
  std::vector<float> v(5);
  std::vector<TensorView> wrong_size{{"w", DType::F32, {2, 3}, bytes_of(v)}};
  CHECK_THROWS_WITH(serialize_safetensors(wrong_size),
                    Catch::Contains("\"w\"") && Catch::Contains("needs 24 bytes but 20"));
  std::vector<TensorView> dup{{"w", DType::F32, {5}, bytes_of(v)}, {"w", DType::F32, {5}, bytes_of(v)}};
  CHECK_THROWS_AS(serialize_safetensors(dup), tw::InvalidArgument);
  std::vector<TensorView> reserved{{"__metadata__", DType::F32, {5}, bytes_of(v)}};
  CHECK_THROWS_AS(serialize_safetensors(reserved), tw::InvalidArgument);
  CHECK_THROWS_WITH(parse_dtype("F17"), Catch::Contains("F17") && Catch::Contains("BF16"));
}

TEST_CASE("corrupt files raise DataError naming the field", "[io][safetensors]") {
  const std::string good = read_file(fixture("torch_plain.safetensors"));
  const std::string header = header_of(good);
  const std::string data = good.substr(8 + header.size());
  auto parse = [](std::string bytes) { return [b = std::move(bytes)] { SafetensorsFile::parse(b, "ckpt.safetensors"); }; };

  SECTION("a valid file parses") { CHECK_NOTHROW(parse(good)()); }
  SECTION("shorter than the length prefix") {
    CHECK_THAT(error_of(parse(good.substr(0, 5))), Catch::Contains("ckpt.safetensors") && Catch::Contains("truncated"));
  }
  SECTION("truncated inside the header") {
    CHECK_THAT(error_of(parse(good.substr(0, 100))), Catch::Contains("runs past the end"));
  }
  SECTION("truncated inside the data names the tensor cut off") {
    // The BOOL tensor "mask" comes last in the buffer (largest elements first).
    std::string msg = error_of(parse(good.substr(0, good.size() - 2)));
    CHECK_THAT(msg, Catch::Contains("\"mask\""));
    CHECK_THAT(msg, Catch::Contains("past the end"));
  }
  SECTION("a header length beyond any plausible file") {
    std::string b = good;
    b[7] = '\x7f';
    CHECK_THAT(error_of(parse(b)), Catch::Contains("100 MB"));
  }
  SECTION("header JSON that does not parse") {
    std::string h = header;
    h[h.find("\"shape\"")] = '\'';
    CHECK_THAT(error_of(parse(with_header(h, data))), Catch::Contains("not valid JSON"));
  }
  SECTION("header JSON with a number too large for a double (found by fuzz/safetensors)") {
    CHECK_THAT(error_of(parse(with_header(R"({"a": {"dtype": "F32", "shape": [1E400], "data_offsets": [0, 0]}})", ""))),
               Catch::Contains("not valid JSON") && Catch::Contains("number overflow"));
  }
  SECTION("header JSON that is not an object") {
    CHECK_THAT(error_of(parse(with_header("[1, 2]", ""))), Catch::Contains("not an object"));
  }
  SECTION("an unknown dtype") {
    std::string h = header;
    h.replace(h.find("\"F32\""), 5, "\"F31\"");
    std::string msg = error_of(parse(with_header(h, data)));
    CHECK_THAT(msg, Catch::Contains("\"dtype\"") && Catch::Contains("F31"));
  }
  SECTION("a shape that disagrees with the offsets") {
    std::string h = header;
    h.replace(h.find("[2,3,2,2]"), 9, "[2,3,2,3]");
    std::string msg = error_of(parse(with_header(h, data)));
    CHECK_THAT(msg, Catch::Contains("\"conv.weight\"") && Catch::Contains("[2, 3, 2, 3]") &&
                        Catch::Contains("needs 144 bytes"));
  }
  SECTION("a negative dimension") {
    std::string h = header;
    h.replace(h.find("[2,3,2,2]"), 9, "[-2,3,2,2]");
    CHECK_THAT(error_of(parse(with_header(h, data))), Catch::Contains("\"conv.weight\"") && Catch::Contains("\"shape\""));
  }
  SECTION("offsets out of range") {
    auto j = nlohmann::json::parse(header);
    j["mask"]["data_offsets"] = {116, 1000};
    j["mask"]["shape"] = {884};
    std::string msg = error_of(parse(with_header(j.dump(), data)));
    CHECK_THAT(msg, Catch::Contains("\"mask\"") && Catch::Contains("past the end"));
  }
  SECTION("overlapping offsets") {
    auto j = nlohmann::json::parse(header);
    auto off = j["bn.running_var"]["data_offsets"];
    j["bn.running_var"]["data_offsets"] = {off[0].get<int>() - 4, off[1].get<int>() - 4};
    CHECK_THAT(error_of(parse(with_header(j.dump(), data))), Catch::Contains("overlap"));
  }
  SECTION("offsets that leave bytes unaccounted for") {
    CHECK_THAT(error_of(parse(good + "xxxx")), Catch::Contains("extra bytes"));
  }
  SECTION("metadata that is not a map of strings") {
    auto j = nlohmann::json::parse(header);
    j["__metadata__"] = {{"step", 42}};
    CHECK_THAT(error_of(parse(with_header(j.dump(), data))), Catch::Contains("\"step\"") && Catch::Contains("string"));
  }
  SECTION("an entry without data_offsets") {
    auto j = nlohmann::json::parse(header);
    j["mask"].erase("data_offsets");
    CHECK_THAT(error_of(parse(with_header(j.dump(), data))), Catch::Contains("\"mask\"") && Catch::Contains("data_offsets"));
  }
}

TEST_CASE("load_into fills every slot or none", "[io][safetensors]") {
  auto f = SafetensorsFile::load(fixture("torch_plain.safetensors"));
  std::vector<float> conv(24, -9.0f), var(3, -9.0f);
  std::vector<std::int64_t> tracked{-9};
  std::vector<std::uint8_t> mask(3, 9);
  auto slots = [&](Shape conv_shape, DType var_dtype) {
    return std::vector<TensorSlot>{
        {"conv.weight", DType::F32, conv_shape, std::as_writable_bytes(std::span(conv))},
        {"bn.running_var", var_dtype, {3}, std::as_writable_bytes(std::span(var))},
        {"bn.num_batches_tracked", DType::I64, {}, std::as_writable_bytes(std::span(tracked))},
        {"mask", DType::BOOL, {3}, std::as_writable_bytes(std::span(mask))}};
  };
  auto untouched = [&] {
    for (float x : conv) if (x != -9.0f) return false;
    for (float x : var) if (x != -9.0f) return false;
    return tracked[0] == -9 && mask[0] == 9;
  };
  LoadOptions opts{.destination = "the model tiny"};

  SECTION("a shape mismatch names the tensor and both shapes, and writes nothing") {
    auto s = slots({2, 3, 4, 1}, DType::F32);
    CHECK_THROWS_WITH(load_into(f, s, opts), Catch::Contains("\"conv.weight\"") && Catch::Contains("[2, 3, 2, 2]") &&
                                                 Catch::Contains("[2, 3, 4, 1]") && Catch::Contains("the model tiny"));
    CHECK(untouched());
  }
  SECTION("a dtype mismatch names the tensor and both dtypes, and writes nothing") {
    auto s = slots({2, 3, 2, 2}, DType::I32);
    CHECK_THROWS_WITH(load_into(f, s, opts),
                      Catch::Contains("\"bn.running_var\"") && Catch::Contains("F32") && Catch::Contains("I32"));
    CHECK(untouched());
  }
  SECTION("a missing tensor is named") {
    auto s = slots({2, 3, 2, 2}, DType::F32);
    std::vector<float> extra(2);
    s.push_back({"fc.bias", DType::F32, {2}, std::as_writable_bytes(std::span(extra))});
    CHECK_THROWS_WITH(load_into(f, s, opts), Catch::Contains("\"fc.bias\"") && Catch::Contains("missing"));
    CHECK(untouched());
  }
  SECTION("strict loading refuses tensors the destination lacks; non-strict ignores them") {
    auto s = slots({2, 3, 2, 2}, DType::F32);
    s.pop_back();
    CHECK_THROWS_WITH(load_into(f, s, opts), Catch::Contains("\"mask\"") && Catch::Contains("does not have"));
    CHECK(untouched());
    load_into(f, s, {.strict = false});
    CHECK(mask[0] == 9);
    CHECK(tracked[0] == 17);
  }
  SECTION("a matching destination receives the values") {
    auto s = slots({2, 3, 2, 2}, DType::F32);
    load_into(f, s, opts);
    CHECK(conv[0] == -7.0f / 3.0f);
    CHECK(conv[23] == 16.0f / 3.0f);
    CHECK(var == std::vector<float>{0.5f, 1.25f, 2.0f});
    CHECK(tracked[0] == 17);
    CHECK(mask == std::vector<std::uint8_t>{1, 0, 1});
  }
}

TEST_CASE("a prefix selects a group of tensors in one file", "[io][safetensors]") {
  std::vector<float> m{1, 2}, s{3, 4};
  std::vector<TensorView> t{{"model.w", DType::F32, {2}, bytes_of(m)}, {"optim.w", DType::F32, {2}, bytes_of(s)}};
  auto f = SafetensorsFile::parse(serialize_safetensors(t), "mem");
  std::vector<float> out(2);
  std::vector<TensorSlot> slot{{"w", DType::F32, {2}, std::as_writable_bytes(std::span(out))}};
  load_into(f, slot, {.prefix = "optim."});
  CHECK(out == s);
  load_into(f, slot, {.prefix = "model."});
  CHECK(out == m);
}
