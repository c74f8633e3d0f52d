// Token sampling by its definition, shared by the engine's host sampler
// (inference_svc/engine/sampler.h) and the device sampler (sample_cuda.h):
//   1. edits: ids banned for this step (logit -inf: EOS before min_new_tokens) and penalties for
//      the ids already generated (CTRL-style repetition, presence, frequency);
//   2. temperature 0: the first id of the largest logit;
//   3. else every id in order (logit descending, ties: lower id first), weights
//      exp(logit / T - max / T) over the first top_k (all when 0), top-p keeps the shortest
//      prefix whose probability reaches top_p, min-p the prefix of probability >= min_p x the
//      first's, and a uniform u01 in [0, 1) picks the candidate where the running probability
//      reaches u01 x the kept mass.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/hd.h"

namespace dsflash::kernels::sample {

struct Params {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
};

struct Penalties {
  float repetition = 1.0f;  // 1: off (divides a positive logit, multiplies a negative one)
  float presence = 0.0f;    // subtracted once from an id present in the output
  float frequency = 0.0f;   // subtracted per occurrence
};

// One id's change before the draw: banned, or penalised for `count` occurrences in the output.
struct Edit {
  int32_t id = 0;
  int32_t count = 0;
  int32_t banned = 0;  // nonzero: the logit becomes -inf
};

// An edited logit (host and device use this one function, so they agree bit for bit).
DSF_HD inline float edited(float logit, const Edit& e, const Penalties& p) {
  if (e.banned != 0) return -INFINITY;
  if (e.count <= 0) return logit;
  if (p.repetition != 1.0f) logit = logit > 0 ? logit / p.repetition : logit * p.repetition;
  return logit - (p.presence + p.frequency * static_cast<float>(e.count));
}

// The edits of one step: `banned` ids, then every distinct id of `generated` with its count
// when a penalty is on (an id may appear in both; banned wins).
std::vector<Edit> make_edits(const std::vector<int32_t>& generated, const std::vector<int32_t>& banned,
                             const Penalties& p);
void apply_edits(float* logits, const std::vector<Edit>& edits, const Penalties& p);

// Greedy: the first id of the largest logit.
int32_t argmax(const float* logits, int64_t V);

// The log-probabilities a request asks for at a draw, of its logits before the draw's
// penalties with its banned ids at -inf: id j's is logits[j] - lse. The engine's host sampler
// and the device sampler (sample_cuda.h) both report them this way.
struct DrawLogprobs {
  float chosen_logit = 0;          // the drawn id's logit
  float lse = 0;                   // max + float(log(sum of exp(logit - max) in double))
  std::vector<int32_t> top_ids;    // the top_n largest logits, descending (ties: lower id first)
  std::vector<float> top_logits;   // and their logits
};

// Steps 2-3 above for T > 0, walked over a full sort of the vocabulary: the definition the
// faster samplers are tested against, not a serving path (~15 ms at 129k ids).
int32_t draw_reference(const float* logits, int64_t V, const Params& p, double u01);

}  // namespace dsflash::kernels::sample
