// SPDX-License-Identifier: Apache-2.0
// The shared library as NCCL sees it: loadable with RTLD_NOW|RTLD_LOCAL, exporting exactly the plugin tables,
// named statically, and declining (not failing) init when it has nothing to offer.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "weft/nccl/net.h"

namespace {
std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  pclose(p);
  return out;
}
void quietLogger(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...) {}
}  // namespace

TEST_CASE("the plugin exports the net tables v7..v12, the profiler tables v1..v7, the tuner tables v2..v7, "
          "the device API's GIN v11..v13 and RMA v13..v17 tables, weftNetStat and no other symbol of ours",
          "[plugin]") {
  std::string syms = run(std::string("nm -D --defined-only ") + WEFT_PLUGIN_PATH + " | awk '{print $3}'");
  for (int v = 7; v <= 12; ++v) CHECK(syms.find("ncclNetPlugin_v" + std::to_string(v) + "\n") != std::string::npos);
  for (int v = 1; v <= 7; ++v) CHECK(syms.find("ncclProfiler_v" + std::to_string(v) + "\n") != std::string::npos);
  for (int v = 2; v <= 7; ++v) CHECK(syms.find("ncclTunerPlugin_v" + std::to_string(v) + "\n") != std::string::npos);
  for (int v = 11; v <= 13; ++v) CHECK(syms.find("ncclGinPlugin_v" + std::to_string(v) + "\n") != std::string::npos);
  for (int v = 13; v <= 17; ++v) CHECK(syms.find("ncclRmaPlugin_v" + std::to_string(v) + "\n") != std::string::npos);
  CHECK(syms.find("weftNetStat\n") != std::string::npos);  // weft's own figures for tools (weft conformance)
  size_t lines = 0, pos = 0;
  while ((pos = syms.find('\n', pos)) != std::string::npos) {
    ++lines;
    ++pos;
  }
  INFO(syms);
  CHECK(lines == 28);  // nothing of fmt, libstdc++ or weft's internals leaks out
}

TEST_CASE("libnccl-tuner-weft.so exports the tuner tables v2..v7 only", "[plugin]") {
  std::string syms = run(std::string("nm -D --defined-only ") + WEFT_TUNER_LIB_PATH + " | awk '{print $3}'");
  INFO(syms);
  CHECK(syms == "ncclTunerPlugin_v2\nncclTunerPlugin_v3\nncclTunerPlugin_v4\nncclTunerPlugin_v5\nncclTunerPlugin_v6\nncclTunerPlugin_v7\n");
  void* lib = dlopen(WEFT_TUNER_LIB_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
}

TEST_CASE("libnccl-profiler-weft.so exports the profiler tables v1..v7 only and needs no libfabric", "[plugin]") {
  std::string syms = run(std::string("nm -D --defined-only ") + WEFT_PROFILER_LIB_PATH + " | awk '{print $3}'");
  INFO(syms);
  CHECK(syms == "ncclProfiler_v1\nncclProfiler_v2\nncclProfiler_v3\nncclProfiler_v4\nncclProfiler_v5\nncclProfiler_v6\nncclProfiler_v7\n");
  std::string deps = run(std::string("objdump -p ") + WEFT_PROFILER_LIB_PATH + " | grep NEEDED");
  INFO(deps);
  CHECK(deps.find("fabric") == std::string::npos);
  CHECK(deps.find("stdc++") == std::string::npos);
  void* lib = dlopen(WEFT_PROFILER_LIB_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
}

TEST_CASE("the plugin loads as NCCL loads it and its name is readable before init", "[plugin]") {
  void* lib = dlopen(WEFT_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  auto* v11 = static_cast<ncclNet_v11_t*>(dlsym(lib, "ncclNetPlugin_v11"));
  REQUIRE(v11 != nullptr);
  CHECK(std::string(v11->name) == "weft");
  CHECK(v11->finalize != nullptr);  // required for v11: NCCL calls it unchecked
  CHECK(v11->getDeviceMr == nullptr);
  CHECK(v11->irecvConsumed == nullptr);
  CHECK(v11->makeVDevice != nullptr);  // NIC fusion (v9+)
}

// NIC fusion the way NCCL runs it at topology detection: every device becomes (the root of) a virtual device,
// devices() then counts physical + virtual, and a virtual device's properties list its members.
TEST_CASE("makeVDevice appends fused devices and refuses impossible ones", "[plugin]") {
  setenv("WEFT_PROVIDER", "tcp;ofi_rxm", 1);
  setenv("WEFT_IFACE", "lo", 1);
  void* lib = dlopen(WEFT_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  auto* net = static_cast<ncclNet_v9_t*>(dlsym(lib, "ncclNetPlugin_v9"));
  REQUIRE(net != nullptr);
  REQUIRE(net->init(quietLogger) == ncclSuccess);
  int n = 0;
  REQUIRE(net->devices(&n) == ncclSuccess);
  REQUIRE(n == 1);  // loopback only
  ncclNetProperties_v9_t base{};
  REQUIRE(net->getProperties(0, &base) == ncclSuccess);

  ncclNetVDeviceProps_v9_t vp{};
  vp.ndevs = 1;
  vp.devs[0] = 0;
  int d = -1;
  REQUIRE(net->makeVDevice(&d, &vp) == ncclSuccess);
  CHECK(d == 1);
  REQUIRE(net->devices(&n) == ncclSuccess);
  CHECK(n == 2);
  ncclNetProperties_v9_t p{};
  REQUIRE(net->getProperties(d, &p) == ncclSuccess);
  CHECK(p.vProps.ndevs == 1);
  CHECK(p.vProps.devs[0] == 0);
  CHECK(p.speed == base.speed);
  CHECK(std::string(p.name) == std::string(base.name));
  CHECK(net->getProperties(0, &p) == ncclSuccess);
  CHECK(p.vProps.ndevs == 1);  // a physical device is its own
  CHECK(p.vProps.devs[0] == 0);

  vp.ndevs = 2;
  vp.devs[0] = 0;
  vp.devs[1] = 1;  // the same NIC again, through the virtual device
  CHECK(net->makeVDevice(&d, &vp) != ncclSuccess);
  vp.ndevs = 1;
  vp.devs[0] = 7;
  CHECK(net->makeVDevice(&d, &vp) != ncclSuccess);
  vp.ndevs = 0;
  CHECK(net->makeVDevice(&d, &vp) != ncclSuccess);
  vp.ndevs = 5;  // more than a v9 vProps holds
  CHECK(net->makeVDevice(&d, &vp) != ncclSuccess);
  REQUIRE(net->devices(&n) == ncclSuccess);
  CHECK(n == 2);  // nothing was added by the refused calls
}

TEST_CASE("the library depends on nothing a GPU-less or CUDA-less machine lacks", "[plugin]") {
  std::string deps = run(std::string("ldd ") + WEFT_PLUGIN_PATH);
  INFO(deps);
  CHECK(deps.find("not found") == std::string::npos);
  CHECK(deps.find("libcuda") == std::string::npos);
  CHECK(deps.find("libcudart") == std::string::npos);
  CHECK(deps.find("libstdc++") == std::string::npos);
  CHECK(deps.find("libfmt") == std::string::npos);
}
