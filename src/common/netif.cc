#include "weft/common/netif.h"

namespace weft {

bool matchInterface(const std::string& name, const std::string& spec) {
  std::string s = spec;
  bool exclude = false, exact = false;
  if (!s.empty() && s[0] == '^') {
    exclude = true;
    s.erase(0, 1);
  }
  if (!s.empty() && s[0] == '=') {
    exact = true;
    s.erase(0, 1);
  }
  bool matched = false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty() && (exact ? name == item : name.rfind(item, 0) == 0)) matched = true;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return exclude ? !matched : matched;
}

}  // namespace weft
