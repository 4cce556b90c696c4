"""Small C++ ops for the CPU hot paths, compiled on first use with the machine's compiler.

Each op is one ``NAME.cpp`` beside this module that registers ``torch.ops.scope_marl.NAME``
(``TORCH_LIBRARY_FRAGMENT``, so several ops share the namespace). :func:`load` compiles it once per
machine, torch version, compiler and source into ``$SCOPE_CACHE/kernels`` (``-O3 -march=native``,
linked against torch), loads it with ``torch.ops.load_library`` and returns the op; the ops run on
torch's own thread pool (the OpenMP runtime torch already loaded). Where no compiler works, each
caller keeps its pure-torch path and one warning says so: same results, slower.
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

FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++20", "-w"]


class BuildError(RuntimeError):
    """An op could not be compiled or loaded (the message says why and how to fix it)."""


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


def source(name: str) -> Path:
    """The C++ source of op ``name``: ``name.cpp`` beside this module."""
    return Path(__file__).with_name(f"{name}.cpp")


def build(cpp: Path, directory: Path | None = None) -> Path:
    """The library compiled from ``cpp`` for this machine (compiled now unless already cached);
    :class:`BuildError` if it cannot be."""
    import torch

    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found. Fix: install one (Debian/Ubuntu: apt install g++) or point $CXX at it")
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError) as error:
        raise BuildError(f"the C++ compiler {cxx} does not run ({error}). Fix: install g++ or point $CXX at a working compiler") from None
    headers = [h.read_text() for h in sorted(cpp.parent.glob("*.h"))]  # what the source may include
    key = hashlib.sha256("\n".join([cpp.read_text(), *headers, torch.__version__, *version, *FLAGS, cpu_model()]).encode()).hexdigest()[:16]
    target = (directory or scope_cache_dir() / "kernels") / f"{cpp.stem}-{key}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run(_command(cxx, cpp, built), capture_output=True, text=True)
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-5:])
            raise BuildError(f"{cxx} could not compile {cpp.name}:\n{tail}\nFix: install g++ (Debian/Ubuntu: apt install g++)")
        try:
            with files.atomic_file(target, "wb", durable=False) as handle:  # processes building together: one whole file wins
                handle.write(built.read_bytes())
        except OSError as error:
            raise BuildError(
                f"cannot store the built op under {target.parent} ({error}). Fix: point $SCOPE_CACHE at a writable directory"
            ) from None
    return target


@functools.cache
def load(name: str, fallback: str) -> Callable | None:
    """``torch.ops.scope_marl.<name>``, built from ``name.cpp`` and loaded on first use; ``None``
    where it cannot be, after one warning that starts with ``fallback`` (what runs instead)."""
    import torch

    try:
        torch.ops.load_library(str(build(source(name))))
    except (BuildError, OSError, RuntimeError) as error:
        warnings.warn(f"{fallback}: {error}", stacklevel=3)
        return None
    return getattr(torch.ops.scope_marl, name)
