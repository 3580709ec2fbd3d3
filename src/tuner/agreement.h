// SPDX-License-Identifier: Apache-2.0
// The tuner's decision state as the transports' handshake carries it (weft/transport/agreement.h): a digest of
// everything that changes what the tuner decides and is not the same on every rank by construction.
#pragma once

#include <istream>
#include <string>
#include <vector>

#include "weft/transport/agreement.h"

namespace weft::tuner {

// The settings that change decisions (WEFT_TUNER, WEFT_TUNER_MARGIN, WEFT_TUNER_EXPLORE, WEFT_TUNER_FORCE) and
// the profile: its bytes, or that it cannot be read. Two ranks with equal digests make the same decisions for the
// same communicator (the policy depends only on rank-consistent inputs besides these). Digest 0 (unchecked) with
// WEFT_TUNER_CHECK=0, or when NCCL_TUNER_PLUGIN names another tuner (this library's is then not used).
transport::Agreement decisionState();

// The tuner logs its state once per process at INFO (NCCL_DEBUG=INFO), in both libraries:
//   "<kStateTag><16 hex digits>: <summary>"
// so that the logs of every rank can be checked for agreement (weft tune check), where the handshake does not
// check it (the standalone tuner library).
constexpr const char* kStateTag = "tuner decision state ";
std::string stateLine(const transport::Agreement& a);

struct LoggedState {
  std::string who;  // "host:pid" from NCCL's line prefix ("host:pid:tid [dev] NCCL INFO"), else "FILE:LINE"
  uint64_t digest = 0;
  std::string summary;
};
// Every state line in a log; the same process logged twice counts once.
std::vector<LoggedState> scanLog(std::istream& in, const std::string& name);

}  // namespace weft::tuner
