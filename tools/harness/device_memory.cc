// SPDX-License-Identifier: Apache-2.0
#include "device_memory.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "../mock_cuda/mock_cuda.h"
#include "crash_report.h"

namespace weft::harness {

namespace {

constexpr int kRangeHandleDmaBuf = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

std::string cuError(void* lib, int rc) {
  using ErrStr = int (*)(int, const char**);
  auto fn = reinterpret_cast<ErrStr>(dlsym(lib, "cuGetErrorString"));
  const char* s = nullptr;
  if (fn != nullptr && fn(rc, &s) == 0 && s != nullptr) return std::string(s) + " (" + std::to_string(rc) + ")";
  return "CUDA error " + std::to_string(rc);
}

void* gCtx = nullptr;  // the primary context of device 0
int (*gSetCurrent)(void*) = nullptr;

void makeCurrent() {
  if (gSetCurrent != nullptr) gSetCurrent(gCtx);
}

}  // namespace

CudaDriver* CudaDriver::get(std::string* why) {
  static CudaDriver* driver = nullptr;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    auto* d = new CudaDriver();
    if (d->load(&failure)) {
      driver = d;
    } else {
      delete d;
    }
  });
  if (driver == nullptr && why != nullptr) *why = failure;
  return driver;
}

bool CudaDriver::load(std::string* why) {
  lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) {
    *why = "no CUDA driver: libcuda.so.1 could not be loaded (a GPU machine, or the mock: LD_LIBRARY_PATH=<build>/"
           "mock-cuda)";
    return false;
  }
  auto sym = [&](const char* name) { return dlsym(lib_, name); };
  auto init = reinterpret_cast<int (*)(unsigned)>(sym("cuInit"));
  auto devGet = reinterpret_cast<int (*)(int*, int)>(sym("cuDeviceGet"));
  auto retain = reinterpret_cast<int (*)(void**, int)>(sym("cuDevicePrimaryCtxRetain"));
  gSetCurrent = reinterpret_cast<int (*)(void*)>(sym("cuCtxSetCurrent"));
  memAlloc_ = reinterpret_cast<decltype(memAlloc_)>(sym("cuMemAlloc_v2"));
  memFree_ = reinterpret_cast<decltype(memFree_)>(sym("cuMemFree_v2"));
  htod_ = reinterpret_cast<decltype(htod_)>(sym("cuMemcpyHtoD_v2"));
  dtoh_ = reinterpret_cast<decltype(dtoh_)>(sym("cuMemcpyDtoH_v2"));
  memset_ = reinterpret_cast<decltype(memset_)>(sym("cuMemsetD8_v2"));
  handle_ = reinterpret_cast<decltype(handle_)>(sym("cuMemGetHandleForAddressRange"));
  window_ = reinterpret_cast<decltype(window_)>(sym("weftMockCudaCpuWindow"));
  stats_ = reinterpret_cast<decltype(stats_)>(sym("weftMockCudaGetStats"));
  if (init == nullptr || devGet == nullptr || retain == nullptr || gSetCurrent == nullptr || memAlloc_ == nullptr ||
      memFree_ == nullptr || htod_ == nullptr || dtoh_ == nullptr || memset_ == nullptr) {
    *why = "libcuda.so.1 lacks the driver calls the harness uses (cuMemAlloc_v2, cuMemcpyHtoD_v2, ...)";
    return false;
  }
  int dev = -1, rc = init(0);
  if (rc == 0) rc = devGet(&dev, 0);
  if (rc == 0) rc = retain(&gCtx, dev);
  if (rc != 0) {
    *why = "the CUDA driver has no usable device 0: " + cuError(lib_, rc);
    return false;
  }
  return true;
}

uint8_t* CudaDriver::alloc(size_t size) {
  makeCurrent();
  unsigned long long p = 0;
  int rc = memAlloc_(&p, size == 0 ? 1 : size);
  if (rc != 0) throw std::runtime_error("cuMemAlloc(" + std::to_string(size) + " B): " + cuError(lib_, rc));
  return reinterpret_cast<uint8_t*>(p);
}

void CudaDriver::free(uint8_t* p) {
  makeCurrent();
  memFree_(reinterpret_cast<unsigned long long>(p));
}

void CudaDriver::toDevice(uint8_t* dst, const void* src, size_t n) {
  if (n == 0) return;
  makeCurrent();
  int rc = htod_(reinterpret_cast<unsigned long long>(dst), src, n);
  if (rc != 0) throw std::runtime_error("cuMemcpyHtoD: " + cuError(lib_, rc));
}

void CudaDriver::toHost(void* dst, const uint8_t* src, size_t n) {
  if (n == 0) return;
  makeCurrent();
  int rc = dtoh_(dst, reinterpret_cast<unsigned long long>(src), n);
  if (rc != 0) throw std::runtime_error("cuMemcpyDtoH: " + cuError(lib_, rc));
}

void CudaDriver::set(uint8_t* dst, uint8_t v, size_t n) {
  if (n == 0) return;
  makeCurrent();
  int rc = memset_(reinterpret_cast<unsigned long long>(dst), v, n);
  if (rc != 0) throw std::runtime_error("cuMemsetD8: " + cuError(lib_, rc));
}

// As NCCL does (src/transport/net.cc, ncclNetRegMr path in v2.28.9): the range handed to the driver is the
// buffer widened to whole pages; the plugin gets the offset of the buffer inside it.
int CudaDriver::dmabuf(const uint8_t* p, size_t size, uint64_t* offset, std::string* why) {
  if (handle_ == nullptr) {
    *why = "this CUDA driver has no cuMemGetHandleForAddressRange";
    return -1;
  }
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + size + page - 1) & ~(page - 1);
  makeCurrent();
  int fd = -1;
  int rc = handle_(&fd, begin, end - begin, kRangeHandleDmaBuf, 0);
  if (rc != 0) {
    *why = "cuMemGetHandleForAddressRange: " + cuError(lib_, rc) +
           (mock() ? " (the mock exports dma-bufs through /dev/udmabuf)" : "");
    return -1;
  }
  *offset = reinterpret_cast<uintptr_t>(p) - begin;
  return fd;
}

void CudaDriver::cpuWindow(const void* p, size_t len, bool open) {
  if (window_ != nullptr && window_(p, len, open ? 1 : 0) != 0)
    throw std::runtime_error("the mock CUDA driver refused a registration window");
}

long long CudaDriver::flushCount() const {
  if (stats_ == nullptr) return -1;
  WeftMockCudaStats s{};
  stats_(&s);
  return static_cast<long long>(s.flushes);
}

namespace {

int (*gOwns)(const void*, uintptr_t*, size_t*) = nullptr;
struct sigaction gPrevious;

void onFault(int sig, siginfo_t* si, void* uc) {
  uintptr_t base = 0;
  size_t size = 0;
  if (gOwns != nullptr && gOwns(si->si_addr, &base, &size) == 1) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "\nweft conformance: the CPU touched device memory at %p (byte %zu of a %zu-byte device "
                  "allocation): a GPU would fault here too. Stack:\n",
                  si->si_addr, static_cast<size_t>(reinterpret_cast<uintptr_t>(si->si_addr) - base), size);
    writeStderr(line, std::strlen(line));
    void* frames[48];
    int n = backtrace(frames, 48);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    _exit(86);
  }
  // Not ours: the default action (a core, the usual report).
  sigaction(sig, &gPrevious, nullptr);
  (void)uc;
}

}  // namespace

void installDeviceFaultReport() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == nullptr) return;
    gOwns = reinterpret_cast<decltype(gOwns)>(dlsym(lib, "weftMockCudaOwns"));
    if (gOwns == nullptr) return;
    const struct sigaction sa = faultAction(onFault);
    sigaction(SIGSEGV, &sa, &gPrevious);
  });
}

}  // namespace weft::harness
