// One sampled token per row of next-token logits, with its log-prob and the row's entropy, in
// two passes over the vocabulary (plus a short one over the nucleus) instead of torch's ten.
//
// Built and loaded by kernels.py; sampling.py explains the definitions, which this follows exactly:
// logits / temperature, floored at TAIL_FLOOR_NATS below the row's best; log-probs of the full
// distribution (before top-p); top-p keeps the most likely tokens while the mass before each is
// below top_p (the top token always) and draws among them in descending order of probability by
// inverse CDF at the row's uniform number u. Only the sums differ from the torch path (their order,
// and double where it sums in float), so a draw can differ where u lands within rounding of a boundary.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "exp_nonpositive.h"

namespace {

// The nucleus is found among the tokens within LEVELS[k] nats of the best, for the smallest k whose
// mass reaches top_p (so only those are sorted); all of them when none does.
constexpr int LEVELS = 4;
constexpr float LEVEL_NATS[LEVELS] = {4.0f, 8.0f, 12.0f, 20.0f};

struct Draw {
  int64_t id;
  float logp, entropy;
};

// The position of the first of n weights (in the order given) whose running sum passes u times
// their total; the last where rounding leaves none. The sums run in double, as torch's CPU cumsum
// accumulates float: over a long flat tail a float running sum drifts by several tokens' mass.
template <class Weight>
size_t inverse_cdf(size_t n, Weight weight, float u) {
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += weight(i);
  const float target = u * static_cast<float>(sum);
  double running = 0.0;
  for (size_t i = 0; i < n; ++i) {
    running += weight(i);
    if (static_cast<float>(running) > target) return i;
  }
  return n - 1;
}

// p [vocab]: scratch. Returns the draw for one row.
Draw sample_row(const float* __restrict logits, float* __restrict p, int64_t vocab, float temperature, float top_p,
                float floor_nats, float u) {
  float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t v = 0; v < vocab; ++v) {
    p[v] = logits[v] / temperature;  // divided, as the torch path does, so the values agree to the bit
    top = std::max(top, p[v]);
  }
  const float lowest = top - floor_nats;
  float thresholds[LEVELS];
  for (int k = 0; k < LEVELS; ++k) thresholds[k] = exp_nonpositive(-LEVEL_NATS[k]);
  // The normalizer and the entropy's sum in double: in float, 49,152 terms drift by ~1e-5 relative.
  double total = 0.0, weighted = 0.0;
  float m0 = 0.0f, m1 = 0.0f, m2 = 0.0f, m3 = 0.0f;
#pragma omp simd reduction(+ : total, weighted, m0, m1, m2, m3)
  for (int64_t v = 0; v < vocab; ++v) {
    const float d = std::max(p[v], lowest) - top;
    const float e = exp_nonpositive(d);
    p[v] = e;  // unnormalized probability from here on
    total += e;
    weighted += e * d;
    m0 += e >= thresholds[0] ? e : 0.0f;
    m1 += e >= thresholds[1] ? e : 0.0f;
    m2 += e >= thresholds[2] ? e : 0.0f;
    m3 += e >= thresholds[3] ? e : 0.0f;
  }
  const double log_total = std::log(total);
  Draw draw{0, 0.0f, static_cast<float>(log_total - weighted / total)};  // entropy = log Z - E[d]
  if (top_p >= 1.0f) {  // the whole vocabulary, in vocabulary order
    draw.id = static_cast<int64_t>(inverse_cdf(static_cast<size_t>(vocab), [p](size_t v) { return p[v]; }, u));
  } else {
    const float masses[LEVELS] = {m0, m1, m2, m3};
    float threshold = 0.0f;  // every token, unless a level's mass reaches top_p
    for (int k = 0; k < LEVELS; ++k) {
      if (masses[k] >= top_p * total) {
        threshold = thresholds[k];
        break;
      }
    }
    std::vector<std::pair<float, int64_t>> best;
    size_t kept = 0;
    double before = 0.0;  // the mass before each candidate; normalized, it is what the torch path compares
    for (;;) {
      best.clear();
      for (int64_t v = 0; v < vocab; ++v)
        if (p[v] >= threshold) best.emplace_back(p[v], v);
      std::sort(best.begin(), best.end(),
                [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
      kept = 0;
      before = 0.0;
      while (kept < best.size() && before / total < top_p) before += best[kept++].first;
      // The level's mass was summed in another order: should its candidates fall short of top_p by
      // rounding, the nucleus may go on past them, so take every token.
      if (before / total >= top_p || threshold == 0.0f) break;
      threshold = 0.0f;
    }
    draw.id = best[inverse_cdf(kept, [&best](size_t i) { return best[i].first; }, u)].second;  // the nucleus, most likely first
  }
  draw.logp = std::max(logits[draw.id] / temperature, lowest) - top - static_cast<float>(log_total);
  return draw;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sample_rows(const at::Tensor& logits, double temperature, double top_p,
                                                           double floor_nats, const at::Tensor& uniform) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous(),
              "sample_rows: logits must be contiguous float32 [rows, vocab]");
  TORCH_CHECK(uniform.dim() == 1 && uniform.numel() == logits.size(0) && uniform.scalar_type() == at::kFloat,
              "sample_rows: one float32 uniform number per row");
  TORCH_CHECK(temperature > 0.0 && top_p > 0.0 && top_p <= 1.0, "sample_rows: temperature > 0 and 0 < top_p <= 1");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  at::Tensor ids = at::empty({rows}, logits.options().dtype(at::kLong));
  at::Tensor logp = at::empty({rows}, logits.options());
  at::Tensor entropy = at::empty({rows}, logits.options());
  const at::Tensor u = uniform.contiguous();
  const float* l_p = logits.data_ptr<float>();
  const float* u_p = u.data_ptr<float>();
  int64_t* id_p = ids.data_ptr<int64_t>();
  float* lp_p = logp.data_ptr<float>();
  float* en_p = entropy.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(vocab);
    for (int64_t r = begin; r < end; ++r) {
      const Draw draw = sample_row(l_p + r * vocab, scratch.data(), vocab, static_cast<float>(temperature), static_cast<float>(top_p),
                                   static_cast<float>(floor_nats), u_p[r]);
      id_p[r] = draw.id;
      lp_p[r] = draw.logp;
      en_p[r] = draw.entropy;
    }
  });
  return {ids, logp, entropy};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(scope_marl, m) {
  m.def("sample_rows(Tensor logits, float temperature, float top_p, float floor_nats, Tensor uniform) -> (Tensor, Tensor, Tensor)");
  m.impl("sample_rows", c10::DispatchKey::CPU, TORCH_FN(sample_rows));
}
