// SPDX-License-Identifier: Apache-2.0
// A stand-in for the CUDA driver (libcuda.so.1) on machines without a GPU, so the GPU memory paths of a net
// plugin run here. Built as libcuda.so.1 in its own folder: put that folder first in LD_LIBRARY_PATH and weft,
// the harness and anything else that opens "libcuda.so.1" get it.
//
// What it does, as the driver would:
// - cuMemAlloc hands out "device" memory the CPU cannot touch: each allocation is a memfd mapped twice, once at
//   the device address (PROT_NONE) and once privately for the mock's own copies (cuMemcpyHtoD/DtoH, cuMemsetD8).
//   A CPU load or store through a device pointer faults, as it would on a GPU: that is the poisoning that proves
//   no path of the plugin (inline sends, inject, bounce copies, fills, logging) reads device memory.
// - cuPointerGetAttribute/cuMemGetAddressRange answer for those allocations (device 0) and fail for host memory.
// - cuMemGetHandleForAddressRange exports a real dma-buf (udmabuf over the memfd) where /dev/udmabuf exists.
// - cuFlushGPUDirectRDMAWrites and cuCtxSynchronize are counted.
// - The runtime entry points libfabric 2.x's CUDA memory support opens (libcudart.so: this same file under that
//   name beside it): one device, cudaMalloc/cudaFree over cuMemAlloc, cudaMemcpy through the mock's own mapping,
//   no CUDA IPC (libfabric's shm then copies).
//
// What the driver does not do, and the harness asks for through the entry points below:
// - A registration window. The soft-RoCE NIC pins pages through the CPU mapping (as nvidia-peermem pins GPU
//   pages through its own), so the device address is opened to the CPU for the regMr call only.
// - Ownership and counters, for the fault report and the checks.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct WeftMockCudaStats {
  uint64_t allocations;     // live device allocations
  uint64_t dmabufExports;   // dma-buf fds handed out
  uint64_t flushes;         // cuFlushGPUDirectRDMAWrites calls
  uint64_t cpuWindows;      // registration windows opened
  uint64_t runtimeCopies;   // cudaMemcpy calls (the runtime's entry points, for libfabric's CUDA memory support)
  uint64_t synchronizes;    // cuCtxSynchronize calls
};

// Opens (on != 0) or closes the CPU's access to the device allocation holding [ptr, ptr + len). Windows nest.
// 0, or a CUresult error when the range is not inside one allocation.
int weftMockCudaCpuWindow(const void* ptr, size_t len, int on);
// 1 when `addr` lies in a device allocation (its base and size returned), else 0. Async-signal-safe.
int weftMockCudaOwns(const void* addr, uintptr_t* base, size_t* size);
void weftMockCudaGetStats(WeftMockCudaStats* out);

}  // extern "C"
