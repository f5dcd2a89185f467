#include "bench_peer.h"

#ifdef MOEJIT_BENCH_HAVE_DNNL

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <set>
#include <unordered_map>
#include <vector>

#include "runtime/activation.h"  // header-only: the activation formulas moejit applies

namespace moejit_bench {

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

float bf16_to_f32(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {  // round to nearest even (inputs here are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// s8 x s8 when the format is one byte per weight: oneDNN 2.6 has no bf16 x s8 matmul.
bool int8_path(FormatChoice f) { return f == MOEJIT_FORMAT_FP8_BLOCK; }

// Creating the primitive descriptor is the probe: oneDNN throws when no implementation exists.
std::string probe(dt src, dt wei, bool scales) {
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::memory::desc s({4, 256}, src, tag::ab), w({256, 256}, wei, tag::ba), d({4, 256}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    if (scales) attr.set_output_scales(2, {DNNL_RUNTIME_F32_VAL});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(s, w, d), attr, eng);
    return "";
  } catch (const dnnl::error& e) {
    return e.what();
  }
}

// One MoE layer through oneDNN: per call, routes grouped by expert (ascending id); per distinct
// expert with M routed tokens, matmul [M, H] x [H, 2I] over the expert's gate_up bytes in place
// (row-major [2I, H] is B transposed: tag ba), the activation in C++, matmul [M, I] x [I, H] over
// the down bytes, weighted fp32 sum. Primitives are built per M before timing.
class OnednnMoe {
 public:
  OnednnMoe(const Layer& layer, int32_t max_tokens)
      : layer_(layer),
        g_(layer.geometry()),
        int8_(int8_path(layer.format())),
        eng_(dnnl::engine::kind::cpu, 0),
        strm_(eng_) {
    act_.kind = g_.activation;
    act_.alpha = g_.swiglu_alpha != 0 ? g_.swiglu_alpha : 1.702f;
    act_.limit = g_.swiglu_limit;
    const size_t h = size_t(g_.hidden), i = size_t(g_.intermediate), t = size_t(max_tokens);
    x_grp_.resize(t * h * 2);
    g_grp_.resize(t * i * 2);
    h_.resize(t * 2 * i);
    o_.resize(t * h);
    acc_.resize(t * h);
    xq_.resize(t * h);
    x_scale_.resize(t);
    g_scale_.resize(t);
    count_.resize(size_t(layer.slots()) + 1);
    next_.resize(size_t(layer.slots()));
    rowf_.resize(std::max(h, i));
    order_.resize(t * size_t(g_.top_k));
    // Per-output-channel scales of the int8 path (weights' row scales; fp8_block's 128x128 blocks
    // have no oneDNN equivalent).
    wscale_gu_.assign(2 * i, 1.0f / 64);
    wscale_dn_.assign(h, 1.0f / 64);
  }

  void prepare(const std::set<int32_t>& ms) {
    for (int32_t m : ms) prims_.emplace(m, make(m));
  }

  void forward(int32_t tokens, const uint16_t* x, const int32_t* ids, const float* w, uint16_t* y) {
    const int64_t H = g_.hidden, K = g_.top_k;
    std::fill(acc_.begin(), acc_.begin() + tokens * H, 0.0f);
    if (int8_) quantize_rows(tokens, H, x, xq_.data(), x_scale_.data());
    // Counting sort of the routes by expert; ties keep route order.
    std::fill(count_.begin(), count_.end(), 0);
    for (int64_t r = 0; r < tokens * K; ++r)
      if (ids[r] >= 0) ++count_[size_t(ids[r]) + 1];
    for (size_t e = 1; e < count_.size(); ++e) count_[e] += count_[e - 1];
    std::copy(count_.begin(), count_.end() - 1, next_.begin());
    for (int64_t r = 0; r < tokens * K; ++r)
      if (ids[r] >= 0) order_[size_t(next_[size_t(ids[r])]++)] = int32_t(r);

    for (int32_t e = 0; e < layer_.slots(); ++e) {
      const int32_t begin = count_[size_t(e)], m = count_[size_t(e) + 1] - begin;
      if (m == 0) continue;
      Prims& p = prims_.at(m);
      const int32_t* routes = &order_[size_t(begin)];
      for (int32_t j = 0; j < m; ++j) {  // gather the tokens' activations
        const int64_t t = routes[j] / K;
        if (int8_)
          std::memcpy(&x_grp_[size_t(j * H)], &xq_[size_t(t * H)], size_t(H));
        else
          std::memcpy(&x_grp_[size_t(j * H) * 2], x + t * H, size_t(H) * 2);
      }
      const moejit_matrix& gu = layer_.gate_up(e);
      const moejit_matrix& dn = layer_.down(e);
      p.wei_gu.set_data_handle(const_cast<void*>(gu.data));
      p.gu.execute(strm_, p.args_gu);
      strm_.wait();  // a no-op on the CPU engine's in-order stream; the C++ below reads dst
      activate_rows(m, routes, gu.bias);
      p.wei_dn.set_data_handle(const_cast<void*>(dn.data));
      p.dn.execute(strm_, p.args_dn);
      strm_.wait();
      for (int32_t j = 0; j < m; ++j) {  // weighted sum in fp32
        const int64_t t = routes[j] / K;
        const float wt = w[routes[j]], os = int8_ ? g_scale_[size_t(j)] : 1.0f;
        const float* o = &o_[size_t(j * H)];
        float* a = &acc_[size_t(t * H)];
        if (dn.bias) {
          for (int64_t c = 0; c < H; ++c) a[c] += wt * (o[c] * os + bf16_to_f32(dn.bias[c]));
        } else {
          for (int64_t c = 0; c < H; ++c) a[c] += wt * os * o[c];
        }
      }
    }
    for (int64_t c = 0; c < tokens * H; ++c) y[c] = f32_to_bf16(acc_[size_t(c)]);
  }

 private:
  struct Prims {
    dnnl::matmul gu, dn;
    dnnl::memory wei_gu, wei_dn;
    std::unordered_map<int, dnnl::memory> args_gu, args_dn;
  };

  Prims make(int32_t m) {
    const int64_t H = g_.hidden, I = g_.intermediate;
    const dt act = int8_ ? dt::s8 : dt::bf16;
    dnnl::memory::desc src_gu({m, H}, act, tag::ab), wei_gu({H, 2 * I}, act, tag::ba),
        dst_gu({m, 2 * I}, dt::f32, tag::ab);
    dnnl::memory::desc src_dn({m, I}, act, tag::ab), wei_dn({I, H}, act, tag::ba),
        dst_dn({m, H}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    if (int8_) attr.set_output_scales(2, {DNNL_RUNTIME_F32_VAL});
    Prims p;
    p.gu = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_gu, wei_gu, dst_gu), attr, eng_));
    p.dn = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_dn, wei_dn, dst_dn), attr, eng_));
    p.wei_gu = dnnl::memory(wei_gu, eng_, DNNL_MEMORY_NONE);
    p.wei_dn = dnnl::memory(wei_dn, eng_, DNNL_MEMORY_NONE);
    p.args_gu = {{DNNL_ARG_SRC, dnnl::memory(src_gu, eng_, x_grp_.data())},
                 {DNNL_ARG_WEIGHTS, p.wei_gu},
                 {DNNL_ARG_DST, dnnl::memory(dst_gu, eng_, h_.data())}};
    p.args_dn = {{DNNL_ARG_SRC, dnnl::memory(src_dn, eng_, g_grp_.data())},
                 {DNNL_ARG_WEIGHTS, p.wei_dn},
                 {DNNL_ARG_DST, dnnl::memory(dst_dn, eng_, o_.data())}};
    if (int8_) {
      dnnl::memory::desc sgu({2 * I}, dt::f32, tag::a), sdn({H}, dt::f32, tag::a);
      p.args_gu[DNNL_ARG_ATTR_OUTPUT_SCALES] = dnnl::memory(sgu, eng_, wscale_gu_.data());
      p.args_dn[DNNL_ARG_ATTR_OUTPUT_SCALES] = dnnl::memory(sdn, eng_, wscale_dn_.data());
    }
    return p;
  }

  // Symmetric per-row quantization to s8 (the int8 path's dynamic activation quantization).
  static void quantize_row(int64_t n, const float* v, int8_t* q, float* scale) {
    float amax = 0;
    for (int64_t c = 0; c < n; ++c) amax = std::max(amax, std::fabs(v[c]));
    *scale = amax > 0 ? amax / 127.0f : 1.0f;
    const float inv = 1.0f / *scale;
    for (int64_t c = 0; c < n; ++c) q[c] = int8_t(std::lrintf(v[c] * inv));
  }
  void quantize_rows(int32_t rows, int64_t n, const uint16_t* x, int8_t* q, float* scale) {
    float* row = rowf_.data();
    for (int32_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < n; ++c) row[c] = bf16_to_f32(x[r * n + c]);
      quantize_row(n, row, q + r * n, scale + r);
    }
  }

  // h [m, 2I] fp32 -> g [m, I]: bias, activation, bf16 rounding (or s8 quantization).
  void activate_rows(int32_t m, const int32_t* routes, const uint16_t* bias) {
    const int64_t I = g_.intermediate, K = g_.top_k;
    float* g = rowf_.data();
    for (int32_t j = 0; j < m; ++j) {
      float* h = &h_[size_t(j * 2 * I)];
      const float xs = int8_ ? x_scale_[size_t(routes[j] / K)] : 1.0f;
      for (int64_t c = 0; c < I; ++c) {
        const int64_t gi = g_.interleaved ? 2 * c : c, ui = g_.interleaved ? 2 * c + 1 : I + c;
        const float gate = h[gi] * xs + (bias ? bf16_to_f32(bias[gi]) : 0.0f);
        const float up = h[ui] * xs + (bias ? bf16_to_f32(bias[ui]) : 0.0f);
        g[c] = moejit::activate(act_, gate, up);
      }
      if (int8_) {
        quantize_row(I, g, reinterpret_cast<int8_t*>(&g_grp_[size_t(j * I)]), &g_scale_[size_t(j)]);
      } else {
        uint16_t* out = reinterpret_cast<uint16_t*>(&g_grp_[size_t(j * I) * 2]);
        for (int64_t c = 0; c < I; ++c) out[c] = f32_to_bf16(g[c]);
      }
    }
  }

  const Layer& layer_;
  Geometry g_;
  bool int8_;
  moejit::ActivationParams act_;
  dnnl::engine eng_;
  dnnl::stream strm_;
  std::map<int32_t, Prims> prims_;
  std::vector<uint8_t> x_grp_, g_grp_;
  std::vector<int8_t> xq_;
  std::vector<float> h_, o_, acc_, x_scale_, g_scale_, wscale_gu_, wscale_dn_, rowf_;
  std::vector<int32_t> count_, next_, order_;
};

}  // namespace

bool peer_available(PeerKind kind, std::string* why) {
  (void)why;
  (void)kind;
  return true;
}

PeerPlan peer_plan(PeerKind kind, FormatChoice format) {
  PeerPlan p;
  if (kind != PeerKind::onednn) return p;
  const dnnl_version_t* v = dnnl_version();
  const std::string name = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor);
  if (format == MOEJIT_FORMAT_BF16) {
    p.label = "onednn bf16";
    const std::string err = probe(dt::bf16, dt::bf16, false);
    p.supported = err.empty();
    if (!p.supported) p.note = name + ": bf16 x bf16 matmul: " + err;
    return p;
  }
  if (int8_path(format)) {
    p.label = "onednn s8";
    const std::string wd = probe(dt::bf16, dt::s8, false);  // weight-only int8: what moejit does
    const std::string q = probe(dt::s8, dt::s8, true);
    p.supported = q.empty();
    p.note =
        name + " has no fp8 type" +
        (wd.empty() ? std::string(" (bf16 x s8 matmul exists, unused here)")
                    : ", and bf16 x s8 matmul fails (" + wd + ")") +
        (p.supported ? "; the peer reads the same e4m3 bytes as s8 weights against activations quantized "
                       "per token to s8, with per-row output scales instead of 128x128 blocks: the same "
                       "weight bytes and routing, not the same numerics"
                     : "; s8 x s8 with output scales fails too (" + q + ")");
    return p;
  }
  p.label = "onednn";
  p.note = name + " matmul has no " + std::string(format_label(format)) + " weights";
  return p;
}

CaseResult run_peer(PeerKind kind, const Layer& layer, const Routing& routing, const CaseSpec& spec) {
  CaseResult r;
  const PeerPlan plan = peer_plan(kind, layer.format());
  if (!plan.supported) {
    r.status = CaseStatus::unsupported;
    r.message = plan.note;
    return r;
  }
  omp_set_num_threads(spec.threads);
  r.threads = spec.threads;
  try {
    OnednnMoe moe(layer, spec.tokens);
    std::set<int32_t> ms;  // every group size the routing pool produces
    std::vector<int32_t> count(size_t(layer.geometry().experts));
    for (int32_t c = 0; c < routing.pool; ++c) {
      std::fill(count.begin(), count.end(), 0);
      const int32_t* ids = routing.ids_of(c);
      for (int32_t k = 0; k < routing.tokens * routing.top_k; ++k)
        if (ids[k] >= 0) ++count[size_t(ids[k])];
      for (int32_t n : count)
        if (n) ms.insert(n);
    }
    moe.prepare(ms);
    const Geometry& g = layer.geometry();
    const std::vector<uint16_t> x = random_activations(int64_t(spec.tokens) * g.hidden, 0x5EED + spec.tokens);
    std::vector<uint16_t> y(size_t(spec.tokens) * size_t(g.hidden));
    std::vector<int32_t> ids(size_t(spec.tokens) * size_t(g.top_k));  // on the layer's slots, as moejit's
    auto place = [&](int64_t call) { layer.place(routing.ids_of(call), int64_t(ids.size()), ids.data()); };
    auto forward = [&](int64_t call) {
      moe.forward(spec.tokens, x.data(), ids.data(), routing.weights_of(call), y.data());
      return true;
    };
    time_loop(forward, routing, double(expert_bytes(layer.format(), g)), spec, &r, place);
    for (uint16_t v : y) r.nonfinite_outputs += (v & 0x7F80) == 0x7F80;
  } catch (const std::exception& e) {  // dnnl::error, or a routing group size not prepared
    r.status = CaseStatus::error;
    r.message = std::string("oneDNN peer: ") + e.what();
  }
  return r;
}

}  // namespace moejit_bench

#else  // built without oneDNN

namespace moejit_bench {

bool peer_available(PeerKind kind, std::string* why) {
  if (kind == PeerKind::none) return true;
  *why = "this moejit-bench was built without oneDNN (install libdnnl-dev and reconfigure)";
  return false;
}

PeerPlan peer_plan(PeerKind, FormatChoice) { return {}; }

CaseResult run_peer(PeerKind, const Layer&, const Routing&, const CaseSpec&) {
  CaseResult r;
  r.status = CaseStatus::unsupported;
  r.message = "built without oneDNN";
  return r;
}

}  // namespace moejit_bench

#endif
