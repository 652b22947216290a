// A hand-written SVG scatter plot for the report (no plotting library: the file is small, valid XML and opens in
// any browser).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "futransformer/error.h"
#include "futransformer/eval/report.h"

namespace futransformer::eval {
namespace {

constexpr double kWidth = 860, kHeight = 540;
constexpr double kLeft = 80, kRight = 250, kTop = 50, kBottom = 70;  // plot margins; the legend sits on the right
constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// A tick label with as many decimals as the step needs.
std::string tick_label(double v, double step) {
  const int decimals = step >= 1.0 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", std::min(decimals, 9), std::abs(v) < step * 1e-9 ? 0.0 : v);
  return buf;
}

double nice_step(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw * (1 - 1e-12)) return m * mag;
  return 10.0 * mag;
}

// The plotted range of one axis: the data range widened a little (and made non-empty), then out to whole ticks.
std::vector<double> axis_ticks(double lo, double hi) {
  if (hi <= lo) {
    const double pad = lo != 0.0 ? std::abs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  } else {
    const double pad = (hi - lo) * 0.05;
    lo -= pad;
    hi += pad;
  }
  return nice_ticks(lo, hi, 6);
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  check(std::isfinite(lo) && std::isfinite(hi) && lo < hi, "nice_ticks: need finite lo < hi, got ", lo, ", ", hi);
  check(target >= 2, "nice_ticks: target must be at least 2");
  const double step = nice_step((hi - lo) / (target - 1));
  const int64_t first = static_cast<int64_t>(std::floor(lo / step + 1e-9));
  const int64_t last = static_cast<int64_t>(std::ceil(hi / step - 1e-9));
  std::vector<double> ticks;
  // Integer multiples of the step, so labels do not pick up accumulated rounding.
  for (int64_t k = first; k <= last; ++k) ticks.push_back(static_cast<double>(k) * step);
  return ticks;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string svg_scatter_plot(const std::vector<PlotPoint>& points, const std::string& title, const std::string& x_label,
                             const std::string& y_label, const std::string& empty_note) {
  std::ostringstream s;
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << kWidth << "\" height=\"" << kHeight << "\" fill=\"white\"/>\n"
    << "<text x=\"" << kWidth / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" << xml_escape(title)
    << "</text>\n";
  const double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = kTop;  // pixel box (y grows down)
  if (points.empty()) {
    s << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << (y0 + y1) / 2 << "\" text-anchor=\"middle\">"
      << xml_escape(empty_note) << "</text>\n</svg>\n";
    return s.str();
  }
  double xmin = points[0].x, xmax = points[0].x, ymin = points[0].y, ymax = points[0].y;
  for (const PlotPoint& p : points) {
    check(std::isfinite(p.x) && std::isfinite(p.y), "plot: point '", p.label, "' is not finite");
    xmin = std::min(xmin, p.x);
    xmax = std::max(xmax, p.x);
    ymin = std::min(ymin, p.y);
    ymax = std::max(ymax, p.y);
  }
  const std::vector<double> xt = axis_ticks(xmin, xmax), yt = axis_ticks(ymin, ymax);
  const double xs = xt[1] - xt[0], ys = yt[1] - yt[0];
  auto px = [&](double v) { return x0 + (v - xt.front()) / (xt.back() - xt.front()) * (x1 - x0); };
  auto py = [&](double v) { return y0 - (v - yt.front()) / (yt.back() - yt.front()) * (y0 - y1); };

  // Grid, ticks and labels.
  for (double t : xt) {
    s << "<line x1=\"" << num(px(t)) << "\" y1=\"" << y0 << "\" x2=\"" << num(px(t)) << "\" y2=\"" << y1
      << "\" stroke=\"#e5e5e5\"/>\n"
      << "<line x1=\"" << num(px(t)) << "\" y1=\"" << y0 << "\" x2=\"" << num(px(t)) << "\" y2=\"" << y0 + 5
      << "\" stroke=\"black\"/>\n"
      << "<text x=\"" << num(px(t)) << "\" y=\"" << y0 + 18 << "\" text-anchor=\"middle\">" << tick_label(t, xs)
      << "</text>\n";
  }
  for (double t : yt) {
    s << "<line x1=\"" << x0 << "\" y1=\"" << num(py(t)) << "\" x2=\"" << x1 << "\" y2=\"" << num(py(t))
      << "\" stroke=\"#e5e5e5\"/>\n"
      << "<line x1=\"" << x0 - 5 << "\" y1=\"" << num(py(t)) << "\" x2=\"" << x0 << "\" y2=\"" << num(py(t))
      << "\" stroke=\"black\"/>\n"
      << "<text x=\"" << x0 - 8 << "\" y=\"" << num(py(t) + 4) << "\" text-anchor=\"end\">" << tick_label(t, ys)
      << "</text>\n";
  }
  s << "<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x1 << "\" y2=\"" << y0 << "\" stroke=\"black\"/>\n"
    << "<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x0 << "\" y2=\"" << y1 << "\" stroke=\"black\"/>\n"
    << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << kHeight - 24 << "\" text-anchor=\"middle\">"
    << xml_escape(x_label) << "</text>\n"
    << "<text x=\"20\" y=\"" << (y0 + y1) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
    << (y0 + y1) / 2 << ")\">" << xml_escape(y_label) << "</text>\n";

  // One colour per series, in order of first appearance; the legend lists them.
  std::map<std::string, size_t> colour;
  std::vector<std::string> order;
  for (const PlotPoint& p : points)
    if (colour.emplace(p.series, order.size()).second) order.push_back(p.series);
  constexpr size_t kColours = sizeof(kPalette) / sizeof(kPalette[0]);
  for (const PlotPoint& p : points) {
    const char* c = kPalette[colour[p.series] % kColours];
    s << "<circle cx=\"" << num(px(p.x)) << "\" cy=\"" << num(py(p.y)) << "\" r=\"5\" fill=\"" << c
      << "\" fill-opacity=\"0.85\"><title>" << xml_escape(p.label) << ": " << p.x << " ms, perplexity " << p.y
      << "</title></circle>\n"
      << "<text x=\"" << num(px(p.x) + 7) << "\" y=\"" << num(py(p.y) - 6) << "\" font-size=\"10\" fill=\"" << c
      << "\">" << xml_escape(p.label) << "</text>\n";
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const double ly = kTop + 10 + 18 * static_cast<double>(i);
    s << "<rect x=\"" << x1 + 20 << "\" y=\"" << ly - 9 << "\" width=\"10\" height=\"10\" fill=\""
      << kPalette[i % kColours] << "\"/>\n"
      << "<text x=\"" << x1 + 36 << "\" y=\"" << ly << "\">" << xml_escape(order[i]) << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

std::string report_svg(const Report& r) {
  const std::string note = r.synthetic ? "no points: perplexity is meaningless on synthetic weights (latency only)"
                           : r.data.empty() ? "no points: perplexity not measured (no --data)"
                                            : "no points: no configuration has both a perplexity and a decode latency";
  return svg_scatter_plot(report_plot_points(r), "Decode latency vs perplexity (" + r.device + ")",
                          "decode latency per token (ms, median step)", "perplexity", note);
}

}  // namespace futransformer::eval
