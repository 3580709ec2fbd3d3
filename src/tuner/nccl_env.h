// SPDX-License-Identifier: Apache-2.0
// NCCL_ALGO and NCCL_PROTO, read the way NCCL reads them, and what they keep the tuner from doing. NCCL turns an
// algorithm or protocol they disable into IGNORE in the cost table it hands the tuner, so a tuner choice there
// cannot take effect, and users are not told (NVIDIA/nccl#1661). The tuner says so at init instead.
#pragma once

#include <string>
#include <vector>

#include "tuner/policy.h"
#include "tuner/profile.h"

namespace weft::tuner {

struct NcclEnables {
  bool algo[kNumColls][kNumAlgos];
  bool proto[kNumColls][kNumProtos];
  NcclEnables();  // everything enabled (neither variable set)
  bool allows(int coll, int algo, int proto) const;
};

// As NCCL 2.28 parses them (src/graph/tuning.cc, parseList): a comma list of names (case-insensitive), "^" in
// front to name what to disable instead; optionally per collective after the first entry, "ring,tree;allreduce:
// ^ring" (each collective entry replaces that collective's whole list). nullptr or "": not set. False, with *why,
// for a value NCCL itself refuses (its init then fails).
bool parseNcclEnables(const char* algoEnv, const char* protoEnv, NcclEnables* out, std::string* why);

// What the policy would choose that the enables rule out, one line each for the log: the fastest measured choice
// per collective and size range ("AllReduce 64 KiB-4 MiB: RING/LL128"), rules, the forced choice, and collectives
// whose recorded table (the profile's signature) offered what is now disabled (the tuner then leaves them to NCCL
// entirely). Empty: the variables take nothing from the tuner.
std::vector<std::string> blockedChoices(const Policy& p, const NcclEnables& e);

}  // namespace weft::tuner
