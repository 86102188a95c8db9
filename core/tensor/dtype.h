#pragma once
// DType: the element types a Tensor may hold. float32 is what every op computes in; int32 holds
// labels and pooling indices, uint8 dropout masks; bfloat16 the activations that batch norm
// stores for the convolution after it under bf16 precision (Note [bf16 activations] in ops.cc),
// which convolutions read and no other op; float16 is reserved.

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

namespace towerflow {

enum class DType : std::uint8_t { kFloat32, kInt32, kUInt8, kBFloat16, kFloat16 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kUInt8:
      return 1;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
  }
  return 0;
}

constexpr std::string_view to_string(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kInt32: return "int32";
    case DType::kUInt8: return "uint8";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << to_string(t); }

// A bfloat16 as its bits, the top half of a float32's: the element of a kBFloat16 tensor.
enum class bfloat16 : std::uint16_t {};

// The DType of a C++ element type, for Tensor::data<T>() checks.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <>
constexpr DType dtype_of<std::int32_t>() { return DType::kInt32; }
template <>
constexpr DType dtype_of<std::uint8_t>() { return DType::kUInt8; }
template <>
constexpr DType dtype_of<bfloat16>() { return DType::kBFloat16; }

}  // namespace towerflow
