"""Decode attention that reads each row's own length of cache: a small C++ op, built on first use.

A continuous-batching decode step (``backends.kv_cache``) attends each decoding row over its own
slot, and the rows' lengths differ by hundreds of columns. torch's SDPA can only take them padded
to the longest row with a mask, so it reads (and multiplies) the padding too, and its masked path
computes the whole score matrix before the softmax. ``rows_attention.cpp`` streams exactly each
row's columns, reading every key and value once for the query heads that share it.
``bench/decode_attention.py`` on the rollout bench's step shape (47 of 64 slots, 20-399 columns, 2
cores): 1.15 ms a layer against SDPA's 4.28 ms, the same numbers within 1e-6; the whole 64-episode
rollout, alternating both ways in one process, ran 8-15% faster. Prefill chunks stay on SDPA:
with many queries per key its matrix-product kernel is the faster one there.

The op is compiled once per machine, torch version and source (about 7 s with g++), into
``$SCOPE_CACHE/kernels``, and loaded with ``torch.ops.load_library``; it runs on torch's own thread
pool (the OpenMP runtime torch already loaded). Where no compiler works, decoding uses SDPA and
says so once: same results, slower attention.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from ..core import files
from ..core.machine import cpu_model, scope_cache_dir

SOURCE = Path(__file__).with_name("rows_attention.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++20", "-w"]


class BuildError(RuntimeError):
    """The op could not be compiled or loaded (the message says why and how to fix it)."""


def compiler() -> str | None:
    """``$CXX``, else the first of ``c++`` / ``g++`` / ``clang++`` on the PATH."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    return next((found for name in ("c++", "g++", "clang++") if (found := shutil.which(name))), None)


def _command(cxx: str, source: Path, target: Path) -> list[str]:
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    libraries = library_paths()
    return [
        cxx,
        *FLAGS,
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{path}" for path in include_paths()),
        str(source),
        *(f"-L{path}" for path in libraries),
        *(f"-Wl,-rpath,{path}" for path in libraries),
        "-lc10",
        "-ltorch_cpu",
        "-o",
        str(target),
    ]


def build(directory: Path | None = None) -> Path:
    """The compiled op for this machine (compiled now unless already cached); :class:`BuildError` if it cannot be."""
    import torch

    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found. Fix: install one (Debian/Ubuntu: apt install g++) or point $CXX at it")
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError) as error:
        raise BuildError(f"the C++ compiler {cxx} does not run ({error}). Fix: install g++ or point $CXX at a working compiler") from None
    key = hashlib.sha256("\n".join([SOURCE.read_text(), torch.__version__, *version, *FLAGS, cpu_model()]).encode()).hexdigest()[:16]
    target = (directory or scope_cache_dir() / "kernels") / f"rows_attention-{key}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run(_command(cxx, SOURCE, built), capture_output=True, text=True)
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-5:])
            raise BuildError(f"{cxx} could not compile {SOURCE.name}:\n{tail}\nFix: install g++ (Debian/Ubuntu: apt install g++)")
        try:
            with files.atomic_file(target, "wb", durable=False) as handle:  # processes building together: one whole file wins
                handle.write(built.read_bytes())
        except OSError as error:
            raise BuildError(
                f"cannot store the built op under {target.parent} ({error}). Fix: point $SCOPE_CACHE at a writable directory"
            ) from None
    return target


@functools.cache
def load() -> Callable | None:
    """``rows_attention(query [tokens, heads, dim], keys, values [slots, kv_heads, columns, dim],
    slot [tokens], visible [tokens], scale) -> [tokens, heads, dim]``: each token's attention over
    columns ``[0, visible)`` of its slot. ``None`` (with one warning) where it cannot be built."""
    import torch

    try:
        path = build()
        torch.ops.load_library(str(path))
    except (BuildError, OSError, RuntimeError) as error:
        warnings.warn(f"decode attention falls back to torch's SDPA (same results, slower decode attention): {error}", stacklevel=2)
        return None
    return torch.ops.scope_marl.rows_attention
