// CPU linear: each worker decodes a block of weight rows once and applies it to every token,
// so prefill reads each weight byte once. Dot products accumulate in fp32 in index order.
#include <vector>

#include "common/quant/numeric.h"
#include "kernels/cpu/parallel.h"
#include "kernels/linear/linear.h"

namespace dsflash::kernels {
namespace {

// fp32 dot product with 8 interleaved partial sums (lane i takes elements i, i+8, ...),
// combined in a fixed order: vectorisable, and the same order for every call shape, so a
// prefill and a decode step compute bit-identical rows.
float dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) lane[i % 8] += a[i] * b[i];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

}  // namespace

Weight Weight::slice_rows(int64_t first, int64_t n) const {
  Weight w = *this;
  w.rows = n;
  w.data = data + first * row_bytes;
  return w;
}

StatusOr<Weight> weight_view(const gguf::Model& model, const gguf::TensorInfo& t) {
  ASSIGN_OR_RETURN(const uint8_t* p, model.data(t));
  Weight w;
  w.type = t.type;
  w.cols = static_cast<int64_t>(t.ne[0]);
  w.rows = static_cast<int64_t>(t.n_elems / t.ne[0]);
  w.data = p;
  ASSIGN_OR_RETURN(w.row_bytes, quant::row_bytes(t.type, t.ne[0]));
  if (!quant::traits(t.type).can_decode) {
    return absl::UnimplementedError(absl::StrCat("tensor '", t.name, "' has type ", quant::traits(t.type).name,
                                                 ", which the CPU backend cannot decode"));
  }
  return w;
}

void decode_weight_row(const Weight& w, int64_t r, float* out) {
  (void)quant::decode_row(w.type, w.data + r * w.row_bytes, out, w.cols);
}

void linear(const Weight& w, const float* x, int64_t n_tok, float* y, OutRound round) {
  const int64_t K = w.cols, N = w.rows;
  cpu::parallel_for(
      N,
      [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(K));
        for (int64_t o = begin; o < end; ++o) {
          decode_weight_row(w, o, row.data());
          for (int64_t t = 0; t < n_tok; ++t) {
            const float acc = dot(x + t * K, row.data(), K);
            y[t * N + o] = round == OutRound::kBf16 ? quant::round_bf16(acc) : acc;
          }
        }
      },
      4);
}

}  // namespace dsflash::kernels
