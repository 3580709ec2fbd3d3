// SPDX-License-Identifier: Apache-2.0
// libibverbs, opened at run time: the plugin must load (and use libfabric) on machines without rdma-core, so no
// ibv_* symbol is linked. Only set-up calls go through this table; the data path (ibv_post_send, ibv_post_recv,
// ibv_poll_cq) are rdma-core's inline functions that call through the device context's own ops.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace weft::verbs {

struct IbvApi {
  bool loaded = false;
  std::string error;  // why not loaded

  ibv_device** (*getDeviceList)(int*) = nullptr;
  void (*freeDeviceList)(ibv_device**) = nullptr;
  const char* (*getDeviceName)(ibv_device*) = nullptr;
  __be64 (*getDeviceGuid)(ibv_device*) = nullptr;
  ibv_context* (*openDevice)(ibv_device*) = nullptr;
  int (*closeDevice)(ibv_context*) = nullptr;
  int (*queryDevice)(ibv_context*, ibv_device_attr*) = nullptr;
  // The exported symbol takes rdma-core's compat port attributes, a prefix of ibv_port_attr (link_layer included).
  int (*queryPort)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;
  int (*queryGid)(ibv_context*, uint8_t, int, ibv_gid*) = nullptr;
  ibv_pd* (*allocPd)(ibv_context*) = nullptr;
  int (*deallocPd)(ibv_pd*) = nullptr;
  ibv_mr* (*regMr)(ibv_pd*, void*, size_t, int) = nullptr;
  ibv_mr* (*regMrIova2)(ibv_pd*, void*, size_t, uint64_t, unsigned) = nullptr;           // optional (rdma-core 29+)
  ibv_mr* (*regDmabufMr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int) = nullptr;       // optional (rdma-core 34+)
  int (*deregMr)(ibv_mr*) = nullptr;
  ibv_cq* (*createCq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroyCq)(ibv_cq*) = nullptr;
  ibv_qp* (*createQp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*modifyQp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  int (*destroyQp)(ibv_qp*) = nullptr;
  int (*getAsyncEvent)(ibv_context*, ibv_async_event*) = nullptr;
  void (*ackAsyncEvent)(ibv_async_event*) = nullptr;
  const char* (*wcStatusStr)(ibv_wc_status) = nullptr;
  const char* (*eventTypeStr)(ibv_event_type) = nullptr;
};

// Loaded once (thread-safe); `loaded` false with `error` when libibverbs.so.1 or a required symbol is missing.
const IbvApi& ibv();

}  // namespace weft::verbs
