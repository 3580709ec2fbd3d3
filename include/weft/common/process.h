// SPDX-License-Identifier: Apache-2.0
// What names this process among others on the host: its PID namespace. Files that weft processes name by their pid
// (shm endpoints, `weft inspect` sockets) carry it too, so that a sweep of dead processes' files never touches those
// of another namespace, whose pids mean nothing here.
#pragma once

#include <cstdint>

namespace weft {

// The inode of this process's PID namespace ("pid:[4026531836]"), 0 where it cannot be read.
uint64_t pidNamespace();

}  // namespace weft
