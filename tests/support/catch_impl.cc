// SPDX-License-Identifier: Apache-2.0
// Catch2's own implementation (Debian's 2.13 is one header), compiled once for the three Catch2 programs. Each
// program's main is its own (tests/unit/main.cc, tests/profiler/profiler_test.cc, tests/tuner/driver_test.cc) and
// includes <catch2/catch.hpp> like any case file: the implementation took 30-50 s of compiling in each.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
