// Listen, send and receive comms over one libfabric endpoint each, and their pooled requests.
// Data path (isend/irecv/iflush/test): no allocation, no lock, no syscall of ours; one bounded batch of
// completions per call.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fabric/fabric_endpoint.h"
#include "weft/transport/tag_seq.h"

namespace weft::fabric {

class FabricDataComm;

class FabricRequest final : public Request {
 public:
  Status test(bool* done, int* sizes) override;

  FabricDataComm* comm = nullptr;
  uint16_t poolIndex = 0;
  uint8_t n = 0;          // buffers (1 for sends)
  uint8_t posted = 0;     // sub-operations handed to libfabric so far
  uint8_t completed = 0;  // sub-operations finished (successfully or not)
  bool recv = false;
  Status error = Status::kOk;
  int sizes[kMaxRecvs] = {};
  void* data[kMaxRecvs] = {};
  size_t len[kMaxRecvs] = {};
  uint64_t tag[kMaxRecvs] = {};
  void* desc[kMaxRecvs] = {};
  OpContext ctx[kMaxRecvs];
};

// What send and receive comms share: the endpoint, the peer, the request pool, progress and completion.
class FabricDataComm : public DataSink {
 public:
  FabricDataComm(std::unique_ptr<Endpoint> ep, fi_addr_t peer, std::string peerName, int poolSize);
  ~FabricDataComm() override;

  Status testRequest(FabricRequest* r, bool* done, int* sizes);
  void onComplete(OpContext* ctx, size_t len) noexcept override;
  void onError(OpContext* ctx, Status st) noexcept override;

 protected:
  FabricRequest* acquire();
  void release(FabricRequest* r);
  Status progress();
  Status postPending(FabricRequest* r);  // receives only: sub-operations the provider pushed back on
  Status regOnDevice(void* data, size_t size, int type, MemHandle** out);
  Status deregOnDevice(MemHandle* mh);
  Status checkHandle(const MemHandle* mh, const char* op) const;

  FabricDevice& dev_;
  std::unique_ptr<Endpoint> ep_;
  fi_addr_t peer_;
  std::string peerName_;
  std::unique_ptr<FabricRequest[]> pool_;
  std::vector<uint16_t> free_;  // capacity reserved up front: push/pop never allocate
  TagSequence seqs_;
  Status fatal_ = Status::kOk;  // once set, every call on this comm fails with it

  // Liveness (see checkPeer), looked at once per 1024 progress calls while requests are outstanding.
  void checkPeer();
  int outstanding_ = 0;
  uint32_t completions_ = 0;      // every completion, success or error
  uint32_t completionsSeen_ = 0;  // completions_ at checkPeer's last look
  uint32_t polls_ = 0;
  int64_t lastActivityMs_ = 0;
  int64_t probeSentMs_ = 0;
  int64_t probeIntervalMs_;
  int64_t peerTimeoutMs_;
};

class FabricSendComm final : public SendComm, public FabricDataComm {
 public:
  FabricSendComm(std::unique_ptr<Endpoint> ep, fi_addr_t peer, std::string peerName, int maxRecvs);
  Status isend(void* data, size_t size, int tag, MemHandle* mh, Request** request) override;
  Status regMr(void* data, size_t size, int type, MemHandle** out) override { return regOnDevice(data, size, type, out); }
  Status regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out) override;
  Status deregMr(MemHandle* mh) override { return deregOnDevice(mh); }

 private:
  bool inject_;
};

class FabricRecvComm final : public RecvComm, public FabricDataComm {
 public:
  FabricRecvComm(std::unique_ptr<Endpoint> ep, fi_addr_t peer, std::string peerName, int maxRecvs);
  Status irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs, Request** request) override;
  Status iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) override;
  Status regMr(void* data, size_t size, int type, MemHandle** out) override { return regOnDevice(data, size, type, out); }
  Status regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out) override;
  Status deregMr(MemHandle* mh) override { return deregOnDevice(mh); }

 private:
  int maxRecvs_;
};

class FabricListenComm final : public ListenComm {
 public:
  FabricListenComm(std::unique_ptr<Endpoint> ep, uint64_t token, int maxRecvs);
  Status accept(RecvComm** recvComm) override;

 private:
  FabricDevice& dev_;
  std::unique_ptr<Endpoint> ep_;  // handed to the recv comm on accept
  uint64_t token_;
  int maxRecvs_;
  bool accepted_ = false;
  bool replying_ = false;  // accepted; waiting for the reply to leave before handing out the recv comm
  fi_addr_t peer_ = FI_ADDR_UNSPEC;
  std::string peerName_;
};

}  // namespace weft::fabric
