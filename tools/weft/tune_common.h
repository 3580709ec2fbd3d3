// SPDX-License-Identifier: Apache-2.0
// What weft tune's subcommands share (tools/weft/tune_*.cc, one per subcommand; tune.cc dispatches).
#pragma once

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <strings.h>

#include <algorithm>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <tuple>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "args.h"
#include "svg.h"
#include "tuner/agreement.h"
#include "tuner/nccl_model.h"
#include "tuner/policy.h"
#include "tuner/profile.h"
#include "tuner/sim.h"
#include "weft/nccl/tuner.h"
#include "weft/telemetry/record_reader.h"

namespace weft::tool::tune {

using namespace weft::tuner;

std::vector<uint64_t> powersOfTwo(uint64_t lo, uint64_t hi);
extern bool gCcGiven;  // --cc was given (a profile's own compute capability then does not replace it)
// The topology flags every subcommand takes (--ranks, --nodes, --cc, ...): false when `a`'s flag is not one.
bool topoOption(harness::Args& a, model::Topology& t);
// A profile recorded by the tuner carries NCCL's own constants (and may name the GPUs' compute capability): the
// reference model uses them, unless --cc chose the capability.
void modelFromProfile(const Profile& p, model::Topology* t);
std::string sizeLabel(uint64_t n);

int simCommand(int argc, char** argv);
int showCommand(int argc, char** argv);
int sweepCommand(int argc, char** argv);
int ncclSimCommand(int argc, char** argv);
int evalCommand(int argc, char** argv);
int mergeCommand(int argc, char** argv);
int checkCommand(int argc, char** argv);

}  // namespace weft::tool::tune
