"""Linear layers of the embedded SmolLM2-135M at decoding's row counts: torch's F.linear vs oneDNN-packed weights.

torch's default CPU GEMM packs the weight into its blocked layout on every call; at a few dozen
rows that costs as much as the product. ``backends.packed_linear`` packs each weight once. This
bench times one forward's worth of linear layers (30 layers x q, k, v, o, gate, up, down, plus the
LM head) both ways at several row counts, with the machine's GEMM rate beside it, and then as the
sampler runs them: on the path that calibration measured faster at the nearest calibrated row
count here (``chosen``, ``as run ms``).

Run: python bench/packed_linear.py [--rows 8 46 64 100]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from scope_marl.backends.embedded import load_embedded
from scope_marl.backends.packed_linear import ROW_BUCKETS, PackedLinears, PackedWeights, packing_available
from scope_marl.core.machine import gemm_gflops


def median_ms(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 46, 64, 100])
    args = parser.parse_args()
    if not packing_available():
        raise SystemExit("error: this torch build has no oneDNN packed linear; nothing to compare")
    model = load_embedded().model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = [m.weight.detach() for m in linears]
    packed = PackedWeights(always=True)
    chosen = PackedWeights()
    clock = time.perf_counter()
    chosen.calibrate(weights)
    calibration_s = time.perf_counter() - clock
    gflops = gemm_gflops(repeats=20)
    print(f"GEMM 2048x2048 fp32: {gflops:.1f} GFLOP/s, {torch.get_num_threads()} threads; {len(linears)} linear layers")
    print(f"calibration (which path, per row count {ROW_BUCKETS}): {calibration_s:.2f} s")
    print(f"{'rows':>6}{'F.linear ms':>13}{'GFLOP/s':>9}{'packed ms':>11}{'GFLOP/s':>9}{'speed-up':>10}{'chosen':>8}{'as run ms':>11}")
    with torch.inference_mode():
        for rows in args.rows:
            inputs = [torch.randn(rows, w.shape[1]) for w in weights]
            flops = sum(2 * rows * w.numel() for w in weights)

            def plain(inputs=inputs):
                for x, w in zip(inputs, weights):
                    F.linear(x, w)

            def packed_run(inputs=inputs):
                with PackedLinears(packed):
                    for x, w in zip(inputs, weights):
                        F.linear(x, w)

            def chosen_run(inputs=inputs):
                with PackedLinears(chosen):
                    for x, w in zip(inputs, weights):
                        F.linear(x, w)

            a, b, c = median_ms(plain), median_ms(packed_run), median_ms(chosen_run)
            picked = "packed" if chosen.use_packed(rows) else "torch"
            print(f"{rows:>6}{a:>13.1f}{flops / a / 1e6:>9.0f}{b:>11.1f}{flops / b / 1e6:>9.0f}{a / b:>10.2f}{picked:>8}{c:>11.1f}")


if __name__ == "__main__":
    main()
