// SPDX-License-Identifier: Apache-2.0
// Runs the Catch2 cases linked into this program with its command line (Catch::Session().run): what a Catch2
// program's own main calls, the implementation being compiled once in tests/support/catch_impl.cc.
#pragma once

namespace weft::testing {
int runCatch(int argc, char** argv);
}  // namespace weft::testing
