// SPDX-License-Identifier: Apache-2.0
// Built as a plugin table file is (it links weft_engine only): including a backend's header must fail to build,
// because the engine links the backends PRIVATE and alone chooses them (CMakeLists.txt, weft_engine). ctest
// layering.plugin_table_cannot_include_a_backend expects exactly that error.
#include "plugin/engine.h"
#include "tcp/tcp_rma.h"
