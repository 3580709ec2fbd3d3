// `weft info`: what this machine offers weft and how weft is configured, or what a plugin file exports.
#include <rdma/fabric.h>

#include <cstdio>
#include <string>

#include "fabric/fabric_backend.h"
#include "verbs/verbs_backend.h"
#include "plugin_loader.h"
#include "weft/common/params.h"
#include "weft/version.h"

namespace weft::tool {
namespace {

int pluginInfo(const std::string& path) {
  std::string error;
  auto p = harness::LoadedPlugin::open(path, 0, &error);
  if (!p) {
    std::fprintf(stderr, "weft info: %s\n", error.c_str());
    return 2;
  }
  std::printf("plugin %s: name '%s', tables", path.c_str(), p->api().name());
  for (int v : p->exported()) std::printf(" v%d", v);
  std::printf("\n");
  void* ctx = nullptr;
  int n = 0;
  if (p->api().init(&ctx, 1) != ncclSuccess || p->api().devices(&n) != ncclSuccess) {
    std::printf("init/devices failed\n");
    return 1;
  }
  for (int d = 0; d < n; ++d) {
    harness::Props pr;
    if (p->api().getProperties(d, &pr) != ncclSuccess) continue;
    std::printf("  dev %d: %s speed %d Mb/s latency %.1f us maxRecvs %d ptrSupport %#x pci %s", d, pr.name.c_str(),
                pr.speed, pr.latency, pr.maxRecvs, pr.ptrSupport, pr.pciPath.empty() ? "-" : pr.pciPath.c_str());
    if (pr.railId != -2) std::printf(" rail %d plane %d", pr.railId, pr.planeId);  // v12 (-1: undefined)
    std::printf("\n");
  }
  if (p->api().hasFinalize()) p->api().finalize(ctx);
  return 0;
}

}  // namespace

int info(int argc, char** argv) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--plugin") return pluginInfo(argv[i + 1]);
  }
  uint32_t v = fi_version();
  std::printf("weft %s; libfabric %u.%u at run time (built against %d.%d)\n\n", kVersionString, FI_MAJOR(v),
              FI_MINOR(v), FI_MAJOR_VERSION, FI_MINOR_VERSION);
  std::printf("providers with reliable tagged endpoints:\n");
  for (const char* prov : {"efa", "verbs;ofi_rxm", "tcp;ofi_rxm", "tcp", "sockets", "shm"}) {
    std::string why;
    auto found = fabric::probe(prov, &why);
    std::printf("  %-14s ", prov);
    if (found.empty()) {
      std::printf("-\n");
      continue;
    }
    for (const auto& c : found) std::printf("%s ", c.props.name.c_str());
    std::printf("\n");
  }
  std::printf("\nnative verbs (ibverbs) ports:\n");
  std::string vwhy;
  auto vb = verbs::VerbsBackend::discover(&vwhy);
  if (!vb) {
    std::printf("  none: %s\n", vwhy.c_str());
  } else {
    for (int d = 0; d < vb->deviceCount(); ++d) {
      const auto& p = vb->props(d);
      std::printf("  %d: %-10s %-18s %6d Mb/s  maxRecvs %d  ptrSupport %#x  pci %s\n", d, p.name.c_str(),
                  p.provider.c_str(), p.speedMbps, p.maxRecvs, p.ptrSupport, p.pciPath.empty() ? "-" : p.pciPath.c_str());
    }
  }
  const std::string& which = params::getString("WEFT_BACKEND");
  std::printf("\ndevices weft offers NCCL with this environment (WEFT_BACKEND=%s):\n", which.c_str());
  if (which != "fabric" && vb) {
    std::printf("  the native verbs ports above\n");
  } else if (which == "verbs") {
    std::printf("  none: WEFT_BACKEND=verbs and %s\n", vwhy.c_str());
  }
  std::string why;
  auto backend = (which == "verbs" || (which == "auto" && vb)) ? nullptr : fabric::FabricBackend::discover(&why);
  if (which == "verbs" || (which == "auto" && vb)) {
    // listed above
  } else if (!backend) {
    std::printf("  none: %s\n", why.c_str());
  } else {
    for (int d = 0; d < backend->deviceCount(); ++d) {
      const auto& p = backend->props(d);
      const auto& dev = backend->device(d);
      std::printf("  %d: %-10s %-12s %6d Mb/s  rails %d  maxRecvs %d  ptrSupport %#x  protocol %s (eager <= %zu B)  pci %s\n",
                  d, p.name.c_str(), p.provider.c_str(), p.speedMbps, backend->railCount(d), p.maxRecvs, p.ptrSupport,
                  dev.rdma() ? (dev.compactImm() ? "rdma(cq4)" : "rdma") : "sendrecv", dev.rdma() ? dev.eagerMax() : size_t{0},
                  p.pciPath.empty() ? "-" : p.pciPath.c_str());
    }
  }
  std::printf("\nvariables:\n");
  for (const auto& val : params::values()) {
    std::printf("  %-22s = %-14s (%s%s)\n      %s\n", val.def->name, ("'" + val.raw + "'").c_str(),
                val.fromEnv ? "environment" : "default", val.valid ? "" : (", INVALID: " + val.error).c_str(),
                val.def->doc);
  }
  std::printf("\nsettings of libfabric and rdma-core that weft chooses where the environment has none:\n");
  for (const auto& fs : params::applyForeignDefaults()) {
    std::printf("  %-22s = %-14s (%s)\n      %s\n", fs.def->name, ("'" + fs.value + "'").c_str(),
                fs.fromUser ? "environment, kept" : "weft's default", fs.def->why);
  }
  auto problems = params::problems();
  for (const auto& p : problems) std::printf("problem: %s\n", p.c_str());
  return problems.empty() ? 0 : 1;
}

}  // namespace weft::tool
