// The tuner's decision state as the transports' handshake carries it (weft/transport/agreement.h): a digest of
// everything that changes what the tuner decides and is not the same on every rank by construction.
#pragma once

#include "weft/transport/agreement.h"

namespace weft::tuner {

// The settings that change decisions (WEFT_TUNER, WEFT_TUNER_MARGIN, WEFT_TUNER_EXPLORE, WEFT_TUNER_FORCE) and
// the profile: its bytes, or that it cannot be read. Two ranks with equal digests make the same decisions for the
// same communicator (the policy depends only on rank-consistent inputs besides these). Digest 0 (unchecked) with
// WEFT_TUNER_CHECK=0, or when NCCL_TUNER_PLUGIN names another tuner (this library's is then not used).
transport::Agreement decisionState();

}  // namespace weft::tuner
