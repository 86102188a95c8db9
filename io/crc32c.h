#pragma once
// CRC-32C (Castagnoli, the iSCSI polynomial 0x1EDC6F41, reflected, init and final XOR all ones):
// the checksum of TensorBoard's TFRecord framing (summary_writer.h) and of the tensors in a
// towerflow checkpoint (safetensors.h, with_checksums). crc32c("123456789") == 0xE3069283.
// Boost.CRC's table-driven implementation; pure, thread-safe.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace towerflow::io {

std::uint32_t crc32c(std::string_view data);
std::uint32_t crc32c(std::span<const std::byte> data);

}  // namespace towerflow::io
