// SPDX-License-Identifier: Apache-2.0
// GPU memory support without a link-time CUDA dependency: libcuda is opened at run time, only when a GPU
// buffer is actually registered. The plugin must load (RTLD_NOW) on machines without any CUDA at all.
#pragma once

#include <string>

namespace weft::cuda {

// True when this build carries the GPU paths (CUDA toolkit found at configure time).
bool compiledIn();
// True when the CUDA driver (libcuda.so.1) can be loaded: a machine with an NVIDIA driver.
bool driverPresent();
// The CUDA device ordinal owning `ptr`, or -1 (and `why`) when it cannot be determined.
int deviceOfPointer(const void* ptr, const char** why);
// The PCI bus id ("0000:18:00.0") of the device that owns `ptr`, or of the calling thread's current context's
// device (NCCL's proxy threads make their rank's GPU current) when `ptr` is null; "" when there is none (no
// driver, no context, not a device pointer).
std::string busIdOf(const void* ptr);

// Copies between host memory and device memory through the driver (the RMA core's way into GPU windows: never a CPU
// load or store through a device pointer). They run on the calling thread's current context; where the thread has
// none (a thread NCCL did not set up), the context that owns the device pointer is made current first. Synchronous
// as the driver's cuMemcpyHtoD/DtoH are: a copy to the device returns once the source may be reused, its bytes
// land before any later copy on the same context does (the legacy stream's order). false and `err` on failure.
bool copyToDevice(void* dst, const void* src, size_t n, std::string* err);
bool copyFromDevice(void* dst, const void* src, size_t n, std::string* err);
// Waits until every copy issued to the device before has landed (cuCtxSynchronize): what a flush guarantees.
bool synchronize(std::string* err);

}  // namespace weft::cuda
