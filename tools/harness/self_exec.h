// SPDX-License-Identifier: Apache-2.0
// The weft tool run by a check from inside a worker (every worker is the weft binary: /proc/self/exe), and the
// stall dumps a check looks for: what the net checks (checks_stall.cc) and the device-API checks (rma_checks.cc)
// share of `weft inspect` and `weft report --hangs`.
#pragma once

#include <string>

namespace weft::harness {

// `weft ARGS` (quoted by the caller), stdout and stderr together.
std::string runWeft(const std::string& args);
// A dump of process `pid` in DIR/hangs (weft-<host>-<pid>-<n>.json).
bool hasDump(const std::string& dir, int pid);
// `weft report --hangs DIR`: its output.
std::string reportHangs(const std::string& dir);

}  // namespace weft::harness
