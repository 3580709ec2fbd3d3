// SPDX-License-Identifier: Apache-2.0
// The control for layering.backend_cannot_include_another: built the same way (linking weft_tcp only), the TCP
// backend's own headers and the shared ones are found, so the other probe fails for its include alone.
#include "tcp/tcp_backend.h"
#include "tcp/tcp_comm.h"
#include "weft/transport/net.h"

int weftLayeringControl() { return weft::tcp::kMaxRails; }
