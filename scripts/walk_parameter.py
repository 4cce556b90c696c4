"""Follow the run directory of ``scope train`` through the code: how far the path travels, and how
often it climbs back up the layers (an architecture review's measure; compare before and after a change).

Runs one tiny training step (the embedded model, one task, two rollouts, no evaluation), then resumes
the finished run (``scope train --resume``: lock, saved config, checkpoint, trimming), each under a
profiler that records every call inside ``scope_marl`` receiving the run directory as an argument:
the path itself, a path inside it, or an object whose ``path`` / ``run_dir`` is it (``self`` is not
counted). The modules entered, in order, are mapped to their layer of the import-linter contract in
pyproject.toml; a *climb* is entering a module of a higher layer than the one just left, a *return*
is entering a module already left before; an *up-call* is a call whose caller sits in a lower layer
than the function it calls (a callback climbing back up the stack).

    python scripts/walk_parameter.py [--show]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layer_of(module: str, layers: list[list[str]]) -> int:
    """0 is the top layer (the CLI); higher numbers are lower layers."""
    for index, names in enumerate(layers):
        if any(module == n or module.startswith(n + ".") for n in names):
            return index
    raise ValueError(f"{module} is in no layer of the contract")


def holds(value, run_dir: Path) -> bool:
    if isinstance(value, str | Path):
        try:
            path = Path(value).resolve()
        except (OSError, ValueError):
            return False
        return path == run_dir or run_dir in path.parents
    fields = getattr(value, "__dict__", None) or {}
    return any(isinstance(fields.get(a), str | Path) and Path(fields[a]).resolve() == run_dir for a in ("path", "run_dir"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print every module entered, in order")
    args = parser.parse_args()
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    layers = [[n.strip() for n in entry.split("|")] for entry in contract["layers"]]

    from scope_marl import experiment
    from scope_marl.config import TrainConfig

    cfg = TrainConfig.model_validate(
        {"steps": 1, "tasks_per_step": 1, "rollout": {"group_size": 2, "progress": False}, "eval": {"every": 0}, "tensorboard": False}
    )
    run_dir = Path(tempfile.mkdtemp()) / "run"
    run_dir = run_dir.resolve()
    entered: list[str] = []
    upcalls: list[str] = []

    def profile(frame, event, _arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("scope_marl."):
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(name != "self" and holds(frame.f_locals.get(name), run_dir) for name in names):
            if not entered or entered[-1] != module:
                entered.append(module)
            caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
            if caller.startswith("scope_marl.") and layer_of(caller, layers) > layer_of(module, layers):
                upcalls.append(f"{caller} -> {module}.{code.co_name}")

    walks = {}
    for name, saved in (("start", cfg), ("resume", None)):
        entered.clear()
        upcalls.clear()
        sys.setprofile(profile)
        try:
            experiment.train(saved, run_dir, log=lambda _: None, progress=False)
        finally:
            sys.setprofile(None)
        walks[name] = (list(entered), list(upcalls))
    for name, (entered, upcalls) in walks.items():
        report(name, entered, upcalls, layers, args.show)


def report(name: str, entered: list[str], upcalls: list[str], layers: list[list[str]], show: bool) -> None:
    climbs = sum(layer_of(b, layers) < layer_of(a, layers) for a, b in zip(entered, entered[1:]))
    returns = sum(m in entered[: i - 1] for i, m in enumerate(entered) if i > 0)
    if show:
        print(f"{name}:")
        for module in entered:
            print(f"  {layer_of(module, layers):2d} {module}")
        for call in upcalls:
            print(f"  up-call: {call}")
    print(f"RESULT walk={name} modules={len(set(entered))} entries={len(entered)} climbs={climbs} returns={returns} upcalls={len(upcalls)}")


if __name__ == "__main__":
    main()
