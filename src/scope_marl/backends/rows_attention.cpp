// Attention of packed tokens, each over the first `visible` columns of its own cache slot.
//
// Built and loaded by kernels.py; rows_attention.py explains why it exists. One task per (token,
// key/value head), spread over torch's own thread pool (at::parallel_for): the task reads each of its
// slot's keys once for all the query heads sharing that key/value head, so a decoding row streams
// exactly its own length of cache, never the padding up to its neighbours' length.
//
// Arithmetic is fp32 throughout, softmax with the maximum subtracted, as torch's SDPA does; only the
// order of the sums differs (differences of a few units in the last place).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "exp_nonpositive.h"

namespace {

// One (token, key/value head) task: the `group` query heads Q [group, dim] sharing that key/value
// head attend over keys/values K, V [n, dim]; writes O [group, dim]. S is scratch for [group, n]
// scores. D and G fix dim and group at compile time for the common shapes (the loops unroll and
// the accumulators stay in registers); 0 means "as given at run time".
constexpr int64_t PREFETCH_ROWS = 16;  // keys ahead (prefetching past a row's end is harmless: it never faults)

template <int64_t D, int64_t G>
void attend_task(const float* __restrict Q, const float* __restrict K, const float* __restrict V, float* __restrict O,
                 float* __restrict S, int64_t n, int64_t dim_, int64_t group_, float scale) {
  const int64_t dim = D ? D : dim_, group = G ? G : group_;
  for (int64_t j = 0; j < n; ++j) {  // each key read once for the whole group
    const float* k = K + j * dim;
    // Both streams fetched ahead (one task's is too short for the hardware prefetcher to ramp up):
    // the values arrive while the scores are computed, and the pass over them reads the cache.
    for (int64_t line = 0; line < dim; line += 16) {
      __builtin_prefetch(k + PREFETCH_ROWS * dim + line);
      __builtin_prefetch(V + j * dim + line);
    }
    for (int64_t g = 0; g < group; ++g) {
      const float* q = Q + g * dim;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < dim; ++d) dot += q[d] * k[d];
      S[g * n + j] = dot * scale;
    }
  }
  float inverse[G ? G : 1];  // 1 / each head's softmax sum (only with G fixed)
  for (int64_t g = 0; g < group; ++g) {
    float* s = S + g * n;
    float top = s[0];
    for (int64_t j = 1; j < n; ++j) top = std::max(top, s[j]);
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; ++j) {
      s[j] = exp_nonpositive(s[j] - top);
      total += s[j];
    }
    if constexpr (D > 0 && G > 0) {
      inverse[g] = 1.0f / total;
    } else {  // one pass over the values per head, accumulating in the output
      float* o = O + g * dim;
      std::fill(o, o + dim, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float p = s[j];
        const float* v = V + j * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) o[d] += p * v[d];
      }
      const float scale_out = 1.0f / total;
      for (int64_t d = 0; d < dim; ++d) o[d] *= scale_out;
    }
  }
  if constexpr (D > 0 && G > 0) {  // one pass over the values for the whole group, accumulators in registers
    float acc[G][D] = {};
    for (int64_t j = 0; j < n; ++j) {
      const float* v = V + j * D;
      for (int64_t g = 0; g < G; ++g) {
        const float p = S[g * n + j];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc[g][d] += p * v[d];
      }
    }
    for (int64_t g = 0; g < G; ++g)
      for (int64_t d = 0; d < D; ++d) O[g * D + d] = acc[g][d] * inverse[g];
  }
}

at::Tensor rows_attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                          const at::Tensor& slot, const at::Tensor& visible, double scale) {
  TORCH_CHECK(query.dim() == 3 && keys.dim() == 4 && values.sizes() == keys.sizes(),
              "rows_attention: query [tokens, heads, dim], keys/values [slots, kv_heads, columns, dim]");
  TORCH_CHECK(query.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat,
              "rows_attention: float32 only");
  TORCH_CHECK(query.is_contiguous() && keys.is_contiguous() && values.is_contiguous(), "rows_attention: contiguous tensors only");
  TORCH_CHECK(slot.scalar_type() == at::kLong && visible.scalar_type() == at::kLong, "rows_attention: slot/visible are int64");
  const int64_t tokens = query.size(0), heads = query.size(1), dim = query.size(2);
  const int64_t slots = keys.size(0), kv_heads = keys.size(1), columns = keys.size(2);
  TORCH_CHECK(keys.size(3) == dim && heads % kv_heads == 0, "rows_attention: head shapes disagree");
  TORCH_CHECK(slot.numel() == tokens && visible.numel() == tokens, "rows_attention: one slot and length per token");
  const at::Tensor slot_c = slot.contiguous(), visible_c = visible.contiguous();
  const int64_t* slot_p = slot_c.data_ptr<int64_t>();
  const int64_t* visible_p = visible_c.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slot_p[t] >= 0 && slot_p[t] < slots && visible_p[t] >= 1 && visible_p[t] <= columns,
                "rows_attention: token ", t, " asks for slot ", slot_p[t], " columns ", visible_p[t], " outside the cache");
  }
  const int64_t group = heads / kv_heads;
  at::Tensor out = at::empty_like(query);
  const float* q_p = query.data_ptr<float>();
  const float* k_p = keys.data_ptr<float>();
  const float* v_p = values.data_ptr<float>();
  float* o_p = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, tokens * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;  // [group, visible] of one task
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / kv_heads, h = task % kv_heads, n = visible_p[t];
      const float* K = k_p + (slot_p[t] * kv_heads + h) * columns * dim;
      const float* V = v_p + (slot_p[t] * kv_heads + h) * columns * dim;
      const float* Q = q_p + (t * heads + h * group) * dim;
      float* O = o_p + (t * heads + h * group) * dim;
      scores.resize(group * n);
      if (dim == 64 && group == 3) {
        attend_task<64, 3>(Q, K, V, O, scores.data(), n, dim, group, fscale);
      } else if (dim == 64) {
        attend_task<64, 0>(Q, K, V, O, scores.data(), n, dim, group, fscale);
      } else {
        attend_task<0, 0>(Q, K, V, O, scores.data(), n, dim, group, fscale);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(scope_marl, m) {
  m.def("rows_attention(Tensor query, Tensor keys, Tensor values, Tensor slot, Tensor visible, float scale) -> Tensor");
  m.impl("rows_attention", c10::DispatchKey::CPU, TORCH_FN(rows_attention));
}
