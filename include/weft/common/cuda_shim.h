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

}  // namespace weft::cuda
