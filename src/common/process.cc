// SPDX-License-Identifier: Apache-2.0
#include "weft/common/process.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace weft {

uint64_t pidNamespace() {
  char link[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
  if (n <= 0) return 0;
  const char* open = std::strchr(link, '[');
  return open != nullptr ? std::strtoull(open + 1, nullptr, 10) : 0;
}

}  // namespace weft
