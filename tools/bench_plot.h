// moejit-bench --plot: an SVG of weight GB/s against tokens per call, one polyline per format and
// thread count (and tier / dedup arm / peer when the run has several), with the DRAM read
// bandwidth as horizontal lines. Self-written, no dependency.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bench_report.h"

namespace moejit_bench {

struct PlotSeries {
  std::string label;
  int color = 0;                                  // series of one color: the same format and threads
  int style = 0;                                  // 0 solid, 1 dashed, 2 dotted
  std::vector<std::pair<double, double>> points;  // (tokens, GB/s), ascending tokens
};

struct PlotData {
  std::vector<std::string> title;  // one line each
  std::vector<PlotSeries> series;
  std::vector<std::pair<std::string, double>> levels;  // horizontal lines: (label, GB/s)
};

// The SVG document for `data` (x: tokens on a log2 axis, y: GB/s from 0).
std::string render_svg(const PlotData& data);

// Collects the rows of a run and writes the plot to `path` at the end (throws on I/O failure).
std::unique_ptr<Reporter> make_plot_reporter(const std::string& path);

}  // namespace moejit_bench
