// SPDX-License-Identifier: Apache-2.0
// What the files of the conformance checks share (checks_*.cc, one per area; the registry is checks.cc).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <dirent.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_support.h"
#include "weft/common/params.h"
#include "weft/transport/handle.h"

namespace weft::harness::checks {

using namespace std::chrono_literals;

// Two comms between this process and itself through the plugin (connect and accept polled from one thread).
struct SelfPair {
  Conn send, recv;
};
SelfPair connectToSelf(CheckEnv& env);
// Messages of the given sizes from p.send to p.recv, every byte verified.
void selfMessages(CheckEnv& env, SelfPair& p, const std::vector<size_t>& sizes, uint64_t seed,
                  const std::string& what);
void closeSelf(CheckEnv& env, SelfPair& p);
// The receiver's maxRecvs, agreed by both processes (it decides how many buffers one irecv may carry).
int agreedMaxRecvs(CheckEnv& env);
// Skips the check when the plugin under test is not weft (a promise beyond NCCL's contract).
void requireWeft(CheckEnv& env);
// A send larger than its receive; weftPromise: require weft's error (else only nothing past the buffer).
void sendLargerThanRecv(CheckEnv& env, bool weftPromise);

// The checks (registered in checks.cc).
void apiSetNetAttr(CheckEnv& env);
void commsCrossOrder(CheckEnv& env);
void commsMany(CheckEnv& env);
void commsScale(CheckEnv& env);
void connectNonblocking(CheckEnv& env);
void connectSelf(CheckEnv& env);
void connectTwoProcess(CheckEnv& env);
void dataGroupedReceives(CheckEnv& env);
void dataGroupedSkew(CheckEnv& env);
void dataLarge(CheckEnv& env);
void dataMaxRequests(CheckEnv& env);
void dataNcclSteps(CheckEnv& env);
void dataRecvLarger(CheckEnv& env);
void dataRequestHint(CheckEnv& env);
void dataSendLargerThanRecv(CheckEnv& env);
void dataSizes(CheckEnv& env);
void devicesProperties(CheckEnv& env);
void diffStream(CheckEnv& env);
void faultsFlushPeerKilled(CheckEnv& env);
void faultsKilledMany(CheckEnv& env);
void faultsLinkDown(CheckEnv& env);
void faultsRailDown(CheckEnv& env);
void faultsRailFlapSoak(CheckEnv& env);
void faultsRailsAllDown(CheckEnv& env);
void faultsReceiverKilled(CheckEnv& env);
void faultsSenderKilled(CheckEnv& env);
void hygieneConnectCycles(CheckEnv& env);
void hygieneRegisterCycles(CheckEnv& env);
void initIdempotent(CheckEnv& env);
void listenCloseUnaccepted(CheckEnv& env);
void mrCache(CheckEnv& env);
void profilerNetEvents(CheckEnv& env);
void soakRandom(CheckEnv& env);
void teardownCloseAfterSends(CheckEnv& env);
void teardownCloseThenReconnect(CheckEnv& env);
void teardownInflight(CheckEnv& env);
void threadsServiceAndProgress(CheckEnv& env);
void weftContextPerInit(CheckEnv& env);
void weftDistinctHandles(CheckEnv& env);
void weftFlush(CheckEnv& env);
void weftGarbageHandles(CheckEnv& env);
void weftIflushHost(CheckEnv& env);
void weftMisuse(CheckEnv& env);
void weftReplayedHandle(CheckEnv& env);
void weftTcpFlows(CheckEnv& env);
void weftStallLines(CheckEnv& env);
void weftHangReport(CheckEnv& env);
void weftHangCycle(CheckEnv& env);
void weftSendLargerThanRecv(CheckEnv& env);
void weftDeliveryAck(CheckEnv& env);
void weftUnreachablePeer(CheckEnv& env);
void weftWrongToken(CheckEnv& env);

}  // namespace weft::harness::checks
