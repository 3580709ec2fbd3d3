// SPDX-License-Identifier: Apache-2.0
// QP errors mid-stream over real verbs (run inside the soft-RoCE guest by tests/rxe/guest_tests.sh): two processes
// connected through weft's verbs backend exchange data, then one side's QPs are moved to the error state with
// requests pending on both sides. Every pending request must fail within a bound, the broken comms must close
// without hanging, and a new connection must carry data afterwards. Round 1 breaks the receiver's QPs, round 2
// the sender's. Exit 0: pass; 1: fail; 77: no RDMA device here (skip).
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "verbs/verbs_backend.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"

using namespace weft;
using namespace weft::verbs;
using Clock = std::chrono::steady_clock;

namespace {

int gSock = -1;

transport::Agreement digestA() { return transport::Agreement{0xA1, "test digest A"}; }
transport::Agreement digestB() { return transport::Agreement{0xB2, "test digest B"}; }
const char* gRole = "?";

[[noreturn]] void die(const std::string& what) {
  std::printf("FAIL [%s] %s\n", gRole, what.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

void sendMsg(const void* p, size_t n) {
  if (::write(gSock, p, n) != static_cast<ssize_t>(n)) die("socket write");
}
void recvMsg(void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(gSock, static_cast<char*>(p) + got, n - got);
    if (r <= 0) die("the other process went away");
    got += static_cast<size_t>(r);
  }
}
void sync(const char* tag) {
  char c = tag[0], d = 0;
  sendMsg(&c, 1);
  recvMsg(&d, 1);
  if (d != c) die(std::string("out of step at ") + tag);
}

void fill(std::vector<char>& b, int seed) {
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
}

// Polls a request until done or error; returns the status and the time it took.
Status wait(Request* r, double* ms, double limitS) {
  auto t0 = Clock::now();
  for (;;) {
    bool done = false;
    int sizes[kMaxRecvs];
    Status st = r->test(&done, sizes);
    *ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (st != Status::kOk || done) return st;
    if (*ms > limitS * 1000) die("a request neither completed nor failed within " + std::to_string(limitS) + " s");
  }
}

struct Pair {
  SendComm* s = nullptr;
  RecvComm* r = nullptr;
};

Pair connect(VerbsBackend& b, bool recv) {
  Pair p;
  uint8_t handle[kHandleSize];
  ListenComm* l = nullptr;
  auto t0 = Clock::now();
  if (recv) {
    if (b.listen(0, CommConfig{}, handle, &l) != Status::kOk) die("listen");
    sendMsg(handle, sizeof(handle));
    while (p.r == nullptr) {
      if (l->accept(&p.r) != Status::kOk) die("accept");
      if (Clock::now() - t0 > std::chrono::seconds(60)) die("accept timed out");
    }
    delete l;
  } else {
    recvMsg(handle, sizeof(handle));
    while (p.s == nullptr) {
      if (b.connect(0, CommConfig{}, handle, &p.s) != Status::kOk) die("connect");
      if (Clock::now() - t0 > std::chrono::seconds(60)) die("connect timed out");
    }
  }
  return p;
}

// `count` messages of `size` bytes, checked.
void stream(Pair& p, bool recv, int count, size_t size, int seed) {
  std::vector<char> buf(size);
  Comm* c = recv ? static_cast<Comm*>(p.r) : static_cast<Comm*>(p.s);
  MemHandle* mh = nullptr;
  if (c->regMr(buf.data(), buf.size(), NCCL_PTR_HOST, &mh) != Status::kOk) die("regMr");
  for (int i = 0; i < count; ++i) {
    Request* req = nullptr;
    auto t0 = Clock::now();
    if (recv) {
      void* data[1] = {buf.data()};
      size_t sz[1] = {size};
      int tag[1] = {1};
      while (req == nullptr) {
        if (p.r->irecv(1, data, sz, tag, &mh, false, &req) != Status::kOk) die("irecv");
      }
    } else {
      fill(buf, seed + i);
      while (req == nullptr) {
        if (p.s->isend(buf.data(), size, 1, mh, &req) != Status::kOk) die("isend");
        if (Clock::now() - t0 > std::chrono::seconds(60)) die("isend never posted");
      }
    }
    double ms = 0;
    if (wait(req, &ms, 60) != Status::kOk) die("a message failed on a healthy connection");
    if (recv) {
      std::vector<char> want(size);
      fill(want, seed + i);
      if (std::memcmp(want.data(), buf.data(), size) != 0) die("a message arrived corrupted");
    }
  }
  if (c->deregMr(mh) != Status::kOk) die("deregMr");
}

void breakQps(Pair& p, bool recv) {
  auto* dc = recv ? static_cast<VerbsDataComm*>(static_cast<VerbsRecvComm*>(p.r))
                  : static_cast<VerbsDataComm*>(static_cast<VerbsSendComm*>(p.s));
  for (int i = 0; i < dc->qpCount(); ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (ibv().modifyQp(dc->qpForTest(i), &a, IBV_QP_STATE) != 0) die("moving a QP to the error state failed");
  }
}

int run(bool recv) {
  gRole = recv ? "recv" : "send";
  std::string why;
  auto b = VerbsBackend::discover(&why);
  if (!b) {
    std::printf("SKIP [%s] %s\n", gRole, why.c_str());
    std::fflush(stdout);
    return 77;
  }
  const size_t kSize = 64 << 10;
  for (int round = 0; round < 2; ++round) {
    const bool victim = (round == 0) == recv;  // round 0: the receiver's QPs break; round 1: the sender's
    Pair p = connect(*b, recv);
    stream(p, recv, 8, kSize, round * 100);
    // Four receives posted, two messages delivered, two pending when the QPs break.
    std::vector<char> buf(4 * kSize);
    Comm* c = recv ? static_cast<Comm*>(p.r) : static_cast<Comm*>(p.s);
    MemHandle* mh = nullptr;
    if (c->regMr(buf.data(), buf.size(), NCCL_PTR_HOST, &mh) != Status::kOk) die("regMr");
    std::vector<Request*> reqs;
    if (recv) {
      for (int i = 0; i < 4; ++i) {
        void* data[1] = {buf.data() + i * kSize};
        size_t sz[1] = {kSize};
        int tag[1] = {2};
        Request* r = nullptr;
        while (r == nullptr)
          if (p.r->irecv(1, data, sz, tag, &mh, false, &r) != Status::kOk) die("irecv");
        reqs.push_back(r);
      }
    }
    sync("posted");
    if (!recv) {
      for (int i = 0; i < 2; ++i) {
        Request* r = nullptr;
        auto t0 = Clock::now();
        while (r == nullptr) {
          if (p.s->isend(buf.data() + i * kSize, kSize, 2, mh, &r) != Status::kOk) die("isend");
          if (Clock::now() - t0 > std::chrono::seconds(60)) die("isend never posted");
        }
        double ms = 0;
        if (wait(r, &ms, 60) != Status::kOk) die("a send failed before the fault");
      }
    } else {
      for (int i = 0; i < 2; ++i) {
        double ms = 0;
        if (wait(reqs[i], &ms, 60) != Status::kOk) die("a receive failed before the fault");
      }
      reqs.erase(reqs.begin(), reqs.begin() + 2);
    }
    sync("delivered");
    if (victim) breakQps(p, recv);
    sync("broken");
    // The survivor and the victim both see their pending work fail within the bound.
    auto t0 = Clock::now();
    Status st = Status::kOk;
    if (recv) {
      for (Request* r : reqs) {
        double ms = 0;
        st = wait(r, &ms, 60);
        if (st == Status::kOk) die("a receive completed although the connection broke before its data was sent");
      }
    } else {
      for (int i = 2; i < 4 && st == Status::kOk; ++i) {
        Request* r = nullptr;
        while (r == nullptr && st == Status::kOk) {
          st = p.s->isend(buf.data() + i * kSize, kSize, 2, mh, &r);
          if (std::chrono::duration<double>(Clock::now() - t0).count() > 60) die("isend neither failed nor posted");
        }
        if (r != nullptr) {
          double ms = 0;
          st = wait(r, &ms, 60);
        }
      }
      if (st == Status::kOk) die("sends over a broken connection succeeded");
    }
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("INFO [%s] round %d (%s QPs moved to error): pending requests failed after %.1f s (%s)\n", gRole,
                round + 1, round == 0 ? "receiver's" : "sender's", s, statusName(st));
    std::fflush(stdout);
    auto c0 = Clock::now();
    c->deregMr(mh);
    if (recv) {
      delete p.r;
    } else {
      delete p.s;
    }
    if (Clock::now() - c0 > std::chrono::seconds(10)) die("closing the broken comm took more than 10 s");
    sync("closed");
    Pair fresh = connect(*b, recv);
    stream(fresh, recv, 8, kSize, round * 100 + 50);
    if (recv) {
      delete fresh.r;
    } else {
      delete fresh.s;
    }
    std::printf("INFO [%s] round %d: a new connection carried 8 checked messages afterwards\n", gRole, round + 1);
    std::fflush(stdout);
    sync("round");
  }
  // Ranks whose tuners would decide differently (weft/transport/agreement.h): the handshake refuses the
  // connection on both ends with ncclInvalidUsage, naming both digests, instead of a job that hangs later.
  transport::setAgreementSource(recv ? &digestA : &digestB);
  {
    uint8_t handle[kHandleSize];
    ListenComm* l = nullptr;
    Status st = Status::kOk;
    auto t0 = Clock::now();
    if (recv) {
      if (b->listen(0, CommConfig{}, handle, &l) != Status::kOk) die("listen");
      sendMsg(handle, sizeof(handle));
      RecvComm* rc = nullptr;
      while (rc == nullptr && st == Status::kOk) {
        st = l->accept(&rc);
        if (Clock::now() - t0 > std::chrono::seconds(60)) die("accept neither refused nor connected");
      }
      if (rc != nullptr) die("a connection between differently tuned ranks was accepted");
      delete l;
    } else {
      recvMsg(handle, sizeof(handle));
      SendComm* sc = nullptr;
      while (sc == nullptr && st == Status::kOk) {
        st = b->connect(0, CommConfig{}, handle, &sc);
        if (Clock::now() - t0 > std::chrono::seconds(60)) die("connect neither refused nor connected");
      }
      if (sc != nullptr) die("a connection between differently tuned ranks was made");
    }
    if (st != Status::kInvalidUsage) die(std::string("refused with ") + statusName(st) + ", not ncclInvalidUsage");
    std::printf("INFO [%s] differently tuned ranks: the connection was refused (%s)\n", gRole, statusName(st));
    std::fflush(stdout);
  }
  transport::setAgreementSource(nullptr);
  sync("agreement");
  return 0;
}

}  // namespace

int main() {
  // Quick detection for the test: short ACK timeout and probe interval (the defaults are for real fabrics).
  setenv("WEFT_IB_TIMEOUT", "14", 0);
  setenv("WEFT_PROBE_INTERVAL", "300", 0);
  setenv("WEFT_PEER_TIMEOUT", "3", 0);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    ::close(sv[0]);
    gSock = sv[1];
    std::_Exit(run(false));
  }
  ::close(sv[1]);
  gSock = sv[0];
  int rc = run(true);
  int status = 0;
  waitpid(pid, &status, 0);
  int child = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (rc == 77 || child == 77) return 77;
  if (rc != 0 || child != 0) return 1;
  std::printf("PASS weft_verbs_fault_tests\n");
  return 0;
}
