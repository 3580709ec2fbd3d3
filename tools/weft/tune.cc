// SPDX-License-Identifier: Apache-2.0
// weft tune ...: the tuner's tools, one file per subcommand (tune_<name>.cc; what they share is tune_common.h).
//   sim       simulated worlds: sweep, decide, score against NCCL's default and the oracle (no GPU needed)
//   show      the decision table of a profile for a topology, NCCL's default beside it (--plot: SVG heatmap)
//   sweep     run a command (nccl-tests) once per candidate, forced through the tuner, parse it, write a profile
//   nccl-sim  NCCL's tuner calls through the real plugin file in a simulated world, printed as nccl-tests prints
//   eval      a profile scored in a simulated world
//   check     one tuner decision state in every rank's NCCL log
// and weft profile merge (tune_merge.cc): a profile from weft's per-rank timing records.
#include "tune_common.h"

namespace weft::tool {
namespace tune {

std::vector<uint64_t> powersOfTwo(uint64_t lo, uint64_t hi) {
  std::vector<uint64_t> v;
  for (uint64_t n = lo; n <= hi; n *= 2) v.push_back(n);
  return v;
}

bool gCcGiven = false;

bool topoOption(harness::Args& a, model::Topology& t) {
  const std::string& f = a.flag();
  if (f == "--ranks") t.nRanks = a.number(1, 1 << 20);
  else if (f == "--nodes") t.nNodes = a.number(1, 1 << 20);
  else if (f == "--channels") t.nChannels = a.number(1, 64);
  else if (f == "--bw-intra") t.bwIntra = a.number(1, 10000);
  else if (f == "--bw-inter") t.bwInter = a.number(1, 10000);
  else if (f == "--cc") {
    const std::string v = a.value();
    t.cc = model::compCapFromName(v.c_str());
    gCcGiven = true;
    if (t.cc < 0) {
      std::fprintf(stderr, "weft tune: --cc '%s': want volta, ampere, hopper, blackwell, rubin or 0 to 4\n", v.c_str());
      std::exit(2);
    }
  }
  else if (f == "--amd") t.amdCpu = true;
  else if (f == "--nvls") t.nvls = true;
  else if (f == "--no-ll128") t.ll128 = false;
  else if (f == "--pci") t.nvlinkIntra = false;
  else return false;
  return true;
}

void modelFromProfile(const Profile& p, model::Topology* t) {
  if (p.constants) t->constants = &*p.constants;
  if (p.sig.cc >= 0 && !gCcGiven) t->cc = p.sig.cc;
}

std::string sizeLabel(uint64_t n) { return svg::bytesLabel(static_cast<double>(n)); }

}  // namespace tune

using namespace tune;

int tuneCommand(int argc, char** argv);
int profileCommand(int argc, char** argv);

int profileCommand(int argc, char** argv) {
  std::string sub = argc >= 3 ? argv[2] : "";
  if (sub == "merge") return mergeCommand(argc, argv);
  std::fprintf(stderr, "usage: weft profile merge DIR --out PROFILE [--ranks N --nodes M]\n");
  return 2;
}

int tuneCommand(int argc, char** argv) {
  std::string sub = argc >= 3 ? argv[2] : "";
  if (sub == "sim") return simCommand(argc, argv);
  if (sub == "show") return showCommand(argc, argv);
  if (sub == "sweep") return sweepCommand(argc, argv);
  if (sub == "nccl-sim") return ncclSimCommand(argc, argv);
  if (sub == "eval") return evalCommand(argc, argv);
  if (sub == "check") return checkCommand(argc, argv);
  std::fprintf(stderr, "usage: weft tune sim|show|sweep|nccl-sim|eval|check ... (weft help)\n");
  return 2;
}

}  // namespace weft::tool