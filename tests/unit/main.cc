// SPDX-License-Identifier: Apache-2.0
// The unit tests' main (Catch2's implementation is tests/support/catch_impl.cc): a run in which cases skipped, and
// none failed, exits 77 (tests/support/skip.h).
#include "tests/support/catch_run.h"
#include "tests/support/skip.h"

int main(int argc, char** argv) { return weft::testing::runResult(weft::testing::runCatch(argc, argv)); }
