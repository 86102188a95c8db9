#include "io/crc32c.h"

#include <boost/crc.hpp>

namespace towerflow::io {

std::uint32_t crc32c(std::span<const std::byte> data) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

std::uint32_t crc32c(std::string_view data) { return crc32c(std::as_bytes(std::span(data.data(), data.size()))); }

}  // namespace towerflow::io
