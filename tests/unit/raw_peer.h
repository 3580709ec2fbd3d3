// SPDX-License-Identifier: Apache-2.0
// The smallest raw libfabric peer for unit tests that play another process (an older weft, a hostile sender):
// one RDM endpoint over tcp;ofi_rxm bound to loopback, with its queue and address vector, closed in reverse order.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

#include <cstring>

namespace weft::testing {

// The smallest raw peer: one RDM endpoint with its queue and address vector, closed in reverse order.
struct RawPeer {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* ep = nullptr;
  fid_mr* mr = nullptr;
  ~RawPeer() {
    if (mr) fi_close(&mr->fid);
    if (ep) fi_close(&ep->fid);
    if (av) fi_close(&av->fid);
    if (cq) fi_close(&cq->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
  }
  bool open() {
    fi_info* hints = fi_allocinfo();
    hints->caps = FI_TAGGED | FI_SEND | FI_RECV;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
    // Bound to loopback: this test touches no other address.
    int rc = fi_getinfo(FI_VERSION(1, 14), "127.0.0.1", nullptr, FI_SOURCE, hints, &info);
    fi_freeinfo(hints);
    if (rc != 0) return false;
    fi_cq_attr cqa{};
    cqa.format = FI_CQ_FORMAT_TAGGED;
    fi_av_attr ava{};
    ava.type = FI_AV_TABLE;
    return fi_fabric(info->fabric_attr, &fabric, nullptr) == 0 && fi_domain(fabric, info, &domain, nullptr) == 0 &&
           fi_cq_open(domain, &cqa, &cq, nullptr) == 0 && fi_av_open(domain, &ava, &av, nullptr) == 0 &&
           fi_endpoint(domain, info, &ep, nullptr) == 0 && fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) == 0 &&
           fi_ep_bind(ep, &av->fid, 0) == 0 && fi_enable(ep) == 0;
  }
};

}  // namespace weft::testing
