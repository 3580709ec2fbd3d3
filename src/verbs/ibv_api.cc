// SPDX-License-Identifier: Apache-2.0
#include "verbs/ibv_api.h"

#include <dlfcn.h>

namespace weft::verbs {
namespace {

IbvApi load() {
  IbvApi a;
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    a.error = std::string("libibverbs.so.1 cannot be opened (rdma-core not installed?): ") + (e ? e : "");
    return a;
  }
  bool ok = true;
  auto need = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (fn == nullptr) {
      ok = false;
      a.error += std::string(a.error.empty() ? "libibverbs lacks " : ", ") + name;
    }
  };
  auto want = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
  };
  need(a.getDeviceList, "ibv_get_device_list");
  need(a.freeDeviceList, "ibv_free_device_list");
  need(a.getDeviceName, "ibv_get_device_name");
  need(a.getDeviceGuid, "ibv_get_device_guid");
  need(a.openDevice, "ibv_open_device");
  need(a.closeDevice, "ibv_close_device");
  need(a.queryDevice, "ibv_query_device");
  need(a.queryPort, "ibv_query_port");
  need(a.queryGid, "ibv_query_gid");
  need(a.allocPd, "ibv_alloc_pd");
  need(a.deallocPd, "ibv_dealloc_pd");
  need(a.regMr, "ibv_reg_mr");
  want(a.regMrIova2, "ibv_reg_mr_iova2");
  want(a.regDmabufMr, "ibv_reg_dmabuf_mr");
  need(a.deregMr, "ibv_dereg_mr");
  need(a.createCq, "ibv_create_cq");
  need(a.destroyCq, "ibv_destroy_cq");
  need(a.createQp, "ibv_create_qp");
  need(a.modifyQp, "ibv_modify_qp");
  need(a.destroyQp, "ibv_destroy_qp");
  need(a.getAsyncEvent, "ibv_get_async_event");
  need(a.ackAsyncEvent, "ibv_ack_async_event");
  need(a.wcStatusStr, "ibv_wc_status_str");
  need(a.eventTypeStr, "ibv_event_type_str");
  a.loaded = ok;  // the library stays open for the life of the process (the plugin is never unloaded)
  return a;
}

}  // namespace

const IbvApi& ibv() {
  static const IbvApi api = load();
  return api;
}

}  // namespace weft::verbs
