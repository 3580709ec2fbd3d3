// SPDX-License-Identifier: Apache-2.0
// fmt's non-template part, compiled once for all of weft. Debian ships fmt as a shared library or as headers only;
// the plugin must not depend on libfmt.so at run time (it is loaded into NCCL's process on hosts that may not have
// it), and header-only mode recompiles all of format-inl.h in every file that prints: 7 s instead of 3 per file here.
// So every other file includes <fmt/format.h> as a client, and this file holds the definitions, hidden in our
// libraries like the rest of weft. The instantiations are the ones format.h declares but leaves to the library.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
template auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl<char>(locale_ref) -> char;
template auto thousands_sep_impl<wchar_t>(locale_ref) -> thousands_sep_result<wchar_t>;
template auto decimal_point_impl<wchar_t>(locale_ref) -> wchar_t;
template locale_ref::locale_ref(const std::locale& loc);
template auto locale_ref::get<std::locale>() const -> std::locale;
template void buffer<char>::append(const char* begin, const char* end);
template void vformat_to(buffer<char>& out, string_view fmt, basic_format_args<FMT_BUFFER_CONTEXT(char)> args,
                         locale_ref loc);
}  // namespace detail
FMT_END_NAMESPACE
