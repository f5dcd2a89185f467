// The float64 reference of the MoE layer (formats.md "MoE layer semantics", and
// "ds_fp4 extra numerics" as an interval reference) and its test data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "numerics_ref.h"

namespace moejit_test {

// ---------------------------------------------------------------- MoE

moejit_moe_desc MoeData::desc() const {
  moejit_moe_desc d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = sizeof(d);
  d.format = p.fmt;
  d.scale_dtype = p.fmt == MOEJIT_FORMAT_FP8_BLOCK ? p.sdt : MOEJIT_DTYPE_BF16;
  d.hidden = p.H;
  d.group_size = p.group;
  d.intermediate = p.I;
  d.num_experts = p.E;
  d.top_k = p.top_k;
  d.max_tokens = p.max_tokens;
  d.activation = p.act;
  d.swiglu_alpha = p.alpha;
  d.swiglu_limit = p.limit;
  d.gate_up_interleaved = p.interleaved;
  d.router_weight_on_input = p.rwoi;
  d.output_dtype = p.out;
  if (p.separate) {
    d.gate = gu_api.data();
    d.up = up_api.data();
  } else {
    d.gate_up = gu_api.data();
  }
  d.down = dn_api.data();
  if (p.up_format.given) d.up_format = &up_fmt;
  if (p.down_format.given) d.down_format = &dn_fmt;
  return d;
}

MoeData make_moe(const MoeProblem& p) {
  MoeData d;
  d.p = p;
  Rng rng(p.seed);
  const ProjSpec gate = proj(p.fmt, p.sdt, p.group);
  const ProjSpec up = p.up_format.given ? p.up_format : gate;
  const ProjSpec dn = p.down_format.given ? p.down_format : gate;
  auto bank = [&](const ProjSpec& f, int64_t rows, int64_t k) {
    return make_weights(f.fmt, f.sdt, rows, k, p.pad, p.fill, p.bias, rng, f.group);
  };
  for (int e = 0; e < p.E; ++e) {
    d.gu.push_back(bank(gate, p.separate ? p.I : 2 * int64_t(p.I), p.H));
    if (p.separate) d.up.push_back(bank(up, p.I, p.H));
    d.dn.push_back(bank(dn, p.H, p.I));
  }
  for (int e = 0; e < p.E; ++e) {
    d.gu_api.push_back(d.gu[size_t(e)].api());
    if (p.separate) d.up_api.push_back(d.up[size_t(e)].api());
    d.dn_api.push_back(d.dn[size_t(e)].api());
  }
  const auto api_format = [](const ProjSpec& f) {
    return moejit_proj_format{f.fmt, f.fmt == MOEJIT_FORMAT_FP8_BLOCK ? f.sdt : MOEJIT_DTYPE_BF16, f.group};
  };
  d.up_fmt = api_format(up);
  d.dn_fmt = api_format(dn);
  d.x = make_x(int64_t(p.max_tokens) * p.H, p.fill, rng);
  const int K = p.top_k;
  d.ids.resize(size_t(p.max_tokens * K));
  d.w.resize(size_t(p.max_tokens * K));
  const int32_t negatives[] = {-1, INT32_MIN, -p.E, -1000};
  for (int t = 0; t < p.max_tokens; ++t) {
    for (int j = 0; j < K; ++j) {
      int32_t id;
      if (t == 2 || rng.chance(0.12)) {
        id = negatives[rng.uniform(0, 3)];  // token 2: every route skipped
      } else if (j > 0 && rng.chance(0.15)) {
        id = d.ids[size_t(t * K + rng.uniform(0, j - 1))];  // duplicate route
        if (id < 0) id = rng.uniform(0, p.E - 1);
      } else {
        id = rng.uniform(0, p.E - 1);
      }
      d.ids[size_t(t * K + j)] = id;
      d.w[size_t(t * K + j)] = p.rwoi && p.fill == Fill::exact ? std::ldexp(1.0f, -rng.uniform(0, 3))
                                                               : float(0.05 + 0.95 * rng.unit());
    }
  }
  return d;
}

namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// One expert's gate and up rows, dequantized ([I][H] each), and their biases:
// from the fused gate_up (rows concatenated or interleaved) or the separate banks.
struct GateUpRows {
  std::vector<double> gate, up;    // [I * H]
  std::vector<double> mgate, mup;  // [I * H], Mat::magnitude
  std::vector<double> bg, bu;      // [I]
};
GateUpRows gate_up_rows(const MoeData& d, int e) {
  const MoeProblem& p = d.p;
  const size_t H = size_t(p.H), I = size_t(p.I);
  GateUpRows r;
  r.bg.resize(I);
  r.bu.resize(I);
  const Mat& gu = d.gu[size_t(e)];
  if (p.separate) {
    const Mat& up = d.up[size_t(e)];
    r.gate = gu.dequant();
    r.up = up.dequant();
    r.mgate = gu.magnitude();
    r.mup = up.magnitude();
    for (size_t i = 0; i < I; ++i) {
      r.bg[i] = gu.bias_at(int64_t(i));
      r.bu[i] = up.bias_at(int64_t(i));
    }
    return r;
  }
  const std::vector<double> W = gu.dequant(), M = gu.magnitude();
  r.gate.resize(I * H);
  r.up.resize(I * H);
  r.mgate.resize(I * H);
  r.mup.resize(I * H);
  for (size_t i = 0; i < I; ++i) {
    const size_t gr = p.interleaved ? 2 * i : i;
    const size_t ur = p.interleaved ? 2 * i + 1 : I + i;
    std::copy(&W[gr * H], &W[gr * H] + H, &r.gate[i * H]);
    std::copy(&W[ur * H], &W[ur * H] + H, &r.up[i * H]);
    std::copy(&M[gr * H], &M[gr * H] + H, &r.mgate[i * H]);
    std::copy(&M[ur * H], &M[ur * H] + H, &r.mup[i * H]);
    r.bg[i] = gu.bias_at(int64_t(gr));
    r.bu[i] = gu.bias_at(int64_t(ur));
  }
  return r;
}

// Pass 1 of intermediate i for one route, exact in double: gate and up (bias
// and router weight on input included) and the sums of |products| their fp32
// error bounds scale with.
struct GateUp {
  double gate, up, sgate, sup;
};
GateUp gate_up(const MoeProblem& p, const GateUpRows& w, const double* x, int i, double wt) {
  const int H = p.H;
  double dg = 0, sg = 0, du = 0, su = 0;
  const double* wg = &w.gate[size_t(i) * H];
  const double* wu = &w.up[size_t(i) * H];
  const double* mg = &w.mgate[size_t(i) * H];
  const double* mu = &w.mup[size_t(i) * H];
  for (int k = 0; k < H; ++k) {
    dg += wg[k] * x[k];
    sg += mg[k] * std::fabs(x[k]);
    du += wu[k] * x[k];
    su += mu[k] * std::fabs(x[k]);
  }
  const double bg = w.bg[size_t(i)], bu = w.bu[size_t(i)];
  const double ws = p.rwoi ? wt : 1.0;
  return {ws * dg + bg, ws * du + bu, std::fabs(ws) * sg + std::fabs(bg), std::fabs(ws) * su + std::fabs(bu)};
}

// The (token, route) pairs of expert e, in the canonical order (by token, then route).
std::vector<std::pair<int, int>> routes_of(const MoeData& d, int e, int T) {
  const int K = d.p.top_k;
  std::vector<std::pair<int, int>> routes;
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j)
      if (d.ids[size_t(t * K + j)] == e) routes.push_back({t, j});
  return routes;
}

// Pass 2 of one down row against the reference's g: the dot product, sum |w g|
// and sum |w| allow (g's own uncertainty).
struct DownDot {
  double dot = 0, s = 0, sa = 0;
};
DownDot down_dot(const double* wd, const double* md, const std::vector<double>& g,
                 const std::vector<double>& allow) {
  DownDot r;
  for (size_t i = 0; i < g.size(); ++i) {
    r.dot += wd[i] * g[i];
    r.s += md[i] * std::fabs(g[i]);
    r.sa += md[i] * allow[i];
  }
  return r;
}

// Ambiguities on elements far below the route's largest |g| (activations near
// zero, where fp32 cancellation is legitimate) cost nothing in the bound; those
// on large elements are what keeps the test tight: this counts the latter.
int significant_ambiguities(const std::vector<double>& g, const std::vector<double>& allow) {
  const double gmax =
      *std::max_element(g.begin(), g.end(), [](double a, double b) { return std::fabs(a) < std::fabs(b); });
  int n = 0;
  for (size_t i = 0; i < g.size(); ++i) n += allow[i] > 0 && std::fabs(g[i]) * 16 >= std::fabs(gmax);
  return n;
}

double activation(const MoeProblem& p, double gate, double up) {
  const double alpha = p.alpha == 0 ? double(1.702f) : double(p.alpha);
  const double L = double(p.limit);
  const bool clamp = L > 0 && std::isfinite(L);
  switch (p.act) {
    case MOEJIT_ACT_SILU: return gate * sigmoid(gate) * up;
    case MOEJIT_ACT_GELU: return 0.5 * gate * (1.0 + std::erf(gate / std::sqrt(2.0))) * up;
    case MOEJIT_ACT_GELU_TANH:
      return 0.5 * gate * (1.0 + std::tanh(0.7978845608 * (gate + 0.044715 * gate * gate * gate))) * up;
    case MOEJIT_ACT_SWIGLU_OAI:
    case MOEJIT_ACT_SWIGLU_CLAMP: {
      if (clamp) {
        gate = std::min(gate, L);
        up = std::min(std::max(up, -L), L);
      }
      const double u = p.act == MOEJIT_ACT_SWIGLU_OAI ? up + 1.0 : up;
      return gate * sigmoid(alpha * gate) * u;
    }
  }
  return NAN;
}

// The ds_fp4 reference (formats.md "ds_fp4 extra numerics"), as an interval
// argument on top of the bounds of moe_reference below:
//  - x' is computed exactly as the contract says (ds_roundtrip), so the kernel and
//    the reference see the same x'.
//  - gate and up: the kernel's fp32 value lies within dgate of the exact one (0 for
//    exact data), so its bf16 rounding lies in [bf16(gate - dgate), bf16(gate + dgate)];
//    the reference takes bf16(gate).
//  - g = bf16(act(gate', up')): the fp32 activation at any point of that box lies
//    within delta of act at the reference's point (Lipschitz, as below), so the
//    kernel's g lies in [bf16(a - delta), bf16(a + delta)].
//  - g' (round trip per 128 of I): the kernel's block max lies between the largest
//    lower end and the largest upper end of |g| over the block, so its scale is one
//    of the powers of two ds_scale gives on that range; for each one the round trip
//    is monotonic in g. The kernel's g' lies in the hull of those images. Where
//    nothing is ambiguous (the usual case) the hull is the reference's single value;
//    a block whose max could sit on either side of a 448 * 2^n threshold widens
//    every element of the block, honestly.
//  - c = w * (dot(down, g') + bias) in fp32 is within Dc of the exact c (the dot's
//    fp32 error over I terms, the g' hull, the bias add and the product), so its
//    bf16 rounding lies in [bf16(c - Dc), bf16(c + Dc)].
//  - the route sum of up to top_k bf16 terms in fp32: (top_k + 1) u * sum |c'|.
Reference moe_reference_ds(const MoeData& d) {
  const MoeProblem& p = d.p;
  const int T = p.max_tokens, H = p.H, I = p.I, K = p.top_k;
  const bool oai = p.act == MOEJIT_ACT_SWIGLU_OAI;
  const double L = double(p.limit);
  const bool clamps = (oai || p.act == MOEJIT_ACT_SWIGLU_CLAMP) && L > 0 && std::isfinite(L);
  Reference ref;
  ref.y.assign(size_t(T * H), 0.0);
  ref.bound.assign(size_t(T * H), 0.0);
  ref.all_skipped.assign(size_t(T), true);
  std::vector<double> S(size_t(T * H), 0.0), A(size_t(T * H), 0.0);
  std::vector<double> xq;  // x' of every token
  for (int t = 0; t < T; ++t) {
    std::vector<double> xt(static_cast<size_t>(H));
    for (int k = 0; k < H; ++k) xt[size_t(k)] = fm::bf16_to_f32(d.x[size_t(t * H + k)]);
    const std::vector<double> q = ds_roundtrip(xt.data(), H);
    xq.insert(xq.end(), q.begin(), q.end());
  }
  // The hull of a bf16 rounding of [v - dv, v + dv] around bf16(v).
  auto hull_allow = [](double v, double dv, double* rv) {
    *rv = round_bf16(v);
    return std::max(round_bf16(v + dv) - *rv, *rv - round_bf16(v - dv));
  };

  for (int e = 0; e < p.E; ++e) {
    const std::vector<std::pair<int, int>> routes = routes_of(d, e, T);
    if (routes.empty()) continue;
    const Mat& dn = d.dn[size_t(e)];
    const GateUpRows Wg = gate_up_rows(d, e);
    const std::vector<double> Wd = dn.dequant(), Md = dn.magnitude();
    std::vector<double> gb(static_cast<size_t>(I)), glo(gb.size()), ghi(gb.size());
    std::vector<double> gq(gb.size()), allow(gb.size());
    for (auto [t, j] : routes) {
      ref.all_skipped[size_t(t)] = false;
      const double wt = double(d.w[size_t(t * K + j)]);
      const double* x = &xq[size_t(t * H)];
      for (int i = 0; i < I; ++i) {
        const GateUp gp = gate_up(p, Wg, x, i, wt);
        const double gate = gp.gate, up = gp.up, sgate = gp.sgate, sup = gp.sup;
        const double dgate = p.fill == Fill::exact ? 0.0 : (H + 64) * kU * sgate;
        const double dup = p.fill == Fill::exact ? 0.0 : (H + 64) * kU * sup;
        double g16, u16;  // the reference's bf16 gate and up
        const double dG = hull_allow(gate, dgate, &g16), dU = hull_allow(up, dup, &u16);
        const double a = activation(p, g16, u16);
        // The box of the kernel's (gate', up') after the swiglu clamps (1-Lipschitz),
        // which bound both the fp32 activation error and the Lipschitz constants.
        double gl = g16 - dG, gh = g16 + dG, gc = g16, ul = u16 - dU, uh = u16 + dU, uc = u16;
        if (clamps) {
          gl = std::min(gl, L), gh = std::min(gh, L), gc = std::min(gc, L);
          ul = std::clamp(ul, -L, L), uh = std::clamp(uh, -L, L), uc = std::clamp(uc, -L, L);
        }
        const double gm = std::max(std::fabs(gl), std::fabs(gh));
        const double um = std::max(std::fabs(ul), std::fabs(uh)) + (oai ? 1.0 : 0.0);
        const double dGc = std::max(gh - gc, gc - gl), dUc = std::max(uh - uc, uc - ul);
        const double delta = kActUlps * kU * gm * um + 1.2 * um * dGc + gm * dUc;
        gb[size_t(i)] = round_bf16(a);
        glo[size_t(i)] = round_bf16(a - delta);
        ghi[size_t(i)] = round_bf16(a + delta);
      }
      // g' per 128-block of I.
      for (int b0 = 0; b0 < I; b0 += 128) {
        const int b1 = std::min(I, b0 + 128);
        double amax = 0, alo = 0, ahi = 0;
        for (int i = b0; i < b1; ++i) {
          const double l = glo[size_t(i)], h = ghi[size_t(i)];
          amax = std::max(amax, std::fabs(gb[size_t(i)]));
          alo = std::max(alo, l <= 0 && h >= 0 ? 0.0 : std::min(std::fabs(l), std::fabs(h)));
          ahi = std::max(ahi, std::max(std::fabs(l), std::fabs(h)));
        }
        const double s = ds_scale(amax), s_lo = ds_scale(alo), s_hi = ds_scale(ahi);
        for (int i = b0; i < b1; ++i) {
          gq[size_t(i)] = ds_quantize(gb[size_t(i)], s);
          double lo = gq[size_t(i)], hi = lo;
          for (double c = s_lo; c <= s_hi; c *= 2) {
            lo = std::min(lo, ds_quantize(glo[size_t(i)], c));
            hi = std::max(hi, ds_quantize(ghi[size_t(i)], c));
          }
          allow[size_t(i)] = std::max(hi - gq[size_t(i)], gq[size_t(i)] - lo);
          ref.flagged += allow[size_t(i)] > 0;
          ref.g_elems++;
        }
      }
      ref.significant += significant_ambiguities(gq, allow);
      const double wc = p.rwoi ? 1.0 : wt;
      for (int h = 0; h < H; ++h) {
        const DownDot dd = down_dot(&Wd[size_t(h) * I], &Md[size_t(h) * I], gq, allow);
        const double dot = dd.dot, s1 = dd.s + dd.sa, a1 = dd.sa;
        const double bd = dn.bias_at(h);
        const double c = wc * (dot + bd);
        const double dc = std::fabs(wc) * ((I + 68) * kU * (s1 + std::fabs(bd)) + a1);
        double c16;
        const double ac = hull_allow(c, dc, &c16);
        ref.c_flagged += ac > 0;
        ref.c_elems++;
        const size_t o = size_t(t * H + h);
        ref.y[o] += c16;
        S[o] += std::fabs(c16) + ac;
        A[o] += ac;
      }
    }
  }
  for (size_t o = 0; o < ref.y.size(); ++o) {
    double b = (K + 1) * kU * S[o] + A[o];
    if (p.out == MOEJIT_DTYPE_BF16) b += 0.5 * bf16_quantum(std::fabs(ref.y[o]) + b);
    ref.bound[o] = b;
  }
  return ref;
}

}  // namespace

// Bounds. Pass 1: with exact data gate/up are exact in fp32; otherwise they are
// within (H+64)u * sum|terms|. The kernel's fp32 activation is within
// kActUlps*u*|gate|*(|up|+1) of the exact one; every activation here is
// 1.2-Lipschitz in gate per unit of |up| and |gate|-Lipschitz in up. So the
// kernel's fp32 g lies within delta of the exact value and, rounding being
// monotonic, its bf16 g lies in [bf16(a - delta), bf16(a + delta)]: outside a
// midpoint's neighbourhood that interval is the single value bf16(a).
// Pass 2: the dot over I terms, block scales, bias, route weight and the route
// sum are fp32 roundings: (I + 64 + 4*top_k)u * sum|terms|, plus the g allowance
// times |w * down|, plus half a bf16 ulp when y is bf16.
Reference moe_reference(const MoeData& d) {
  if (d.p.fmt == MOEJIT_FORMAT_DS_FP4) return moe_reference_ds(d);
  const MoeProblem& p = d.p;
  const int T = p.max_tokens, H = p.H, I = p.I, K = p.top_k;
  const bool oai = p.act == MOEJIT_ACT_SWIGLU_OAI;
  Reference ref;
  ref.y.assign(size_t(T * H), 0.0);
  ref.bound.assign(size_t(T * H), 0.0);
  ref.all_skipped.assign(size_t(T), true);
  std::vector<double> S(size_t(T * H), 0.0), A(size_t(T * H), 0.0);
  std::vector<double> xd(d.x.size());
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = fm::bf16_to_f32(d.x[i]);

  for (int e = 0; e < p.E; ++e) {
    const std::vector<std::pair<int, int>> routes = routes_of(d, e, T);
    if (routes.empty()) continue;
    const Mat& dn = d.dn[size_t(e)];
    const GateUpRows Wg = gate_up_rows(d, e);
    const std::vector<double> Wd = dn.dequant(), Md = dn.magnitude();
    std::vector<double> g(static_cast<size_t>(I)), allow(static_cast<size_t>(I));
    for (auto [t, j] : routes) {
      ref.all_skipped[size_t(t)] = false;
      const double wt = double(d.w[size_t(t * K + j)]);
      const double* x = &xd[size_t(t * H)];
      for (int i = 0; i < I; ++i) {
        const GateUp gp = gate_up(p, Wg, x, i, wt);
        const double gate = gp.gate, up = gp.up, sgate = gp.sgate, sup = gp.sup;
        const double dgate = p.fill == Fill::exact ? 0.0 : (H + 64) * kU * sgate;
        const double dup = p.fill == Fill::exact ? 0.0 : (H + 64) * kU * sup;
        const double a = activation(p, gate, up);
        const double gm = std::fabs(gate) + dgate;
        const double um = std::fabs(up) + dup + (oai ? 1.0 : 0.0);
        const double delta = kActUlps * kU * gm * um + 1.2 * um * dgate + gm * dup;
        const double gref = round_bf16(a);
        const double lo = round_bf16(a - delta), hi = round_bf16(a + delta);
        g[size_t(i)] = gref;
        allow[size_t(i)] = std::max(hi - gref, gref - lo);
        ref.flagged += allow[size_t(i)] > 0;
        ref.g_elems++;
      }
      ref.significant += significant_ambiguities(g, allow);
      const double wc = p.rwoi ? 1.0 : wt;
      for (int h = 0; h < H; ++h) {
        const DownDot dd = down_dot(&Wd[size_t(h) * I], &Md[size_t(h) * I], g, allow);
        const double dot = dd.dot, s = dd.s, sa = dd.sa;
        const double bd = dn.bias_at(h);
        const size_t o = size_t(t * H + h);
        ref.y[o] += wc * (dot + bd);
        S[o] += std::fabs(wc) * (s + sa + std::fabs(bd));
        A[o] += std::fabs(wc) * sa;
      }
    }
  }
  for (size_t o = 0; o < ref.y.size(); ++o) {
    double b = (I + 64 + 4 * K) * kU * S[o] + A[o];
    if (p.out == MOEJIT_DTYPE_BF16) b += 0.5 * bf16_quantum(std::fabs(ref.y[o]) + b);
    ref.bound[o] = b;
  }
  return ref;
}

}  // namespace moejit_test
