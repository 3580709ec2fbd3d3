// SPDX-License-Identifier: Apache-2.0
// Catch2's own implementation (Debian's 2.13 is one header), compiled once for the three Catch2 programs; it took
// 30-50 s of compiling in each. Catch2 2.x declares Catch::Session only where the implementation is compiled, so the
// programs' mains (tests/unit/main.cc, tests/profiler/profiler_test.cc, tests/tuner/driver_test.cc) run it
// through runCatch (tests/support/catch_run.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/support/catch_run.h"

int weft::testing::runCatch(int argc, char** argv) { return Catch::Session().run(argc, argv); }
