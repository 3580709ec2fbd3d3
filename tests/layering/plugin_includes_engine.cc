// SPDX-License-Identifier: Apache-2.0
// The control for layering.plugin_table_cannot_include_a_backend: built the same way (linking weft_engine only), what
// the table files use is found (the engine, the RMA core, the shared transport headers), so the other probe fails for
// its backend include alone.
#include "plugin/device_props.h"
#include "plugin/engine.h"
#include "rma/rma.h"
#include "weft/transport/net.h"

int weftLayeringPluginControl() { return weft::rma::kCommMagic != 0 ? 1 : 0; }
