// SPDX-License-Identifier: Apache-2.0
// What the two ends of a connection must agree on beyond the wire protocol. In the combined library that is the
// tuner's decision state: ranks that tune differently pick different algorithms for one collective, and NCCL
// then hangs without a word (a profile missing or damaged on one node, another WEFT_TUNER_* setting). The plugin
// installs the source (plugin/net_plugin.cc: tuner/agreement.h); the transports carry its digest in their
// connection handshake and refuse a connection whose peer's digest differs, naming both, so that NCCL's init fails
// with a message instead.
#pragma once

#include <cstdint>
#include <string>

namespace weft::transport {

struct Agreement {
  uint64_t digest = 0;  // 0: nothing to check (no source installed, or the check is off)
  std::string summary;  // what this process's digest stands for, for messages
};

using AgreementSource = Agreement (*)();

// Installs the source (nullptr: none) and forgets a digest computed before.
void setAgreementSource(AgreementSource source);
// This process's agreement: computed on first use and kept (a source reads files; connections are many).
Agreement localAgreement();
uint64_t localDigest();  // localAgreement().digest, for the handshake
// Whether a peer's digest lets the connection go ahead: equal, or either side unchecked (0).
bool agreesWith(uint64_t peerDigest);
// The error both ends log when the digests differ.
std::string agreementMismatch(uint64_t peerDigest, const std::string& peer);

}  // namespace weft::transport
