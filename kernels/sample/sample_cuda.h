// Sampling on the CUDA backend (host-only header): the draw of sample.h made where the logits
// are, so a decode step copies back one id instead of the vocabulary's logits and the host
// does no per-token work over the vocabulary.
//   - edits: one thread per edit, the same `edited` function as the host;
//   - greedy: one block's argmax (first of ties);
//   - else: ids sorted by logit (a stable radix sort: ties keep the lower id first), weights
//     exp(logit / T - max / T) in double summed in blocks of 256 in a fixed order (the
//     result does not depend on timing), and the top-p, min-p and draw thresholds found on
//     those prefix sums. Against draw_reference only the summation order differs: a pick can
//     differ only where u01 lands within rounding of a boundary between two candidates.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/exec.h"
#include "kernels/sample/sample.h"

namespace dsflash::kernels::sample {

class DeviceSampler {
 public:
  // Scratch for vocabularies of up to V ids in device memory (~21 bytes an id), on ctx's
  // stream; V at most 2^20. FailedPrecondition in a build without CUDA.
  static StatusOr<std::unique_ptr<DeviceSampler>> create(const ExecCtx& ctx, int64_t V);
  virtual ~DeviceSampler() = default;
  // Applies `edits` to logits (device [V], V <= the created size; changed in place), draws one
  // id as sample.h defines (u01 unused when greedy) and returns it. Synchronises ctx's stream.
  virtual StatusOr<int32_t> draw(float* logits, int64_t V, const std::vector<Edit>& edits, const Penalties& pen,
                                 const Params& p, double u01) = 0;
  // Alternatives a draw_logprobs reports at most.
  static constexpr int kMaxTopLogprobs = 64;
  // As draw, and the draw's log-probabilities (sample.h's DrawLogprobs: of the logits before the
  // penalties, banned ids at -inf) with the top_n (0..kMaxTopLogprobs) largest: one block's max,
  // sum of exp in double (a fixed tree order: the host sums in id order, so lse agrees to
  // rounding) and top_n passes of its argmax below the last pick. Synchronises ctx's stream once.
  virtual StatusOr<int32_t> draw_logprobs(float* logits, int64_t V, const std::vector<Edit>& edits,
                                          const Penalties& pen, const Params& p, double u01, int top_n,
                                          DrawLogprobs* out) = 0;
};

}  // namespace dsflash::kernels::sample
