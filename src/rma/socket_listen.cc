// SPDX-License-Identifier: Apache-2.0
// The listen comm of the device API's socket-set-up transports (TCP, verbs): its handle and connect's checks.
#include <sys/socket.h>

#include "rma/rma.h"
#include "weft/common/log.h"
#include "weft/common/netif.h"

namespace weft::rma {

RmaListen* SocketListen::publish(int dev, oob::Listener l, BackendId backend, uint32_t providerHash,
                                 const std::string& devName, void* handle) {
  l.handle(backend, providerHash, handle);
  WEFT_INFO(NCCL_NET, "RMA: listening on {} at {}", devName,
            sockaddrString(reinterpret_cast<const sockaddr*>(&l.addr)));
  return new SocketListen(dev, std::move(l));
}

SocketListen* SocketListen::forConnect(void* const* handles, int nranks, int rank, RmaListen* listen,
                                       RmaComm** out) {
  auto* own = dynamic_cast<SocketListen*>(listen);
  if (handles == nullptr || out == nullptr || own == nullptr || nranks < 1 || rank < 0 || rank >= nranks) {
    WEFT_WARN("RMA connect: called with rank {} of {}, handles {}, listen comm {}", rank, nranks,
              static_cast<const void*>(handles), static_cast<const void*>(listen));
    return nullptr;
  }
  return own;
}

}  // namespace weft::rma
