// SPDX-License-Identifier: Apache-2.0
#pragma once

namespace weft {
inline constexpr const char* kVersionString = "0.1.0";
}
