// SPDX-License-Identifier: Apache-2.0
// weft report --hangs (hangs.cc): the stall dumps of every rank joined into a wait-for graph (docs/hangs.md).
#pragma once

#include <string>

namespace weft::tool {

// Reads every stall dump under `dir` (recursively), prints the cause first, then who waits on whom (or one JSON
// object with asJson). 0: a report was printed; 1: no dumps; 2: `dir` is not a folder.
int hangsReport(const std::string& dir, bool asJson);

}  // namespace weft::tool
