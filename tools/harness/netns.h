// SPDX-License-Identifier: Apache-2.0
// Network namespaces for the fault checks that take links down: whether this process may (it runs in a namespace
// of its own, or in the soft-RoCE guest), taking its links down and up, and joining a namespace by name.
#pragma once

#include <string>

namespace weft::harness {

// This process's network namespace differs from its parent's (netns_conformance.sh's `ip netns exec`, or a rank
// that joinNetns moved), or it runs in tests/rxe/run_guest.sh's throwaway QEMU guest: links may be taken down here.
bool privateNetns();
// Every interface of this namespace but lo, down or up; "" or what failed.
std::string setNetnsLinks(bool up);
// Moves this process into the named namespace (/var/run/netns/NAME, as `ip netns add` makes); "" or why not.
std::string joinNetns(const std::string& name);

}  // namespace weft::harness
