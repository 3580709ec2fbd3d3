// SPDX-License-Identifier: Apache-2.0
// The mock CUDA driver (tools/mock_cuda) the GPU-memory conformance runs stand on: device memory the CPU cannot
// touch, copies that can, pointer attributes, registration windows, dma-buf export where the kernel has udmabuf;
// and weft's own CUDA shim answering through it (it opens "libcuda.so.1", which the loader resolves to the mock
// already loaded under that soname).
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "../../tools/mock_cuda/mock_cuda.h"
#include "weft/common/cuda_shim.h"

namespace {

struct Mock {
  void* lib = dlopen(WEFT_MOCK_CUDA_PATH, RTLD_NOW | RTLD_GLOBAL);
  template <typename F>
  F fn(const char* name) {
    void* p = lib ? dlsym(lib, name) : nullptr;
    REQUIRE(p != nullptr);
    return reinterpret_cast<F>(p);
  }
};

// Runs `touch` in a child process: its exit status, or 128 + the signal that ended it.
template <typename F>
int inChild(F touch) {
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);  // Catch's handler would report and exit 1
    touch();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("mock CUDA driver: device memory faults on CPU access, copies and attributes work", "[mock_cuda]") {
  Mock m;
  REQUIRE(m.lib != nullptr);
  auto init = m.fn<int (*)(unsigned)>("cuInit");
  auto alloc = m.fn<int (*)(unsigned long long*, size_t)>("cuMemAlloc_v2");
  auto release = m.fn<int (*)(unsigned long long)>("cuMemFree_v2");
  auto htod = m.fn<int (*)(unsigned long long, const void*, size_t)>("cuMemcpyHtoD_v2");
  auto dtoh = m.fn<int (*)(void*, unsigned long long, size_t)>("cuMemcpyDtoH_v2");
  auto attr = m.fn<int (*)(void*, int, unsigned long long)>("cuPointerGetAttribute");
  auto handle = m.fn<int (*)(void*, unsigned long long, size_t, int, unsigned long long)>("cuMemGetHandleForAddressRange");
  auto window = m.fn<decltype(&weftMockCudaCpuWindow)>("weftMockCudaCpuWindow");
  auto owns = m.fn<decltype(&weftMockCudaOwns)>("weftMockCudaOwns");

  unsigned long long d = 0;
  CHECK(alloc(&d, 4096) == 3);  // CUDA_ERROR_NOT_INITIALIZED before cuInit
  REQUIRE(init(0) == 0);
  REQUIRE(alloc(&d, 10000) == 0);
  auto* p = reinterpret_cast<volatile uint8_t*>(d);

  std::vector<uint8_t> in(10000), out(10000, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7);
  REQUIRE(htod(d + 0, in.data(), in.size()) == 0);
  REQUIRE(dtoh(out.data(), d, out.size()) == 0);
  CHECK(out == in);
  CHECK(htod(d + 9000, in.data(), 2000) == 1);  // past the allocation

  // The CPU cannot read or write device memory: a fault, as on a GPU. Inside a registration window it can.
  CHECK(inChild([&] { (void)p[100]; }) == 128 + SIGSEGV);
  CHECK(inChild([&] { p[5000] = 1; }) == 128 + SIGSEGV);
  REQUIRE(window(reinterpret_cast<const void*>(d + 64), 512, 1) == 0);
  CHECK(inChild([&] { _exit(p[100] == in[100] ? 0 : 1); }) == 0);
  REQUIRE(window(reinterpret_cast<const void*>(d + 64), 512, 0) == 0);
  CHECK(inChild([&] { (void)p[100]; }) == 128 + SIGSEGV);
  CHECK(window(reinterpret_cast<const void*>(d), 512, 0) != 0);  // no window open
  uint8_t host[64];
  CHECK(window(host, sizeof(host), 1) != 0);                      // not device memory

  int ordinal = -1;
  unsigned type = 0;
  unsigned long long start = 0;
  size_t size = 0;
  CHECK(attr(&ordinal, 9, d + 123) == 0);  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
  CHECK(ordinal == 0);
  CHECK(attr(&type, 2, d) == 0);  // MEMORY_TYPE: device
  CHECK(type == 2);
  CHECK(attr(&start, 11, d + 5000) == 0);
  CHECK(start == d);
  CHECK(attr(&size, 12, d) == 0);
  CHECK(size == 10000);
  CHECK(attr(&ordinal, 9, reinterpret_cast<unsigned long long>(host)) == 1);  // host memory: CUDA_ERROR_INVALID_VALUE

  uintptr_t base = 0;
  size_t bytes = 0;
  CHECK(owns(reinterpret_cast<const void*>(d + 9999), &base, &bytes) == 1);
  CHECK(base == d);
  CHECK(owns(host, &base, &bytes) == 0);

  // dma-buf: page-aligned ranges only; a real fd where the kernel has udmabuf, else "not supported".
  int fd = -1;
  CHECK(handle(&fd, d + 1, 4096, 1, 0) == 1);
  int rc = handle(&fd, d, 8192, 1, 0);
  if (access("/dev/udmabuf", R_OK | W_OK) == 0) {
    REQUIRE(rc == 0);
    CHECK(fd >= 0);
    close(fd);
  } else {
    CHECK(rc == 801);  // CUDA_ERROR_NOT_SUPPORTED
  }

  // weft's shim resolves "libcuda.so.1" to the mock loaded above.
  if (weft::cuda::compiledIn()) {
    CHECK(weft::cuda::driverPresent());
    const char* why = nullptr;
    CHECK(weft::cuda::deviceOfPointer(reinterpret_cast<void*>(d + 10), &why) == 0);
    CHECK(weft::cuda::deviceOfPointer(host, &why) == -1);
    REQUIRE(why != nullptr);
    CHECK(std::string(why).find("not a CUDA device pointer") != std::string::npos);
  }

  CHECK(release(d) == 0);
  CHECK(release(d) == 1);  // freed twice
  CHECK(owns(reinterpret_cast<const void*>(d), &base, &bytes) == 0);
}

TEST_CASE("weft's CUDA shim names a GPU by its PCI bus id: the current context's, or a device pointer's",
          "[mock_cuda][topology]") {
  Mock m;
  REQUIRE(m.lib != nullptr);
  auto init = m.fn<int (*)(unsigned)>("cuInit");
  auto alloc = m.fn<int (*)(unsigned long long*, size_t)>("cuMemAlloc_v2");
  auto release = m.fn<int (*)(unsigned long long)>("cuMemFree_v2");
  REQUIRE(init(0) == 0);
  // The driver writes an 8-digit domain; weft keeps hwloc's and sysfs's 4, lower case.
  setenv("MOCK_CUDA_PCI_BUS_ID", "0000:1B:00.0", 1);
  CHECK(weft::cuda::busIdOf(nullptr) == "0000:1b:00.0");
  unsigned long long d = 0;
  REQUIRE(alloc(&d, 4096) == 0);
  CHECK(weft::cuda::busIdOf(reinterpret_cast<const void*>(d + 100)) == "0000:1b:00.0");
  uint8_t host[16];
  CHECK(weft::cuda::busIdOf(host).empty());  // host memory: no GPU
  unsetenv("MOCK_CUDA_PCI_BUS_ID");
  CHECK(weft::cuda::busIdOf(nullptr) == "0000:01:00.0");
  CHECK(release(d) == 0);
}
