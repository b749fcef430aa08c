// The eager calls' host path in C++ (fastcall.py builds it as a torch extension, once per
// torch and Python): for a call whose tensors have exactly the shapes, strides, dtypes and
// devices of a cached plan, check them, allocate the outputs and call the kernel library's
// C entry (mlagen_hopper_decode / mlagen_hopper_metadata, api.cu.j2) in one Python call.
// Anything else returns None and the caller takes the Python path, which checks everything
// and says why.
//
// No CUDA header: the caller passes the current stream and has checked the current device
// and that no graph is being captured, so this builds against a CPU-only torch too (the CPU
// tests drive it with a stub entry).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using DecodeFn = int (*)(const long long* shape, const void* q, const void* k,
                         const float* k_descale, const float* q_descale, const float* sink,
                         const int* block_table, const int* seqlens, const int* sched,
                         const int* num_splits, void* out, float* lse, float* workspace,
                         int* error, float scale_log2, void* stream);
using MetadataFn = int (*)(const int* seqlens, int batch, int num_parts, int fixed_cost,
                           int fixed_splits, int* sched, int* num_splits, void* stream);
using ErrorStringFn = const char* (*)(int code);

constexpr int kInputs = 6;   // q, k_cache, block_table, cache_seqlens, metadata, num_splits

// What a tensor must look like to take this plan (its part of api._signature).
struct Want {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  at::Device device;

  explicit Want(const at::Tensor& t)
      : sizes(t.sizes().vec()), strides(t.strides().vec()), dtype(t.scalar_type()),
        device(t.device()) {}

  bool matches(const at::Tensor& t) const {
    return t.defined() && t.scalar_type() == dtype && t.device() == device &&
           t.sizes().equals(sizes) && t.strides().equals(strides);
  }
};

[[noreturn]] void launch_error(const char* what, int code, ErrorStringFn error_string) {
  throw std::runtime_error(std::string("mlagen hopper ") + what + ": CUDA error " +
                           std::to_string(code) + ": " + error_string(code));
}

class DecodePlan {
 public:
  // like: one tensor of each input as the plan was made for; decode, error_string: the
  // library's entry points (addresses); shape: its shape[] array (abi.py)
  DecodePlan(const std::vector<at::Tensor>& like, int64_t decode, int64_t error_string,
       std::vector<int64_t> shape, std::vector<int64_t> out_shape,
       std::vector<int64_t> lse_shape, int64_t ws_numel, int64_t error, double scale_log2)
      : decode_(reinterpret_cast<DecodeFn>(decode)),
        error_string_(reinterpret_cast<ErrorStringFn>(error_string)),
        shape_(shape.begin(), shape.end()),
        out_shape_(std::move(out_shape)),
        lse_shape_(std::move(lse_shape)),
        ws_numel_(ws_numel),
        error_(reinterpret_cast<int*>(error)),
        scale_log2_(static_cast<float>(scale_log2)) {
    if (like.size() != kInputs) throw std::invalid_argument("fastcall.DecodePlan: 6 inputs");
    for (const auto& t : like) want_.emplace_back(t);
  }

  // (out, lse), or None when the call is not this plan's (the caller's Python path then
  // checks and launches it).  workspace: the float32 workspace of the current stream.
  py::object run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& block_table,
                 const at::Tensor& seqlens, const at::Tensor& sched,
                 const at::Tensor& num_splits, int64_t stream, const at::Tensor& workspace) {
    const std::array<const at::Tensor*, kInputs> in{&q, &k, &block_table, &seqlens, &sched,
                                                    &num_splits};
    for (int i = 0; i < kInputs; ++i)
      if (!want_[i].matches(*in[i])) return py::none();
    // 16-byte rows: the Python path copies a misaligned q and refuses a misaligned k_cache
    const auto qp = reinterpret_cast<uintptr_t>(q.data_ptr());
    const auto kp = reinterpret_cast<uintptr_t>(k.data_ptr());
    if ((qp | kp) % 16) return py::none();
    if (!workspace.defined() || workspace.scalar_type() != at::kFloat ||
        workspace.device() != q.device() || workspace.numel() < ws_numel_)
      return py::none();
    at::Tensor out = at::empty(out_shape_, q.options());
    at::Tensor lse = at::empty(lse_shape_, q.options().dtype(at::kFloat));
    // 16-bit caches only (no descales), no sinks: 8-bit ones and sparse calls take the
    // Python path
    const int code = decode_(shape_.data(), q.data_ptr(), k.data_ptr(), nullptr, nullptr,
                             nullptr,
                             block_table.data_ptr<int>(), seqlens.data_ptr<int>(),
                             sched.data_ptr<int>(), num_splits.data_ptr<int>(), out.data_ptr(),
                             lse.data_ptr<float>(), workspace.data_ptr<float>(), error_,
                             scale_log2_, reinterpret_cast<void*>(stream));
    if (code != 0) launch_error("decode launch", code, error_string_);
    return py::make_tuple(std::move(out), std::move(lse));
  }

 private:
  DecodeFn decode_;
  ErrorStringFn error_string_;
  std::vector<long long> shape_;
  std::vector<int64_t> out_shape_, lse_shape_;
  int64_t ws_numel_;
  int* error_;
  float scale_log2_;
  std::vector<Want> want_;
};

// get_mla_metadata's plan: one cache_seqlens signature, the split it was planned with.
class MetadataPlan {
 public:
  MetadataPlan(const at::Tensor& like, int64_t metadata, int64_t error_string,
               int64_t num_parts, int64_t fixed_splits, int64_t split_cost)
      : want_(like),
        metadata_(reinterpret_cast<MetadataFn>(metadata)),
        error_string_(reinterpret_cast<ErrorStringFn>(error_string)),
        num_parts_(num_parts),
        fixed_splits_(static_cast<int>(fixed_splits)),
        split_cost_(static_cast<int>(split_cost)) {}

  // (tile_scheduler_metadata, num_splits), or None when seqlens is not this plan's
  py::object run(const at::Tensor& seqlens, int64_t stream) {
    if (!want_.matches(seqlens)) return py::none();
    const int64_t b = seqlens.size(0);
    const auto opts = seqlens.options();   // int32 on its device: the signature says so
    at::Tensor sched = at::empty({num_parts_, kMetaInts}, opts);
    at::Tensor num_splits = at::empty({b + 1}, opts);
    const int code = metadata_(seqlens.data_ptr<int>(), static_cast<int>(b),
                               static_cast<int>(num_parts_), split_cost_, fixed_splits_,
                               sched.data_ptr<int>(), num_splits.data_ptr<int>(),
                               reinterpret_cast<void*>(stream));
    if (code != 0) launch_error("scheduler launch", code, error_string_);
    return py::make_tuple(std::move(sched), std::move(num_splits));
  }

  static constexpr int64_t kMetaInts = 8;   // scheduler.META_INTS

 private:
  Want want_;
  MetadataFn metadata_;
  ErrorStringFn error_string_;
  int64_t num_parts_;
  int fixed_splits_, split_cost_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("META_INTS") = MetadataPlan::kMetaInts;
  py::class_<MetadataPlan>(m, "MetadataPlan")
      .def(py::init<const at::Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t>(),
           py::arg("like"), py::arg("metadata"), py::arg("error_string"), py::arg("num_parts"),
           py::arg("fixed_splits"), py::arg("split_cost"))
      .def("run", &MetadataPlan::run);
  py::class_<DecodePlan>(m, "DecodePlan")
      .def(py::init<const std::vector<at::Tensor>&, int64_t, int64_t, std::vector<int64_t>,
                    std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t, double>(),
           py::arg("like"), py::arg("decode"), py::arg("error_string"), py::arg("shape"),
           py::arg("out_shape"), py::arg("lse_shape"), py::arg("ws_numel"), py::arg("error"),
           py::arg("scale_log2"))
      .def("run", &DecodePlan::run);
}
