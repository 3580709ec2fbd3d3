// SPDX-License-Identifier: Apache-2.0
#include "svg.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include <fmt/format.h>

namespace weft::tool::svg {
namespace {

const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                          "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kPaletteSize = 10;

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e6 || a < 1e-3) return fmt::format("{:.2g}", v);
  if (a >= 100) return fmt::format("{:.0f}", v);
  if (a >= 10) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

// 1, 2 or 5 times a power of ten, at least `raw`.
double niceStep(double raw) {
  if (!(raw > 0)) return 1;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

}  // namespace

std::string bytesLabel(double bytes) {
  if (bytes < 1) return num(bytes);
  double l = std::log2(bytes);
  if (std::fabs(l - std::round(l)) > 1e-9) return num(bytes);
  int b = static_cast<int>(std::round(l));
  const char* units = "BKMGTPE";
  int u = b / 10;
  if (u == 0) return fmt::format("{}", 1 << b);
  return fmt::format("{}{}", 1 << (b % 10), units[u]);
}

std::string render(const Plot& p) {
  const double W = 800, H = 440, L = 70, R = 210, T = 40, B = 55;
  double x0 = std::numeric_limits<double>::max(), x1 = -x0, y0 = 0, y1 = -x0;
  auto tx = [&](double x) { return p.logX ? std::log2(std::max(x, 1e-12)) : x; };
  for (const auto& s : p.series)
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, tx(x));
      x1 = std::max(x1, tx(x));
      y1 = std::max(y1, y);
      y0 = std::min(y0, y);
    }
  if (x0 > x1) x0 = 0, x1 = 1;
  if (p.logX) x0 = std::floor(x0), x1 = std::ceil(x1);
  if (x1 == x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  y1 *= 1.05;
  auto px = [&](double x) { return L + (tx(x) - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H);
  o += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n", (W - R + L) / 2,
                   esc(p.title));
  // axes and ticks
  o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
  o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, T, L, H - B);
  // x ticks: whole powers of two on a log axis (every k-th so that at most 8 show), else "nice" steps
  std::vector<double> xt;
  if (p.logX) {
    int lo = static_cast<int>(std::ceil(x0 - 1e-9)), hi = static_cast<int>(std::floor(x1 + 1e-9));
    int step = std::max(1, (hi - lo + 7) / 8);
    for (int e = lo; e <= hi; e += step) xt.push_back(e);
  } else {
    double st = niceStep((x1 - x0) / 6);
    for (double v = std::ceil(x0 / st) * st; v <= x1 + 1e-9 * st; v += st) xt.push_back(v);
  }
  for (double v : xt) {
    double xv = p.logX ? std::pow(2.0, v) : v;
    double X = L + (v - x0) / (x1 - x0) * (W - L - R);
    std::string label = p.bytesX ? bytesLabel(xv) : num(xv);
    o += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/>\n", X, T, H - B);
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", X, H - B + 16, esc(label));
  }
  double ys = niceStep((y1 - y0) / 5);
  for (double v = std::ceil(y0 / ys) * ys; v <= y1 + 1e-9 * ys; v += ys) {
    double Y = py(v);
    o += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/>\n", L, Y, W - R);
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", L - 6, Y + 4, num(v));
  }
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (W - R + L) / 2, H - 12,
                   esc(p.xLabel));
  o += fmt::format("<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}</text>\n",
                   (H - B + T) / 2, (H - B + T) / 2, esc(p.yLabel));
  // series
  for (size_t i = 0; i < p.series.size(); ++i) {
    const Series& s = p.series[i];
    const char* c = kPalette[i % kPaletteSize];
    auto pts = s.points;
    if (s.lines) {
      std::sort(pts.begin(), pts.end());
      std::string d;
      for (auto [x, y] : pts) d += fmt::format("{}{:.1f},{:.1f}", d.empty() ? "M" : " L", px(x), py(y));
      if (!d.empty()) o += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", d, c);
    }
    for (auto [x, y] : pts)
      o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"/>\n", px(x), py(y), s.lines ? 3 : 2, c);
    double ly = T + 10 + 18.0 * static_cast<double>(i);
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n", W - R + 12, ly - 10, c);
    o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", W - R + 30, ly, esc(s.name));
  }
  o += "</svg>\n";
  return o;
}

std::string render(const Heatmap& h) {
  const double cw = 92, ch = 22, L = 120, T = 60;
  double W = L + cw * static_cast<double>(h.colLabels.size()) + 180;
  double H = T + ch * static_cast<double>(h.rowLabels.size()) + 40;
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H);
  o += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"15\">{}</text>\n", L, esc(h.title));
  for (size_t c = 0; c < h.colLabels.size(); ++c)
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + cw * (c + 0.5), T - 8,
                     esc(h.colLabels[c]));
  for (size_t r = 0; r < h.rowLabels.size(); ++r) {
    double y = T + ch * static_cast<double>(r);
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", L - 6, y + 15, esc(h.rowLabels[r]));
    for (size_t c = 0; c < h.colLabels.size(); ++c) {
      int k = r < h.colour.size() && c < h.colour[r].size() ? h.colour[r][c] : -1;
      const char* fill = k < 0 ? "#f4f4f4" : kPalette[k % kPaletteSize];
      o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" fill-opacity=\"0.55\" "
                       "stroke=\"white\"/>\n",
                       L + cw * c, y, cw, ch, fill);
      if (r < h.text.size() && c < h.text[r].size())
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + cw * (c + 0.5), y + 15,
                         esc(h.text[r][c]));
    }
  }
  double lx = L + cw * static_cast<double>(h.colLabels.size()) + 20;
  for (size_t i = 0; i < h.legend.size(); ++i) {
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\" fill-opacity=\"0.55\"/>\n", lx,
                     T + 18.0 * i, kPalette[i % kPaletteSize]);
    o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", lx + 18, T + 18.0 * i + 10, esc(h.legend[i]));
  }
  o += "</svg>\n";
  return o;
}

bool writeFile(const std::string& path, const std::string& content, std::string* error) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    if (error) *error = path + ": " + std::strerror(errno);
    return false;
  }
  out << content;
  out.close();
  if (!out) {
    if (error) *error = path + ": write failed";
    return false;
  }
  return true;
}

}  // namespace weft::tool::svg
