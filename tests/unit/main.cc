// SPDX-License-Identifier: Apache-2.0
// The unit tests' main (Catch2's implementation is tests/support/catch_impl.cc): a run in which cases skipped, and
// none failed, exits 77 (tests/support/skip.h).
#include <catch2/catch.hpp>

#include "tests/support/skip.h"

int main(int argc, char** argv) { return weft::testing::runResult(Catch::Session().run(argc, argv)); }
