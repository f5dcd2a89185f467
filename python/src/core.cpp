// moejit._core: the C API of libmoejit as Python objects. Deliberately thin: the
// Python layer (python/moejit/) names formats, tiers and activations, turns numpy /
// ml_dtypes / torch / DLPack / buffer-protocol inputs into numpy views and checks
// every shape, dtype and stride. This module builds the C descriptors from those
// views, keeps the views (and so the memory they view) alive as long as the C
// object reads them, releases the GIL around every call that runs kernels or
// waits, and raises moejit.Error subclasses carrying the status and
// moejit_last_error().
#include <dlfcn.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "moejit.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Inputs are only read; outputs must be writable. Both live in host memory.
using InArray = nb::ndarray<nb::ro, nb::device::cpu>;
using OutArray = nb::ndarray<nb::device::cpu>;

// Raises the moejit.Error subclass of `st` (moejit._errors.from_status builds it).
[[noreturn]] void raise_status(moejit_status st, const std::string& message) {
  nb::object exc = nb::module_::import_("moejit._errors").attr("from_status")(int(st), message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

// The message is read on the thread that made the call, right after it, while the
// GIL may still be released: moejit_last_error() is per thread.
struct Result {
  moejit_status status = MOEJIT_OK;
  std::string message;
};
Result result_of(moejit_status st) {
  Result r;
  r.status = st;
  if (st != MOEJIT_OK) r.message = moejit_last_error();
  return r;
}
void check(const Result& r) {
  if (r.status != MOEJIT_OK) raise_status(r.status, r.message);
}

const void* ptr_of(const InArray& a) { return a.data(); }
uintptr_t addr_of(const std::optional<InArray>& a) { return a ? reinterpret_cast<uintptr_t>(a->data()) : 0; }

[[noreturn]] void raise_closed(const char* what) {
  raise_status(MOEJIT_INVALID_ARGUMENT, std::string(what) + " is closed");
}

// ---- Context ----

class Context {
 public:
  Context(int32_t num_threads, const std::vector<int32_t>& cpu_ids, int32_t max_isa, uint32_t flags) {
    moejit_context_desc d{};
    d.struct_size = sizeof(d);
    d.num_threads = num_threads;
    d.cpu_ids = cpu_ids.empty() ? nullptr : cpu_ids.data();
    d.num_cpu_ids = int32_t(cpu_ids.size());
    d.max_isa = static_cast<moejit_isa>(max_isa);
    d.flags = flags;
    Result r;
    {
      nb::gil_scoped_release unlocked;  // starts the worker threads
      r = result_of(moejit_context_create(&d, &ctx_));
    }
    check(r);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() {
    if (!ctx_) return;
    nb::gil_scoped_release unlocked;  // waits for a task in flight
    moejit_context_destroy(ctx_);
  }

  moejit_context* handle() const { return ctx_; }
  int32_t isa() const { return int32_t(moejit_context_isa(ctx_)); }
  int32_t num_threads() const { return moejit_context_num_threads(ctx_); }
  void wait() {
    Result r;
    {
      nb::gil_scoped_release unlocked;
      r = result_of(moejit_context_wait(ctx_));
    }
    check(r);
  }

 private:
  moejit_context* ctx_ = nullptr;
};

// ---- one matrix of a bank: the views it reads, kept alive ----

class Matrix {
 public:
  Matrix(InArray data, std::optional<InArray> scales, int64_t scale_row_stride,
         std::optional<InArray> row_scales, std::optional<InArray> bias)
      : data_(std::move(data)),
        scales_(std::move(scales)),
        row_scales_(std::move(row_scales)),
        bias_(std::move(bias)),
        stride_(scale_row_stride) {}

  moejit_matrix c() const {
    moejit_matrix m{};
    m.data = ptr_of(data_);
    m.scales = scales_ ? ptr_of(*scales_) : nullptr;
    m.scale_row_stride = stride_;
    m.row_scales = row_scales_ ? static_cast<const float*>(ptr_of(*row_scales_)) : nullptr;
    m.bias = bias_ ? static_cast<const uint16_t*>(ptr_of(*bias_)) : nullptr;
    return m;
  }
  uintptr_t data_ptr() const { return reinterpret_cast<uintptr_t>(data_.data()); }
  uintptr_t scales_ptr() const { return addr_of(scales_); }
  uintptr_t row_scales_ptr() const { return addr_of(row_scales_); }
  uintptr_t bias_ptr() const { return addr_of(bias_); }
  int64_t scale_row_stride() const { return stride_; }

 private:
  InArray data_;
  std::optional<InArray> scales_, row_scales_, bias_;
  int64_t stride_;
};

std::vector<moejit_matrix> c_bank(const std::vector<const Matrix*>& bank) {
  std::vector<moejit_matrix> out;
  out.reserve(bank.size());
  for (const Matrix* m : bank) out.push_back(m->c());
  return out;
}

// ---- MoE layer ----

struct MoeArgs {  // moejit_moe_desc less struct_size, the banks and the per-projection formats
  int32_t format, scale_dtype, group_size, hidden, intermediate, num_experts, top_k, max_tokens, activation;
  float swiglu_alpha, swiglu_limit;
  bool gate_up_interleaved, router_weight_on_input;
  int32_t output_dtype;
};

// (format, scale_dtype, group_size) of one projection: moejit_proj_format.
using ProjFormat = std::tuple<int32_t, int32_t, int32_t>;

moejit_proj_format c_format(const ProjFormat& f) {
  moejit_proj_format p{};
  p.format = static_cast<moejit_format>(std::get<0>(f));
  p.scale_dtype = static_cast<moejit_dtype>(std::get<1>(f));
  p.group_size = std::get<2>(f);
  return p;
}

// A bank given as a list of Matrix objects, or None (absent).
std::vector<const Matrix*> bank_of(const nb::object& bank) {
  std::vector<const Matrix*> out;
  if (bank.is_none()) return out;
  for (nb::handle h : nb::cast<nb::list>(bank)) out.push_back(&nb::cast<const Matrix&>(h));
  return out;
}

class Moe {
 public:
  // `context` is the Context object; `gate_up`, `gate`, `up` lists of Matrix objects
  // or None (the fused bank, or the separate pair), `down` a list; all are held for
  // the layer's lifetime (the C layer reads the memory they view). The Python layer
  // has checked which banks are given; the C library checks it again.
  Moe(nb::object context, const MoeArgs& a, nb::object gate_up, nb::object gate, nb::object up, nb::list down,
      const std::optional<ProjFormat>& up_format, const std::optional<ProjFormat>& down_format)
      : context_(std::move(context)),
        gate_up_(std::move(gate_up)),
        gate_(std::move(gate)),
        up_(std::move(up)),
        down_(std::move(down)) {
    Context& ctx = nb::cast<Context&>(context_);
    std::vector<const Matrix*> dn;
    for (nb::handle h : down_) dn.push_back(&nb::cast<const Matrix&>(h));
    const std::vector<moejit_matrix> gu_c = c_bank(bank_of(gate_up_)), g_c = c_bank(bank_of(gate_)),
                                     u_c = c_bank(bank_of(up_)), dn_c = c_bank(dn);
    moejit_moe_desc d{};
    d.struct_size = sizeof(d);
    d.format = static_cast<moejit_format>(a.format);
    d.scale_dtype = static_cast<moejit_dtype>(a.scale_dtype);
    d.group_size = a.group_size;
    d.hidden = a.hidden;
    d.intermediate = a.intermediate;
    d.num_experts = a.num_experts;
    d.top_k = a.top_k;
    d.max_tokens = a.max_tokens;
    d.activation = static_cast<moejit_activation>(a.activation);
    d.swiglu_alpha = a.swiglu_alpha;
    d.swiglu_limit = a.swiglu_limit;
    d.gate_up_interleaved = a.gate_up_interleaved;
    d.router_weight_on_input = a.router_weight_on_input;
    d.output_dtype = static_cast<moejit_dtype>(a.output_dtype);
    // The C layer reads exactly num_experts entries of each bank it is given.
    auto short_of = [&](const std::vector<moejit_matrix>& bank, const nb::object& given) {
      return !given.is_none() && int64_t(bank.size()) < a.num_experts;
    };
    if (short_of(gu_c, gate_up_) || short_of(g_c, gate_) || short_of(u_c, up_) ||
        int64_t(dn_c.size()) < a.num_experts)
      raise_status(MOEJIT_INVALID_ARGUMENT, "moejit._core.MoE: fewer matrices than num_experts");
    d.gate_up = gate_up_.is_none() ? nullptr : gu_c.data();
    d.gate = gate_.is_none() ? nullptr : g_c.data();
    d.up = up_.is_none() ? nullptr : u_c.data();
    d.down = dn_c.data();
    moejit_proj_format uf{}, df{};
    if (up_format) {
      uf = c_format(*up_format);
      d.up_format = &uf;
    }
    if (down_format) {
      df = c_format(*down_format);
      d.down_format = &df;
    }
    Result r;
    {
      nb::gil_scoped_release unlocked;  // generates the kernels
      r = result_of(moejit_moe_create(ctx.handle(), &d, &moe_));
    }
    check(r);
  }
  Moe(const Moe&) = delete;
  Moe& operator=(const Moe&) = delete;
  ~Moe() { close(); }

  void close() {
    if (!moe_) return;
    {
      nb::gil_scoped_release unlocked;  // waits for its task in flight
      moejit_moe_destroy(moe_);
    }
    moe_ = nullptr;
    gate_up_ = nb::none();
    gate_ = nb::none();
    up_ = nb::none();
    down_ = nb::list();
  }
  bool closed() const { return moe_ == nullptr; }

  // y must already be checked against the layer (shapes, dtypes, contiguity).
  void run(int32_t num_tokens, const InArray& x, const InArray& ids, const InArray& w, const OutArray& y,
           bool sync) {
    if (!moe_) raise_closed("MoE");
    const auto* xp = static_cast<const uint16_t*>(x.data());
    const auto* ip = static_cast<const int32_t*>(ids.data());
    const auto* wp = static_cast<const float*>(w.data());
    void* yp = y.data();
    Result r;
    {
      nb::gil_scoped_release unlocked;
      r = result_of(sync ? moejit_moe_forward(moe_, num_tokens, xp, ip, wp, yp)
                         : moejit_moe_submit(moe_, num_tokens, xp, ip, wp, yp));
    }
    check(r);
  }

  nb::dict stats() const {
    if (!moe_) raise_closed("MoE");
    moejit_moe_stats s{};
    s.struct_size = sizeof(s);
    check(result_of(moejit_moe_stats_get(moe_, &s)));
    nb::dict d;
    d["calls"] = s.calls;
    d["routes"] = s.routes;
    d["unique_experts"] = s.unique_experts;
    d["weight_bytes_read"] = s.weight_bytes_read;
    return d;
  }

  nb::object context() const { return context_; }
  nb::object gate_up() const { return gate_up_; }
  nb::object gate() const { return gate_; }
  nb::object up() const { return up_; }
  nb::list down() const { return down_; }

 private:
  nb::object context_;
  nb::object gate_up_, gate_, up_;  // a list, or None
  nb::list down_;
  moejit_moe* moe_ = nullptr;
};

// ---- dense linear layer ----

struct LinearArgs {
  int32_t format, scale_dtype, group_size, rows, cols, max_tokens, output_dtype;
};

class Linear {
 public:
  Linear(nb::object context, const LinearArgs& a, nb::object weight)
      : context_(std::move(context)), weight_(std::move(weight)) {
    Context& ctx = nb::cast<Context&>(context_);
    moejit_linear_desc d{};
    d.struct_size = sizeof(d);
    d.format = static_cast<moejit_format>(a.format);
    d.scale_dtype = static_cast<moejit_dtype>(a.scale_dtype);
    d.group_size = a.group_size;
    d.rows = a.rows;
    d.cols = a.cols;
    d.max_tokens = a.max_tokens;
    d.weight = nb::cast<const Matrix&>(weight_).c();
    d.output_dtype = static_cast<moejit_dtype>(a.output_dtype);
    Result r;
    {
      nb::gil_scoped_release unlocked;
      r = result_of(moejit_linear_create(ctx.handle(), &d, &linear_));
    }
    check(r);
  }
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;
  ~Linear() { close(); }

  void close() {
    if (!linear_) return;
    {
      nb::gil_scoped_release unlocked;
      moejit_linear_destroy(linear_);
    }
    linear_ = nullptr;
    weight_ = nb::none();
  }
  bool closed() const { return linear_ == nullptr; }

  void forward(int32_t num_tokens, const InArray& x, const OutArray& y) {
    if (!linear_) raise_closed("Linear");
    const auto* xp = static_cast<const uint16_t*>(x.data());
    void* yp = y.data();
    Result r;
    {
      nb::gil_scoped_release unlocked;
      r = result_of(moejit_linear_forward(linear_, num_tokens, xp, yp));
    }
    check(r);
  }

  nb::object context() const { return context_; }
  nb::object weight() const { return weight_; }

 private:
  nb::object context_;
  nb::object weight_;
  moejit_linear* linear_ = nullptr;
};

// Where the libmoejit this module runs was loaded from (a stale library elsewhere on
// the search path is the classic silent failure).
std::string library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&moejit_version), &info) && info.dli_fname) return info.dli_fname;
  return "";
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "moejit's C API as Python objects (private: use the moejit package).";

  m.attr("COMPILED_ABI_VERSION") = MOEJIT_ABI_VERSION;
  m.def("abi_version", [] { return moejit_abi_version(); });
  m.def("version", [] { return std::string(moejit_version()); });
  m.def("max_format_id", [] { return moejit_max_format_id(); });
  m.def("last_error", [] { return std::string(moejit_last_error()); });
  m.def("host_isa", [] { return int32_t(moejit_host_isa()); });
  m.def(
      "status_name", [](int32_t s) { return std::string(moejit_status_name(moejit_status(s))); }, "status"_a);
  m.def(
      "isa_name", [](int32_t i) { return std::string(moejit_isa_name(moejit_isa(i))); }, "isa"_a);
  m.def(
      "format_name", [](int32_t f) { return std::string(moejit_format_name(moejit_format(f))); }, "format"_a);
  m.def("library_path", &library_path);

  nb::class_<Context>(m, "Context")
      .def(nb::init<int32_t, const std::vector<int32_t>&, int32_t, uint32_t>(), "num_threads"_a, "cpu_ids"_a,
           "max_isa"_a, "flags"_a)
      .def_prop_ro("isa", &Context::isa)
      .def_prop_ro("num_threads", &Context::num_threads)
      .def("wait", &Context::wait);

  nb::class_<Matrix>(m, "Matrix")
      .def(nb::init<InArray, std::optional<InArray>, int64_t, std::optional<InArray>,
                    std::optional<InArray>>(),
           "data"_a.noconvert(), "scales"_a.noconvert().none(), "scale_row_stride"_a,
           "row_scales"_a.noconvert().none(), "bias"_a.noconvert().none())
      .def_prop_ro("data_ptr", &Matrix::data_ptr)
      .def_prop_ro("scales_ptr", &Matrix::scales_ptr)
      .def_prop_ro("row_scales_ptr", &Matrix::row_scales_ptr)
      .def_prop_ro("bias_ptr", &Matrix::bias_ptr)
      .def_prop_ro("scale_row_stride", &Matrix::scale_row_stride);

  nb::class_<Moe>(m, "MoE")
      .def(
          "__init__",
          [](Moe* self, nb::object context, int32_t format, int32_t scale_dtype, int32_t group_size,
             int32_t hidden, int32_t intermediate, int32_t num_experts, int32_t top_k, int32_t max_tokens,
             int32_t activation, float swiglu_alpha, float swiglu_limit, bool gate_up_interleaved,
             bool router_weight_on_input, int32_t output_dtype, nb::object gate_up, nb::list down,
             nb::object gate, nb::object up, std::optional<ProjFormat> up_format,
             std::optional<ProjFormat> down_format) {
            const MoeArgs a{format,
                            scale_dtype,
                            group_size,
                            hidden,
                            intermediate,
                            num_experts,
                            top_k,
                            max_tokens,
                            activation,
                            swiglu_alpha,
                            swiglu_limit,
                            gate_up_interleaved,
                            router_weight_on_input,
                            output_dtype};
            new (self) Moe(std::move(context), a, std::move(gate_up), std::move(gate), std::move(up),
                           std::move(down), up_format, down_format);
          },
          "context"_a, "format"_a, "scale_dtype"_a, "group_size"_a, "hidden"_a, "intermediate"_a,
          "num_experts"_a, "top_k"_a, "max_tokens"_a, "activation"_a, "swiglu_alpha"_a, "swiglu_limit"_a,
          "gate_up_interleaved"_a, "router_weight_on_input"_a, "output_dtype"_a, "gate_up"_a.none(), "down"_a,
          "gate"_a.none() = nb::none(), "up"_a.none() = nb::none(), "up_format"_a.none() = nb::none(),
          "down_format"_a.none() = nb::none())
      .def(
          "forward",
          [](Moe& s, int32_t t, const InArray& x, const InArray& ids, const InArray& w, const OutArray& y) {
            s.run(t, x, ids, w, y, true);
          },
          "num_tokens"_a, "x"_a.noconvert(), "topk_ids"_a.noconvert(), "topk_weights"_a.noconvert(),
          "y"_a.noconvert())
      .def(
          "submit",
          [](Moe& s, int32_t t, const InArray& x, const InArray& ids, const InArray& w, const OutArray& y) {
            s.run(t, x, ids, w, y, false);
          },
          "num_tokens"_a, "x"_a.noconvert(), "topk_ids"_a.noconvert(), "topk_weights"_a.noconvert(),
          "y"_a.noconvert())
      .def("stats", &Moe::stats)
      .def("close", &Moe::close)
      .def_prop_ro("closed", &Moe::closed)
      .def_prop_ro("context", &Moe::context)
      .def_prop_ro("gate_up", &Moe::gate_up)
      .def_prop_ro("gate", &Moe::gate)
      .def_prop_ro("up", &Moe::up)
      .def_prop_ro("down", &Moe::down);

  nb::class_<Linear>(m, "Linear")
      .def(
          "__init__",
          [](Linear* self, nb::object context, int32_t format, int32_t scale_dtype, int32_t group_size,
             int32_t rows, int32_t cols, int32_t max_tokens, int32_t output_dtype, nb::object weight) {
            const LinearArgs a{format, scale_dtype, group_size, rows, cols, max_tokens, output_dtype};
            new (self) Linear(std::move(context), a, std::move(weight));
          },
          "context"_a, "format"_a, "scale_dtype"_a, "group_size"_a, "rows"_a, "cols"_a, "max_tokens"_a,
          "output_dtype"_a, "weight"_a)
      .def("forward", &Linear::forward, "num_tokens"_a, "x"_a.noconvert(), "y"_a.noconvert())
      .def("close", &Linear::close)
      .def_prop_ro("closed", &Linear::closed)
      .def_prop_ro("context", &Linear::context)
      .def_prop_ro("weight", &Linear::weight);
}
