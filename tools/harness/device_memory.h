// SPDX-License-Identifier: Apache-2.0
// Device-typed buffers for the checks (weft conformance --mem cuda): memory from the CUDA driver that whatever
// libcuda.so.1 the loader finds hands out, a real GPU's or the mock's (tools/mock_cuda). The harness never
// touches it with the CPU: it fills and verifies through the driver's copies. Under the mock, a CPU access
// through a device pointer faults; the fault handler installed here names the allocation and the code that
// touched it before the worker dies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft::harness {

enum class MemKind { kHost, kCuda };

class CudaDriver {
 public:
  // The process's driver, loaded and initialised on first use; nullptr (and why) when there is none.
  static CudaDriver* get(std::string* why);
  bool mock() const { return window_ != nullptr; }
  uint8_t* alloc(size_t size);  // throws on failure
  void free(uint8_t* p);
  void toDevice(uint8_t* dst, const void* src, size_t n);
  void toHost(void* dst, const uint8_t* src, size_t n);
  void set(uint8_t* dst, uint8_t v, size_t n);
  // A dma-buf fd for [p, p + size) as NCCL asks for one (page-aligned range around the buffer; offset of p in
  // it); -1 and why when the driver cannot export one.
  int dmabuf(const uint8_t* p, size_t size, uint64_t* offset, std::string* why);
  // The mock's registration window (see mock_cuda.h); nothing on a real driver.
  void cpuWindow(const void* p, size_t len, bool open);
  // cuFlushGPUDirectRDMAWrites calls so far (the mock counts them; -1 on a real driver).
  long long flushCount() const;

 private:
  CudaDriver() = default;
  bool load(std::string* why);
  void* lib_ = nullptr;
  int (*memAlloc_)(unsigned long long*, size_t) = nullptr;
  int (*memFree_)(unsigned long long) = nullptr;
  int (*htod_)(unsigned long long, const void*, size_t) = nullptr;
  int (*dtoh_)(void*, unsigned long long, size_t) = nullptr;
  int (*memset_)(unsigned long long, unsigned char, size_t) = nullptr;
  int (*handle_)(void*, unsigned long long, size_t, int, unsigned long long) = nullptr;
  int (*window_)(const void*, size_t, int) = nullptr;
  void (*stats_)(void*) = nullptr;
};

// Installs (once) the handler that reports a CPU access to mock device memory. Nothing on a real driver.
void installDeviceFaultReport();

}  // namespace weft::harness
