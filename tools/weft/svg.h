// SPDX-License-Identifier: Apache-2.0
// Small SVG charts for weft's reports (no plotting library on the machines we run on): line/scatter plots with
// linear or log2 axes, and heatmaps. Deterministic output, viewable in any browser.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace weft::tool::svg {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y)
  bool lines = true;                              // false: markers only
};

struct Plot {
  std::string title, xLabel, yLabel;
  bool logX = false;  // log2 axis, ticks labelled as byte sizes when bytesX
  bool bytesX = false;
  std::vector<Series> series;
};

std::string render(const Plot& p);

// A heatmap: rows × columns of labelled cells; cell text and a colour index (0..palette-1; -1: empty).
struct Heatmap {
  std::string title;
  std::vector<std::string> rowLabels, colLabels;
  std::vector<std::vector<std::string>> text;
  std::vector<std::vector<int>> colour;
  std::vector<std::string> legend;  // one name per colour index
};
std::string render(const Heatmap& h);

bool writeFile(const std::string& path, const std::string& content, std::string* error);

// "4K", "1M" for a byte count that is a power of two (else the number).
std::string bytesLabel(double bytes);

}  // namespace weft::tool::svg
