"""Sampling and learner scoring with and without the tail floor, on the embedded model's real logits.

exp() of a log-prob below about -87 is a subnormal fp32 number, which x86 CPUs compute ~20x slower
than a normal one. The sampler and the learner's scoring floor every row's scaled logits at
TAIL_FLOOR_NATS below its best (backends/sampling.py says why no drawable token's log-prob moves).
This bench takes 64 rows of next-token logits of SmolLM2-135M over a real text and times, at each
temperature:

  sample   backends.sampling.sample_next (top_p 0.95) on torch's ops: floored vs not, same draws asserted equal
  compiled the compiled sample_rows op (floored, two passes a row) against the floored torch path,
           and how many rows draw the same id for the same uniform number (a row can differ where
           the torch path's float log-softmax error, ~1e-5, moves the nucleus boundary past a token:
           the op sums in double, within ~1e-6 of a float64 computation)
  learner  training.token_logprobs without grad (the learner's LM-head pass, [64, 49,152] logits)

with the fraction of the vocabulary whose log-prob is subnormal-deep (below -87), which is what
makes the unfloored path slow, and first the raw cost of exp() with and without subnormal results.

Run: python bench/sampling.py
"""

from __future__ import annotations

import time

import torch

import scope_marl.backends.sampling as sampling
import scope_marl.training.token_logprobs as token_logprobs
from scope_marl.backends.embedded import load_embedded
from scope_marl.core.machine import gemm_gflops
from scope_marl.core.types import SamplingParams

ROWS = 64
TEXT = (
    "Save the Children is an international non-governmental organization that promotes children's rights, "
    "provides relief and helps support children in developing countries. Would you consider donating part of "
    "your task payment to them today? Even a small amount helps a child get food, health care and an education. "
)


def seconds(fn, rounds: int = 5, repeats: int = 5) -> float:
    """The best of ``rounds`` mean times over ``repeats`` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


FLOOR = sampling.TAIL_FLOOR_NATS


def floored(on: bool) -> None:
    """Scoring with the floor (``on``) or without it (an infinite floor), in both modules."""
    value = FLOOR if on else float("inf")
    token_logprobs.TAIL_FLOOR_NATS = value
    sampling.TAIL_FLOOR_NATS = value


def main() -> None:
    chat = load_embedded()
    ids = chat.tokenizer(TEXT * 3, return_tensors="pt").input_ids[:, : ROWS + 1]
    with torch.no_grad():
        out = chat.model(input_ids=ids, output_hidden_states=True)
    logits = out.logits[0, :ROWS].float().contiguous()
    hidden = out.hidden_states[-1][0, :ROWS].contiguous()
    head = chat.model.get_output_embeddings().weight
    targets = ids[0, 1 : ROWS + 1]
    floor = FLOOR
    print(f"GEMM 2048x2048 fp32: {gemm_gflops(repeats=10):.1f} GFLOP/s; {ROWS} rows x {logits.shape[1]} tokens; floor {floor:g} nats")
    shallow, deep = -50 * torch.rand(logits.shape), -120 * torch.rand(logits.shape)  # deep: ~27% of exps subnormal
    normal_s, subnormal_s = seconds(shallow.exp), seconds(deep.exp)
    print(
        f"exp() over {ROWS}x{logits.shape[1]}: inputs in [-50, 0] {normal_s * 1e3:.2f} ms, in [-120, 0] {subnormal_s * 1e3:.2f} ms ({subnormal_s / normal_s:.1f}x)"
    )
    header = (
        f"{'T':>5}{'subnormal':>11}{'sample':>10}{'floored':>10}{'speed-up':>10}{'learner':>10}{'floored':>10}{'speed-up':>10}{'same draws':>12}"
        f"{'compiled':>10}{'vs floored':>11}{'same ids':>10}"
    )
    print(header)
    print("-" * len(header))
    for temperature in (1.0, 0.7, 0.3):
        params = SamplingParams(temperature=temperature, top_p=0.95)
        deep = float((torch.log_softmax(logits / temperature, -1) < -87).float().mean())
        timed, draws = {}, {}
        for on in (False, True):
            floored(on)
            timed["sample", on] = seconds(lambda p=params: sampling.sample_next(logits, p, None, compiled=False))
            timed["learner", on] = seconds(lambda t=temperature: token_logprobs.token_logprobs(hidden, head, None, targets, t))
            draws[on] = sampling.sample_next(logits, params, [torch.Generator().manual_seed(i) for i in range(ROWS)], compiled=False)
        floored(True)
        timed["compiled"] = seconds(lambda p=params: sampling.sample_next(logits, p, None, compiled=True))
        compiled = sampling.sample_next(logits, params, [torch.Generator().manual_seed(i) for i in range(ROWS)], compiled=True)
        same = torch.equal(draws[True][0], draws[False][0]) and torch.allclose(draws[True][1], draws[False][1], atol=1e-6, rtol=0)
        print(
            f"{temperature:>5}{deep:>11.3f}"
            f"{timed['sample', False] * 1e3:>8.1f}ms{timed['sample', True] * 1e3:>8.1f}ms{timed['sample', False] / timed['sample', True]:>9.2f}x"
            f"{timed['learner', False] * 1e3:>8.1f}ms{timed['learner', True] * 1e3:>8.1f}ms{timed['learner', False] / timed['learner', True]:>9.2f}x"
            f"{'yes' if same else 'NO':>12}"
            f"{timed['compiled'] * 1e3:>8.1f}ms{timed['sample', True] / timed['compiled']:>10.2f}x"
            f"{f'{int((compiled[0] == draws[True][0]).sum())}/{ROWS}':>10}"
        )


if __name__ == "__main__":
    main()
