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
}  // namespace

TEST_CASE("the plugin exports the net tables v7..v12 and no other symbol of ours", "[plugin]") {
  std::string syms = run(std::string("nm -D --defined-only ") + WEFT_PLUGIN_PATH + " | awk '{print $3}'");
  for (int v = 7; v <= 12; ++v) CHECK(syms.find("ncclNetPlugin_v" + std::to_string(v) + "\n") != std::string::npos);
  size_t lines = 0, pos = 0;
  while ((pos = syms.find('\n', pos)) != std::string::npos) {
    ++lines;
    ++pos;
  }
  INFO(syms);
  CHECK(lines == 6);  // nothing of fmt, libstdc++ or weft's internals leaks out
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
  CHECK(v11->makeVDevice == nullptr);
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
