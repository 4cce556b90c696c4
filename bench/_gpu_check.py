"""The Python steps of bench/gpu_check.sh (one subcommand each; the script says what runs when).

imports                    which dependencies import here, their versions against constraints.txt, and the
                           `pip download` line for each missing one
model DIR [--layers N]     a SmolLM2-135M-shaped model, randomly initialised (seeded), save_pretrained + the
                           tokenizer files of bench/assets/smollm2-tokenizer (--layers: a shallower one)
config SRC OUT ...         a two-step copy of a training config on that model, for one device and dtype
measure JSON -- CMD ...    run CMD; its wall time, exit code, peak RSS and (on a GPU) the peak of the GPU's used
                           memory over the run (nvidia-smi, polled), written to JSON
gaps METRICS [--max X]     the learner/sampler log-prob gap of every step and role in a run's metrics.jsonl
compare PLAN MEASURED      scope plan's total against a measured peak
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "bench" / "assets" / "smollm2-tokenizer"
# (import name, distribution name). NEEDED: what `scope train` / `scope plan` on an hf: model import (read off a
# CPU run's sys.modules), besides torch, transformers, peft and accelerate; CHECK: pytest for step 1, trl and
# datasets (and what they import) for TRL's side of step 3; OTHER: the rest of pyproject's dependencies, which
# the check does not import (reported only).
NEEDED = [
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("peft", "peft"),
    ("accelerate", "accelerate"),
    ("tokenizers", "tokenizers"),
    ("safetensors", "safetensors"),
    ("huggingface_hub", "huggingface-hub"),
    ("jinja2", "jinja2"),
    ("pydantic", "pydantic"),
    ("yaml", "pyyaml"),
    ("typer", "typer"),
    ("click", "click"),
    ("rich", "rich"),
    ("tqdm", "tqdm"),
    ("numpy", "numpy"),
]
CHECK = [
    ("pytest", "pytest"),
    ("trl", "trl"),
    ("datasets", "datasets"),
    ("pyarrow", "pyarrow"),
    ("pandas", "pandas"),
    ("dill", "dill"),
    ("multiprocess", "multiprocess"),
    ("xxhash", "xxhash"),
]
OTHER = [
    ("gguf", "gguf"),
    ("openai", "openai"),
    ("httpx", "httpx"),
    ("matplotlib", "matplotlib"),
    ("markdown_it", "markdown-it-py"),
    ("sklearn", "scikit-learn"),
]


def tested_versions() -> dict[str, str]:
    """constraints.txt's exact versions by distribution name (empty where the file is not there)."""
    path = ROOT / "constraints.txt"
    pins = {}
    if path.exists():
        for line in path.read_text().splitlines():
            m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
            if m:
                pins[m.group(1).lower()] = m.group(2)
    return pins


def imports(args) -> int:
    import importlib

    pins = tested_versions()
    missing = []
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    for module, dist in NEEDED + CHECK + OTHER:
        try:
            mod = importlib.import_module(module)
        except Exception as error:  # any failure to import counts as missing, with its reason
            if (module, dist) not in OTHER:
                missing.append(dist)
            print(f"python -c 'import {module}': MISSING ({type(error).__name__}: {str(error).splitlines()[0][:120]})")
            continue
        version = getattr(mod, "__version__", "?")
        tested = pins.get(dist)
        note = f" (tested: {tested})" if tested and tested != str(version).split("+")[0] else ""
        extra = ""
        if module == "torch":
            cuda = mod.cuda.is_available()
            extra = f", CUDA {mod.version.cuda or 'none'}, " + (f"GPU {mod.cuda.get_device_name(0)}" if cuda else "no GPU visible")
        print(f"python -c 'import {module}': ok {version}{note}{extra}")
    if missing:
        print("missing; on a networked machine (Python 3.12, then copy bench/wheels/ beside this script):")
        for dist in missing:
            pin = f"=={pins[dist]}" if dist in pins else ""
            print(
                f"  pip download --no-deps --only-binary :all: --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d bench/wheels {dist}{pin}"
            )
        print("(each may need its own dependencies: run this step again after copying to see what is still missing;")
        print(" the last group of modules above is not imported by the check and may stay missing)")
    return 0


def model(args) -> int:
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_train_step import build_model, load_tokenizer

    out = Path(args.dir)
    tokenizer = load_tokenizer()
    net = build_model("smollm2-135m", tokenizer, torch.device("cpu"), torch.float32, args.seed, args.layers)
    net.save_pretrained(out)
    for f in ASSETS.iterdir():
        shutil.copy(f, out / f.name)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    params = sum(p.numel() for p in net.parameters()) / 1e6
    layers = net.config.num_hidden_layers
    print(f"wrote {out}: smollm2-135m shape, {layers} layers, seed {args.seed}, {params:.1f}M parameters, {size:.0f} MiB")
    return 0


def config(args) -> int:
    import yaml

    cfg = yaml.safe_load(Path(args.src).read_text())
    spec = f"hf:{Path(args.model).resolve()}"
    cfg["model"] = spec
    cfg["simulator"]["model"] = spec
    cfg["env"]["source"] = "synthetic"  # sampled personas: no corpus on the check's machine
    cfg["hardware"] = {"device": args.device, "dtype": args.dtype}
    cfg.update(steps=2, checkpoint_every=2, eval={"every": 0})
    if args.tiny:  # the CPU dry run: the same steps, a few short dialogues
        cfg["env"]["max_exchanges"] = 1
        cfg["rollout"].update(group_size=2, max_concurrent=4)
        cfg["tasks_per_step"] = 2
        for sampling in (cfg["agent_sampling"], cfg["simulator"]["sampling"]):
            sampling["max_new_tokens"] = 16
        for name in ("learner", "simulator_learner"):
            cfg[name]["token_budget"] = 4096
    else:  # one GPU, a couple of minutes: 8 tasks x groups of 4, two exchanges
        cfg["env"]["max_exchanges"] = 2
        cfg["rollout"].update(group_size=4, max_concurrent=32)
        cfg["tasks_per_step"] = 8
    Path(args.out).write_text(yaml.safe_dump(cfg, sort_keys=False))
    print(f"wrote {args.out}: {spec}, hardware {cfg['hardware']}, {cfg['tasks_per_step']} tasks x {cfg['rollout']['group_size']}, 2 steps")
    return 0


def gpu_used_mib() -> int | None:
    """Memory in use on GPU 0 (MiB), every process together, as nvidia-smi reports it."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "--id=0"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return int(out.stdout.strip().splitlines()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def measure(args) -> int:
    import resource

    before = gpu_used_mib()
    peak = [before or 0]
    done = threading.Event()

    def poll():
        while not done.wait(0.25):
            used = gpu_used_mib()
            if used is not None:
                peak[0] = max(peak[0], used)

    poller = threading.Thread(target=poll, daemon=True)
    if before is not None:
        poller.start()
    started = time.perf_counter()
    rc = subprocess.call(args.cmd)
    wall = time.perf_counter() - started
    done.set()
    if before is not None:
        poller.join()
    rss_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # kB on Linux; the largest child
    result = {"rc": rc, "wall_s": round(wall, 1), "peak_rss_gib": round(rss_gib, 3)}
    if before is not None:
        result["gpu_used_before_gib"] = round(before / 1024, 3)
        result["gpu_peak_gib"] = round((peak[0] - before) / 1024, 3)  # the run's own: CUDA context + allocator
    Path(args.json).write_text(json.dumps(result))
    print("measured: " + ", ".join(f"{k} {v}" for k, v in result.items()), flush=True)
    return rc


def gaps(args) -> int:
    worst = 0.0
    seen = 0
    for line in Path(args.metrics).read_text().splitlines():
        record = json.loads(line)
        parts = []
        for key, value in record.items():
            if key.startswith("train_") and isinstance(value, dict) and "logprob_gap" in value:
                worst = max(worst, value["logprob_gap"])
                seen += 1
                parts.append(f"{key[6:]} gap max {value['logprob_gap']:.2e} mean {value.get('logprob_gap_mean', float('nan')):.2e}")
        print(f"step {record.get('step')}: " + ("; ".join(parts) or "no learner ran"))
    verdict = ""
    if args.max is not None:
        verdict = " (limit {:.0e}: {})".format(args.max, "ok" if seen and worst < args.max else "FAILED")
    print(f"RESULT {args.label}logprob_gap={worst:.3e}{verdict}")
    return 1 if args.max is not None and not (seen and worst < args.max) else 0


def compare(args) -> int:
    plan = json.loads(Path(args.plan).read_text())
    measured = json.loads(Path(args.measured).read_text())
    planned = plan.get("plan_total_gib")
    key = "gpu_peak_gib" if "gpu_peak_gib" in measured else "peak_rss_gib"
    got = measured.get(key)
    if planned is None or got is None:
        print(f"cannot compare: plan_total_gib {planned}, measured {key} {got}")
        return 1
    ratio = planned / got if got else float("inf")
    verdict = "plan covers the run" if planned >= got else "PLAN BELOW THE MEASURED PEAK"
    print(f"RESULT plan_total_gib={planned:.3f} measured_{key}={got:.3f} plan_over_measured={ratio:.2f} ({verdict})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("imports")
    p = sub.add_parser("model")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's 30 (the CPU dry run)")
    p = sub.add_parser("config")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--model", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--tiny", action="store_true")
    p = sub.add_parser("measure")
    p.add_argument("json")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p = sub.add_parser("gaps")
    p.add_argument("metrics")
    p.add_argument("--max", type=float, default=None)
    p.add_argument("--label", default="")
    p = sub.add_parser("compare")
    p.add_argument("plan")
    p.add_argument("measured")
    args = parser.parse_args()
    if args.command == "measure" and args.cmd[:1] == ["--"]:
        args.cmd = args.cmd[1:]
    return {"imports": imports, "model": model, "config": config, "measure": measure, "gaps": gaps, "compare": compare}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
