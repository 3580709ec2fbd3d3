// SPDX-License-Identifier: Apache-2.0
#include "weft/transport/agreement.h"

#include <fmt/format.h>

#include <mutex>

namespace weft::transport {
namespace {

std::mutex gMutex;
AgreementSource gSource = nullptr;
bool gComputed = false;
Agreement gLocal;

}  // namespace

void setAgreementSource(AgreementSource source) {
  std::lock_guard<std::mutex> lock(gMutex);
  gSource = source;
  gComputed = false;
  gLocal = Agreement{};
}

namespace {
const Agreement& computedLocked() {
  if (!gComputed) {
    gLocal = gSource != nullptr ? gSource() : Agreement{};
    gComputed = true;
  }
  return gLocal;
}
}  // namespace

Agreement localAgreement() {
  std::lock_guard<std::mutex> lock(gMutex);
  return computedLocked();
}

uint64_t localDigest() {
  std::lock_guard<std::mutex> lock(gMutex);
  return computedLocked().digest;
}

bool agreesWith(uint64_t peerDigest) {
  const uint64_t mine = localDigest();
  return peerDigest == 0 || mine == 0 || peerDigest == mine;
}

std::string agreementMismatch(uint64_t peerDigest, const std::string& peer) {
  Agreement self = localAgreement();
  return fmt::format(
      "the tuner would decide differently at the two ends of this connection: this process {:016x} ({}), peer {} "
      "{:016x} (its log says what it loaded). Ranks that tune differently pick different algorithms and NCCL hangs, "
      "so the connection is refused. Give every rank the same WEFT_TUNER* settings and the same profile file "
      "(WEFT_TUNER_PROFILE), or set WEFT_TUNER_CHECK=0 where NCCL does not use this library's tuner",
      self.digest, self.summary, peer, peerDigest);
}

}  // namespace weft::transport
