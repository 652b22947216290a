// SHA-256 (FIPS 180-4), to record which calibration text a quantised checkpoint was made from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace futransformer {

// Lower-case hex digest of `size` bytes.
std::string sha256_hex(const void* data, size_t size);

}  // namespace futransformer
