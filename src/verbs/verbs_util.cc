// SPDX-License-Identifier: Apache-2.0
#include "verbs/verbs_util.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "weft/common/params.h"

namespace weft::verbs {

bool parseHcaSpec(const std::string& text, HcaSpec* out, std::string* error) {
  HcaSpec s;
  std::string t = text;
  if (!t.empty() && t[0] == '^') {
    s.exclude = true;
    t.erase(0, 1);
  }
  if (!t.empty() && t[0] == '=') {
    s.exact = true;
    t.erase(0, 1);
  }
  size_t start = 0;
  while (start <= t.size()) {
    size_t comma = t.find(',', start);
    std::string item = t.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      // name[:port[:rail[:plane]]] as NCCL 2.30 reads NCCL_IB_HCA; an empty field is undefined (-1).
      HcaSpec::Item it;
      const std::vector<std::string> f = params::splitFields(item, ':');
      it.name = f[0];
      if (f.size() > 4) {
        *error = "'" + item + "': at most name:port:rail:plane";
        return false;
      }
      const char* what[4] = {nullptr, "port", "rail", "plane"};
      int* field[4] = {nullptr, &it.port, &it.rail, &it.plane};
      const int lo[4] = {0, 1, 0, 0}, hi[4] = {0, 255, 32767, 32767};
      for (size_t k = 1; k < f.size(); ++k) {
        const std::string& v = f[k];
        if (v.empty()) continue;  // as NCCL: absent or empty is -1 (any port; rail and plane undefined)
        if (v.empty() || v.size() > 5 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          *error = "'" + item + "': the " + what[k] + " must be a number";
          return false;
        }
        *field[k] = std::stoi(v);
        if (*field[k] < lo[k] || *field[k] > hi[k]) {
          *error = "'" + item + "': " + what[k] + " " + v + " is out of range (" + std::to_string(lo[k]) + "-" +
                   std::to_string(hi[k]) + ")";
          return false;
        }
      }
      if (it.name.empty()) {
        *error = "'" + item + "': a device name is missing";
        return false;
      }
      s.items.push_back(it);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  *out = s;
  return true;
}

const HcaSpec::Item* hcaItem(const HcaSpec& spec, const std::string& device, int port) {
  if (spec.exclude) return nullptr;
  for (const auto& it : spec.items) {
    bool name = spec.exact ? device == it.name : device.rfind(it.name, 0) == 0;
    if (name && (it.port < 0 || it.port == port)) return &it;
  }
  return nullptr;
}

bool hcaSelected(const HcaSpec& spec, const std::string& device, int port) {
  if (spec.items.empty()) return true;
  bool matched = false;
  for (const auto& it : spec.items) {
    bool name = spec.exact ? device == it.name : device.rfind(it.name, 0) == 0;
    if (name && (it.port < 0 || it.port == port)) matched = true;
  }
  return spec.exclude ? !matched : matched;
}

int portSpeedMbps(unsigned activeSpeed, unsigned activeWidth) {
  int lanes = 0;
  switch (activeWidth) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: return 0;
  }
  int lane = 0;
  switch (activeSpeed) {
    case 1: lane = 2500; break;     // SDR
    case 2: lane = 5000; break;     // DDR
    case 4: lane = 10000; break;    // QDR
    case 8: lane = 10000; break;    // FDR10
    case 16: lane = 14000; break;   // FDR
    case 32: lane = 25000; break;   // EDR
    case 64: lane = 50000; break;   // HDR
    case 128: lane = 100000; break; // NDR
    case 256: lane = 200000; break; // XDR
    default: return 0;
  }
  return lanes * lane;
}

bool gidIsZero(const uint8_t* gid) {
  for (int i = 0; i < 16; ++i)
    if (gid[i] != 0) return false;
  return true;
}

bool gidIsIpv4Mapped(const uint8_t* gid) {
  for (int i = 0; i < 10; ++i)
    if (gid[i] != 0) return false;
  return gid[10] == 0xff && gid[11] == 0xff;
}

int chooseGid(const std::vector<GidEntry>& table, int forced) {
  if (forced >= 0) {
    for (const auto& e : table)
      if (e.index == forced && !gidIsZero(e.gid)) return forced;
    return -1;
  }
  auto v2 = [](const GidEntry& e) { return e.type.find("v2") != std::string::npos; };
  for (const auto& e : table)
    if (v2(e) && gidIsIpv4Mapped(e.gid)) return e.index;
  for (const auto& e : table)
    if (v2(e) && !gidIsZero(e.gid) && !(e.gid[0] == 0xfe && (e.gid[1] & 0xc0) == 0x80)) return e.index;
  for (const auto& e : table)
    if (!v2(e) && !gidIsZero(e.gid)) return e.index;
  return -1;
}

int splitMessage(uint64_t size, int nQps, uint64_t stripeMin, uint64_t* chunk) {
  if (nQps <= 1 || size < stripeMin || size == 0) {
    *chunk = size;
    return 1;
  }
  constexpr uint64_t kAlign = 128;
  uint64_t c = ((size + nQps - 1) / nQps + kAlign - 1) / kAlign * kAlign;
  *chunk = c;
  return static_cast<int>((size + c - 1) / c);
}

}  // namespace weft::verbs
