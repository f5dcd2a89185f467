#include "bench_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

namespace moejit_bench {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string fmt(double v) { return strf("%.1f", v); }

// A round tick step giving about `n` ticks up to `top`.
double tick_step(double top, int n) {
  const double raw = top / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                               "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
const char* const kDash[] = {"", " stroke-dasharray=\"7 4\"", " stroke-dasharray=\"2 3\""};

class PlotReporter : public Reporter {
 public:
  explicit PlotReporter(std::string path) : path_(std::move(path)) {}

  void begin(const MachineInfo& m, const RunInfo& run) override {
    data_.title = {"moejit-bench" + (run.preset.empty() ? std::string() : " " + run.preset) + ": " +
                       describe(run.geometry),
                   std::string("routing ") + routing_label(run.routing) + ", " + m.cpu_model + ", " +
                       std::to_string(m.cpus) + " CPUs, libmoejit " + m.version};
    for (const auto& [threads, gbps] : m.dram_gbps)
      data_.levels.emplace_back("DRAM read, " + std::to_string(threads) + " thr", gbps);
  }
  void layer(const LayerInfo&) override {}
  void row(const CaseRow& r) override {
    const std::string base =
        std::string(format_label(r.spec.format)) + " " + std::to_string(r.spec.threads) + "t";
    const std::string isa =
        r.spec.max_isa == MOEJIT_ISA_AUTO ? "" : std::string(" ") + moejit_isa_name(r.spec.max_isa);
    const bool both = r.on && r.off;
    const int color = color_of(base + isa);
    if (r.on && r.on->ok())
      add(base + isa + (both ? " dedup" : ""), color, 0, r.spec.tokens, r.on->weight_gbps);
    if (r.off && r.off->ok())
      add(base + isa + " no dedup", color, both ? 1 : 0, r.spec.tokens, r.off->weight_gbps);
    if (r.peer && r.peer->ok())
      add(r.peer_label + " " + std::to_string(r.spec.threads) + "t", color, 2, r.spec.tokens,
          r.peer->weight_gbps);
  }
  void end() override {
    for (auto& s : data_.series) std::sort(s.points.begin(), s.points.end());
    std::ofstream out(path_);
    out << render_svg(data_);
    if (!out) throw std::runtime_error("--plot: cannot write '" + path_ + "'");
  }

 private:
  int color_of(const std::string& key) { return colors_.emplace(key, int(colors_.size())).first->second; }

  void add(const std::string& label, int color, int style, int32_t tokens, double gbps) {
    auto it = index_.find(label);
    if (it == index_.end()) {
      it = index_.emplace(label, data_.series.size()).first;
      data_.series.push_back({label, color, style, {}});
    }
    data_.series[it->second].points.emplace_back(double(tokens), gbps);
  }

  std::string path_;
  PlotData data_;
  std::map<std::string, size_t> index_;
  std::map<std::string, int> colors_;
};

}  // namespace

std::string render_svg(const PlotData& d) {
  const double W = 860, Hh = 480, left = 64, right = 220, top = 48, bottom = 56;
  const double pw = W - left - right, ph = Hh - top - bottom;
  double xmin = 1e300, xmax = 0, ymax = 0;
  for (const PlotSeries& s : d.series)
    for (const auto& [x, y] : s.points)
      xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymax = std::max(ymax, y);
  for (const auto& l : d.levels) ymax = std::max(ymax, l.second);
  if (xmax <= 0) xmin = 1, xmax = 1;
  if (ymax <= 0) ymax = 1;
  const double lx0 = std::log2(xmin), lx1 = std::log2(xmax);
  auto px = [&](double x) {
    return lx1 > lx0 ? left + (std::log2(x) - lx0) / (lx1 - lx0) * pw : left + pw / 2;
  };
  const double step = tick_step(ymax * 1.08, 6), ytop = std::ceil(ymax * 1.08 / step) * step;
  auto py = [&](double y) { return top + ph - y / ytop * ph; };

  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt(W) + "\" height=\"" + fmt(Hh) +
                  "\" viewBox=\"0 0 " + fmt(W) + " " + fmt(Hh) +
                  "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
                  "fill=\"white\"/>\n";
  for (size_t i = 0; i < d.title.size(); ++i)
    s += "<text x=\"" + fmt(left) + "\" y=\"" + fmt(16 + 15 * double(i)) + "\" font-size=\"12\">" +
         escape(d.title[i]) + "</text>\n";
  for (double y = 0; y <= ytop + step / 2; y += step) {  // y grid and labels
    s += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(py(y)) + "\" x2=\"" + fmt(left + pw) + "\" y2=\"" +
         fmt(py(y)) + "\" stroke=\"#e0e0e0\"/>\n";
    s += "<text x=\"" + fmt(left - 6) + "\" y=\"" + fmt(py(y) + 4) + "\" text-anchor=\"end\">" +
         strf("%g", y) + "</text>\n";
  }
  std::set<double> xs;
  for (const PlotSeries& ser : d.series)
    for (const auto& p : ser.points) xs.insert(p.first);
  for (double x : xs)
    s += "<text x=\"" + fmt(px(x)) + "\" y=\"" + fmt(top + ph + 18) + "\" text-anchor=\"middle\">" +
         strf("%g", x) + "</text>\n";
  s += "<rect x=\"" + fmt(left) + "\" y=\"" + fmt(top) + "\" width=\"" + fmt(pw) + "\" height=\"" + fmt(ph) +
       "\" fill=\"none\" stroke=\"#444\"/>\n";
  s += "<text x=\"" + fmt(left + pw / 2) + "\" y=\"" + fmt(Hh - 14) +
       "\" text-anchor=\"middle\">tokens per call</text>\n";
  s += "<text transform=\"translate(18 " + fmt(top + ph / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">weight GB/s (distinct experts' bytes / median call)</text>\n";

  double ly = top + 6;
  auto legend = [&](const std::string& color, const std::string& dash, const std::string& label) {
    s += "<line x1=\"" + fmt(left + pw + 12) + "\" y1=\"" + fmt(ly) + "\" x2=\"" + fmt(left + pw + 40) +
         "\" y2=\"" + fmt(ly) + "\" stroke=\"" + color + "\" stroke-width=\"2\"" + dash + "/>\n";
    s += "<text x=\"" + fmt(left + pw + 46) + "\" y=\"" + fmt(ly + 4) + "\">" + escape(label) + "</text>\n";
    ly += 18;
  };
  for (size_t i = 0; i < d.levels.size(); ++i) {
    const auto& [label, gbps] = d.levels[i];
    const std::string gray = i % 2 ? "#888" : "#000";
    s += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(py(gbps)) + "\" x2=\"" + fmt(left + pw) + "\" y2=\"" +
         fmt(py(gbps)) + "\" stroke=\"" + gray + "\" stroke-width=\"1\" stroke-dasharray=\"4 4\"/>\n";
    legend(gray, " stroke-dasharray=\"4 4\"", label + " " + strf("%.1f", gbps));
  }
  for (size_t i = 0; i < d.series.size(); ++i) {
    const PlotSeries& ser = d.series[i];
    const std::string color = kColors[size_t(ser.color) % (sizeof(kColors) / sizeof(kColors[0]))];
    const std::string dash = kDash[std::clamp(ser.style, 0, 2)];
    std::string pts;
    for (const auto& [x, y] : ser.points) pts += fmt(px(x)) + "," + fmt(py(y)) + " ";
    s += "<polyline fill=\"none\" stroke=\"" + color + "\" stroke-width=\"2\"" + dash + " points=\"" + pts +
         "\"/>\n";
    for (const auto& [x, y] : ser.points)
      s += "<circle cx=\"" + fmt(px(x)) + "\" cy=\"" + fmt(py(y)) + "\" r=\"3\" fill=\"" + color + "\"/>\n";
    legend(color, dash, ser.label);
  }
  return s + "</svg>\n";
}

std::unique_ptr<Reporter> make_plot_reporter(const std::string& path) {
  return std::make_unique<PlotReporter>(path);
}

}  // namespace moejit_bench
