"""``scope plan``: the memory a training run needs, per device, before any weight is read.

The run's models are built on torch's ``meta`` device from their configs alone (``hf:DIR``'s
``config.json``; the embedded model's converted copy, or its GGUF header), with the LoRA adapters
the trainer adds (peft on meta), so every parameter count is the real module tree's. The rest is
arithmetic over the config, each term next to the code it mirrors:

* **persistent** (alive from the first update on): the base weights (the frozen KL reference and
  the frozen simulators' model), a fully fine-tuned agent's own copy, LoRA weights, their gradients
  and AdamW's two moments; full fine-tuning as the learner does it: plain AdamW on the weights
  themselves (gradients and moments in their dtype), or, when the trainer shards the agent
  (``hardware.parallel: fsdp``, or bfloat16 full fine-tuning, ``training.sharding``), float32
  master weights, gradients and moments split over the ranks; on the CPU the oneDNN-packed copies of
  the sampling models' linear weights (``backends.packed_linear``), which stay with the model;
* **rollout** (while episodes are played): the decode sessions' key/value caches (``RowCache``:
  ``2 * layers * kv_heads * head_dim * bytes`` a token) for ``rollout.max_concurrent`` episodes,
  their logits buffers, one packed step's working set; a sharded agent gathered whole;
* **learner** (one micro-batch of the largest learner, ``learner.token_budget``): the activations
  autograd keeps (a per-token, per-layer count read off the architecture, below), then the most of
  the LM head's chunk buffers, the backward's working set and the KL reference's no-grad scoring;
* **optimizer** (the AdamW step): torch's foreach implementation on a GPU makes one temporary per
  moment tensor, the CPU's single-tensor one a temporary of one tensor;
* the **runtime baseline**: the process's own resident set (CPU) or the CUDA context (GPU).

The total is baseline + persistent + the transient phases: on a GPU the largest of them (torch's
caching allocator hands what a phase frees to the next), on the CPU their sum (glibc's malloc keeps
what the rollout frees, and the learner's differently sized tensors land beside it: a `scope train`
process's resident set grows by each phase in turn, measured).

Activations per token and layer (sdpa attention, shared-prompt scoring as ``Learner._score`` runs
it), counted from what autograd saves in a Llama decoder layer: the two RMSNorms' inputs and
outputs (4 hidden), the rotated queries and SDPA's output (2 query widths), the MLP's gate, its
SiLU, up and their product (4 intermediate), each LoRA module's rank-r down-projection (float32,
plus a float32 copy of its input under a bfloat16 base), SDPA's log-sum-exp per head and the norms'
reciprocal RMS (float32); per layer also the keys and values SDPA reads (the prompt's, repeated for
each response) and the attention mask; once, the rotary cos / sin. Checked against the bytes
autograd really saved (``saved_tensors_hooks``, unique storages, weights excluded) in one
``Learner._score`` on the CPU in float32 (4 layers, hidden 192, 8 x 32 query heads, 2 key/value heads,
intermediate 688, LoRA r=16 on all seven projections, 2 prompts x 100 tokens, 8 responses x 200):
127.5 MiB saved, 127.8 MiB counted; ``tests/test_plan.py`` repeats the check on another shape. With
gradient checkpointing (``Learner._hidden_checkpointed``) every stream runs whole and each layer keeps
its input only; the backward recomputes one layer at a time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from scope_marl.backends.decode_session import PREFILL_BUDGET
from scope_marl.backends.kv_cache import RowCache
from scope_marl.training.token_logprobs import CHUNK_ROWS

GIB = 2**30
MIB = 2**20

# The runtime's own memory. CPU: a `scope train` process holds 442 MiB before its first model is read
# (python 3.11, torch 2.13, transformers 5, peft, the modules training imports, a 49k-token fast
# tokenizer: measured, resident set after building a run on a 3M-parameter model, minus that model),
# plus about 70 MiB it holds beyond the tensors counted here (glibc's arenas, thread stacks, the compiled
# decode ops, episodes and Python objects): the mean of measured peak minus counted parts over four
# runs of 3M-66M parameters on the 2-core x86 machine the tests run on (residuals 472-554 MiB).
CPU_BASELINE = 512 * MIB
# GPU: the CUDA context with torch's kernels loaded lazily (CUDA_MODULE_LOADING=LAZY, the default),
# cuBLAS's handle and workspace; typically 0.4-0.6 GiB on an H100. Documented, not measured here.
CUDA_CONTEXT = 600 * MIB
NCCL_BUFFERS = 256 * MIB  # per rank when more than one GPU trains (NCCL's channels and buffers)

MAX_ROWS = 64  # HFChatModel.max_batch_size: a decode session's live rows (and as many parked slots)
TASKS_SAMPLED = 8  # train tasks whose prompts are tokenized to find the longest


class PlanError(ValueError):
    """A config that cannot be planned (the message names the field and the fix)."""


# ---- the model's architecture ------------------------------------------------------------------------
@dataclass(frozen=True)
class Architecture:
    """What the plan reads off a model: shapes from its config, parameter counts from its meta module tree."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    attention: str
    base_params: int  # unique parameters of the plain model (tied embeddings once)
    layer_params: int  # one decoder layer
    root_params: int  # outside the layers: embeddings, final norm, an untied head
    largest_param: int  # the largest single tensor (the embedding, usually)
    linear_params: int  # unique nn.Linear weights (what decoding packs on the CPU)
    lora_params: dict[str, int]  # per adapter name: its LoRA parameters
    lora_inputs: dict[str, int]  # per adapter: the summed input width of its target modules (per token, per layer)
    lora_ranks: dict[str, int]  # per adapter: the summed rank over its target modules of one layer
    linear_shapes: tuple = ()  # nn.Linear weight shapes in module order, plain model (packed_linear's key)
    linear_shapes_lora: tuple = ()  # the same with the LoRA run's adapters

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """``RowCache.bytes_per_column``: one token's keys and values over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


def model_config(spec: str):
    """The transformers config of a local model spec, without reading its weights; None for a remote
    or scripted model (no memory here). An unknown spec is a ``BackendError``, as ``load_backend`` says it."""
    from scope_marl.backends import SPEC_FORMS, BackendError

    kind, _, arg = spec.partition(":")
    if kind == "embedded" and not arg:
        from scope_marl.backends import embedded

        if embedded.is_converted():
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(embedded.converted_path())
        return gguf_llama_config(embedded.locate_gguf())
    if kind == "hf" and arg:
        from transformers import AutoConfig

        path = Path(arg)
        if not (path / "config.json").exists():
            raise BackendError(f"no transformers model at {path} (config.json missing); pass a directory written by save_pretrained")
        return AutoConfig.from_pretrained(path)
    if kind in ("openai", "vllm", "scripted") and arg:
        return None
    raise BackendError(f"unknown model spec {spec!r}; expected one of: {SPEC_FORMS}")


def gguf_llama_config(path: Path):
    """A llama GGUF's ``LlamaConfig`` from its header alone (``embedded.read_gguf_llama`` also de-quantizes
    every tensor: seconds and the whole model's memory that a plan does not need)."""
    from gguf import GGUFReader

    from scope_marl.backends.embedded import gguf_llama_config as from_header

    return from_header(GGUFReader(path), path)


def architecture(config, adapters: dict[str, object]) -> Architecture:
    """Build the model of ``config`` on the meta device (no weights, no memory), count its parts, then add
    ``adapters`` (name -> ``peft.LoraConfig``) with peft as the trainer does and count theirs."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    plain = _linear_shapes(model)
    layers = model.get_decoder().layers
    base = sum(p.numel() for p in model.parameters())
    layer_params = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_layers)
    linears = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    lora_params: dict[str, int] = {}
    lora_inputs: dict[str, int] = {}
    lora_ranks: dict[str, int] = {}
    with_lora = plain
    if adapters:
        import warnings

        from peft import get_peft_model

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model = None
            for name, lora in adapters.items():
                if peft_model is None:
                    peft_model = get_peft_model(model, lora, adapter_name=name)
                else:
                    peft_model.add_adapter(name, lora)
        for name in adapters:
            lora_params[name] = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n and f".{name}." in n)
            first = peft_model.get_base_model().get_decoder().layers[0]
            modules = [m for m in first.modules() if hasattr(m, "lora_A") and name in m.lora_A]
            lora_inputs[name] = sum(m.lora_A[name].in_features for m in modules)
            lora_ranks[name] = sum(m.lora_A[name].out_features for m in modules)
        with_lora = _linear_shapes(peft_model)
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = cfg.num_attention_heads
    return Architecture(
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        intermediate=cfg.intermediate_size,
        heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        vocab=cfg.vocab_size,
        context=getattr(cfg, "max_position_embeddings", None) or 2048,
        attention=getattr(cfg, "_attn_implementation", None) or "sdpa",
        base_params=base,
        layer_params=layer_params,
        root_params=root,
        largest_param=max(p.numel() for p in model.parameters()),
        linear_params=sum(linears.values()),
        lora_params=lora_params,
        lora_inputs=lora_inputs,
        lora_ranks=lora_ranks,
        linear_shapes=plain,
        linear_shapes_lora=with_lora,
    )


def _linear_shapes(model) -> tuple:
    import torch

    return tuple(tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.dim() == 2)


def packing_choice(shapes: tuple, threads: int) -> tuple[bool, ...] | None:
    """The packed-linear choice this machine stored for a model of these linear shapes, or None when it has
    not measured one yet."""
    from scope_marl.backends.packed_linear import stored_choice

    return stored_choice(shapes, threads)


# ---- the conversation's tokens ----------------------------------------------------------------------
@dataclass(frozen=True)
class RoleTokens:
    """One role's tokens in one episode, at most: its learner stream and its decode context."""

    prompt: int  # the stream's prompt: context before the role's first sampled token
    response: int  # the stream's response: its turns and everything said between them
    turn_requests: tuple[int, ...]  # columns each of its turns asks the cache for (context + max_new_tokens)

    @property
    def context(self) -> int:
        return self.prompt + self.response


@dataclass(frozen=True)
class Conversation:
    """Both roles' token counts for an episode that plays every turn at its limit (the bound the plan uses)."""

    roles: dict[str, RoleTokens]
    messages: int
    prompt_overhead: int  # chat-template tokens around one message
    assumption: str


def conversation(cfg, arch: Architecture) -> Conversation:
    """Token counts of the longest episode the config allows: each role's system prompt tokenized with the
    model's chat template (the longest over a few train tasks), then every message at its speaker's
    ``max_new_tokens`` plus the template's tokens around a message, for the environment's message limit."""
    from scope_marl.assembly import build_env
    from scope_marl.backends.chat_tokens import ChatTokens
    from scope_marl.core.types import Message
    from scope_marl.envs import AGENT, USER

    env_cfg = cfg.env
    if getattr(env_cfg, "judge", None):
        env_cfg = env_cfg.model_copy(update={"judge": None})  # a judge model is loaded by the env; its tokens do not count here
    env = build_env(env_cfg)
    tokens = ChatTokens(_tokenizer(cfg.model), _default_system_prompt(cfg.model))
    tasks = env.tasks("train")[:TASKS_SAMPLED]
    if not tasks:
        raise PlanError(f"env {env_cfg.name!r} has no train tasks to plan with")
    prefixes = {AGENT: "", USER: getattr(cfg.simulator, "prompt_prefix", "") or ""}
    limits = {AGENT: cfg.agent_sampling.max_new_tokens, USER: _simulator_sampling(cfg.simulator).max_new_tokens}
    system = {}
    for role in (AGENT, USER):
        longest = 0
        for task in tasks:
            text = env.system_prompt(task, role)
            if prefixes[role]:
                text = f"{prefixes[role].rstrip()}\n\n{text}"
            opening = list(env.opening(task))
            longest = max(longest, len(tokens.encode_chat([Message(role="system", content=text), *_viewed(opening, role)])))
        system[role] = longest
    base = len(tokens.encode_chat([Message(role="system", content="s")], add_generation_prompt=False))
    one = len(tokens.encode_chat([Message(role="system", content="s"), Message(role="user", content="hi")], add_generation_prompt=False))
    overhead = max(one - base - len(tokens.encode_text("hi")), 1)
    messages, assumption = _message_limit(cfg, env_cfg)
    first = env.first_speaker(tasks[0])
    speakers = [first if k % 2 == 0 else (USER if first == AGENT else AGENT) for k in range(messages)]
    roles = {}
    for role in (AGENT, USER):
        turns = [k for k, s in enumerate(speakers) if s == role]
        if not turns:
            continue
        size = [limits[s] + overhead for s in speakers]
        prompt = system[role] + sum(size[: turns[0]])
        response = sum(size[turns[0] : turns[-1]]) + limits[role]
        requests = tuple(min(system[role] + sum(size[:k]) + limits[role], arch.context) for k in turns)
        total = min(prompt + response, arch.context)
        roles[role] = RoleTokens(prompt=min(prompt, arch.context), response=max(total - prompt, 1), turn_requests=requests)
    return Conversation(roles=roles, messages=messages, prompt_overhead=overhead, assumption=assumption)


def _viewed(messages, role: str):
    from scope_marl.core.types import Message

    return [Message(role="assistant" if m.role == role else "user", content=m.content) for m in messages]


def _message_limit(cfg, env_cfg) -> tuple[int, str]:
    """Messages an episode can hold, and the assumption behind the number."""
    cap = cfg.rollout.max_steps
    exchanges = getattr(env_cfg, "max_exchanges", None)
    if exchanges is not None:
        n = 2 * exchanges
        note = f"{exchanges} exchanges (env.max_exchanges) = {n} messages"
    else:
        n = env_cfg.max_steps
        note = f"{n} messages (env.max_steps; tool calls and results counted as messages of max_new_tokens)"
    if cap is not None and cap < n:
        n, note = cap, f"{cap} messages (rollout.max_steps)"
    return n, note + ", every message at its speaker's max_new_tokens"


def _simulator_sampling(sim):
    members = getattr(sim, "members", None)
    if members:
        return max((_simulator_sampling(m) for m in members), key=lambda s: s.max_new_tokens)
    from scope_marl.core.types import SamplingParams

    return getattr(sim, "sampling", None) or SamplingParams()


def _simulator_specs(sim) -> list[str]:
    members = getattr(sim, "members", None)
    if members:
        return [spec for m in members for spec in _simulator_specs(m)]
    return [sim.model] if getattr(sim, "model", None) else []


def _tokenizer(spec: str):
    kind, _, arg = spec.partition(":")
    if kind == "embedded":
        from scope_marl.backends.embedded import load_tokenizer

        return load_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(arg)


def _default_system_prompt(spec: str) -> str | None:
    if spec == "embedded":
        from scope_marl.backends.embedded import DEFAULT_SYSTEM_PROMPT

        return DEFAULT_SYSTEM_PROMPT
    return None


# ---- the plan ------------------------------------------------------------------------------------------
@dataclass
class Part:
    name: str
    phase: str  # baseline | persistent | rollout | learner | optimizer
    bytes: int
    note: str = ""


PHASES = ("rollout", "learner", "optimizer")


@dataclass
class Knobs:
    """What a fix may change; the rest of the config stays as it is."""

    gradient_checkpointing: bool
    token_budget: int
    simulator_token_budget: int
    max_concurrent: int
    finetune: str
    parallel: str
    gpus: int  # ranks (1 on the CPU)


@dataclass
class Plan:
    device: str  # cpu | cuda
    dtype: str
    knobs: Knobs
    parts: list[Part]
    capacity: int  # bytes per device
    capacity_source: str
    assumptions: list[str] = field(default_factory=list)
    activations: dict[str, int] = field(default_factory=dict)  # with / without gradient checkpointing
    fix: str | None = None

    def phase_bytes(self, phase: str) -> int:
        return sum(p.bytes for p in self.parts if p.phase == phase)

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=self.phase_bytes)

    @property
    def phases_add(self) -> bool:
        """CPU: the phases add up (glibc's malloc keeps what the rollout frees, and the learner's differently
        sized tensors land beside it: measured, tests/test_plan.py); GPU: torch's caching allocator hands
        a phase's freed blocks to the next, so the largest phase counts."""
        return self.device == "cpu"

    @property
    def transient(self) -> int:
        phases = [self.phase_bytes(p) for p in PHASES]
        return sum(phases) if self.phases_add else max(phases)

    @property
    def total(self) -> int:
        return self.phase_bytes("baseline") + self.phase_bytes("persistent") + self.transient

    @property
    def total_rule(self) -> str:
        return "baseline + persistent + " + ("rollout + learner + optimizer" if self.phases_add else "the largest phase")

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_dict(self) -> dict:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "gpus": self.knobs.gpus if self.device == "cuda" else 0,
            "per": "GPU (each rank)" if self.device == "cuda" else "process",
            "knobs": asdict(self.knobs),
            "parts": [{**asdict(p), "gib": p.bytes / GIB} for p in self.parts],
            "phases_gib": {p: self.phase_bytes(p) / GIB for p in ("baseline", "persistent", *PHASES)},
            "peak_phase": self.peak_phase,
            "total_rule": self.total_rule,
            "activations_gib": {k: v / GIB for k, v in self.activations.items()},
            "plan_total_gib": self.total / GIB,
            "capacity_gib": self.capacity / GIB,
            "capacity_source": self.capacity_source,
            "fits": self.fits,
            "fix": self.fix,
            "assumptions": self.assumptions,
        }

    def result_line(self) -> str:
        return f"RESULT plan_total_gib={self.total / GIB:.3f} fits={str(self.fits).lower()}"


@dataclass
class Facts:
    """Everything read from the config, the model configs and the tokenizer: gathered once, then each
    candidate fix is only arithmetic (:func:`estimate`)."""

    cfg: object
    arch: Architecture
    extra_models: dict[str, Architecture]  # other local models the simulators play on
    talk: Conversation
    device: str
    itemsize: int
    dtype: str
    compiled_attention: bool  # the CPU's compiled decode-attention op (a C++ compiler): caches fault in only what is written
    packing: tuple[bool, ...] | None  # the stored packed-linear choice (CPU), None: not calibrated yet
    packing_lora: tuple[bool, ...] | None
    threads: int
    capacity: int
    capacity_source: str
    ranks: int  # GPUs (ranks) the plan starts from; 1 on the CPU


def gather(cfg, gpus: int | None = None, gpu_memory_gib: float | None = None, memory_gib: float | None = None) -> Facts:
    """Read what a plan needs: the device and dtype the run would resolve to (``--gpus`` with ``device: auto``
    plans for CUDA in bfloat16), the model architectures on meta, the conversation's tokens, the capacity."""
    import torch

    from scope_marl.backends.kernels import compiler

    hw = cfg.hardware
    wants_gpu = gpus is not None or gpu_memory_gib is not None
    if hw.device == "cpu" and wants_gpu:
        raise PlanError(
            "hardware.device is cpu but --gpus / --gpu-memory ask for a GPU plan; set hardware.device: auto (or cuda), or drop them"
        )
    if hw.device == "auto":
        device = "cuda" if wants_gpu or torch.cuda.is_available() else "cpu"
    else:
        device = "cuda" if hw.device.startswith("cuda") else "cpu"
    dtype = hw.dtype if hw.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    if device == "cpu" and hw.parallel == "fsdp":
        raise PlanError("hardware.parallel: fsdp shards over GPUs; a CPU plan is one process (use --gpus N, or parallel: replicate)")
    if device == "cuda":
        ranks = gpus or (torch.cuda.device_count() if torch.cuda.is_available() else 1)
        if gpu_memory_gib is not None:
            capacity, source = int(gpu_memory_gib * GIB), f"--gpu-memory {gpu_memory_gib:g} GiB per GPU"
        elif torch.cuda.is_available():
            capacity = torch.cuda.get_device_properties(0).total_memory
            source = f"{torch.cuda.get_device_name(0)} ({capacity / GIB:.0f} GiB)"
        else:
            capacity, source = 80 * GIB, "assumed 80 GiB per GPU (an H100); pass --gpu-memory"
    else:
        ranks = 1
        if memory_gib is not None:
            capacity, source = int(memory_gib * GIB), f"--memory {memory_gib:g} GiB"
        else:
            capacity, source = machine_memory(), "this machine's RAM (/proc/meminfo MemTotal)"
    adapters = _lora_adapters(cfg)
    config = model_config(cfg.model)
    if config is None:
        raise PlanError(f"model {cfg.model!r} is not a local model; training needs embedded or hf:DIR")
    arch = architecture(config, adapters)
    extra = {}
    for spec in dict.fromkeys(_simulator_specs(cfg.simulator)):
        if spec != cfg.model:
            other = model_config(spec)
            if other is not None:
                extra[spec] = architecture(other, {})
    threads = cfg.threads or torch.get_num_threads()
    itemsize = {"float32": 4, "bfloat16": 2}[dtype]
    cpu_fp32 = device == "cpu" and dtype == "float32"
    return Facts(
        cfg=cfg,
        arch=arch,
        extra_models=extra,
        talk=conversation(cfg, arch),
        device=device,
        itemsize=itemsize,
        dtype=dtype,
        compiled_attention=cpu_fp32 and compiler() is not None,
        packing=packing_choice(arch.linear_shapes, threads) if cpu_fp32 else (),
        packing_lora=packing_choice(arch.linear_shapes_lora, threads) if cpu_fp32 else (),
        threads=threads,
        capacity=capacity,
        capacity_source=source,
        ranks=ranks,
    )


def _lora_adapters(cfg) -> dict[str, object]:
    """The LoRA adapters a LoRA run of this config adds (``training.policies.add_run_adapters``): the agent's and,
    in co-training, the simulator's (its saved ``init`` adapter's own config when it starts from one)."""
    from peft import LoraConfig, PeftConfig

    lora = cfg.lora
    make = lambda: LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules))
    adapters = {"agent": make()}
    if cfg.simulator.mode == "trainable":
        init = getattr(cfg.simulator, "init", None)
        if init and not (Path(init) / "adapter_config.json").is_file():
            raise PlanError(f"simulator.init {init!r} is not a saved adapter directory (no adapter_config.json there)")
        adapters["simulator"] = PeftConfig.from_pretrained(init) if init else make()
    return adapters


def machine_memory() -> int:
    """MemTotal of /proc/meminfo in bytes (or the physical pages sysconf reports)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def knobs_of(facts: Facts) -> Knobs:
    cfg = facts.cfg
    sim_learner = cfg.simulator_learner or cfg.learner
    return Knobs(
        gradient_checkpointing=cfg.learner.gradient_checkpointing,
        token_budget=cfg.learner.token_budget,
        simulator_token_budget=sim_learner.token_budget,
        max_concurrent=cfg.rollout.max_concurrent,
        finetune=cfg.finetune,
        parallel=cfg.hardware.parallel,
        gpus=facts.ranks,
    )


def estimate(facts: Facts, knobs: Knobs) -> Plan:
    """The plan of ``facts`` under ``knobs``: every part's bytes per device (per GPU rank, or the CPU process)."""
    cfg, arch, talk = facts.cfg, facts.arch, facts.talk
    gpu = facts.device == "cuda"
    b = facts.itemsize
    ranks = knobs.gpus if gpu else 1
    full = knobs.finetune == "full"
    if knobs.parallel == "fsdp" and not full:
        raise PlanError(
            "hardware.parallel: fsdp shards a fully fine-tuned agent (finetune: full); LoRA runs keep a whole base on every rank"
        )
    # training.policies.shards_agent: sharded when asked for, or for float32 master weights under bfloat16.
    sharded = full and (knobs.parallel == "fsdp" or facts.dtype != "float32")
    shard_ranks = ranks if knobs.parallel == "fsdp" else 1
    parts: list[Part] = []
    assumptions = [f"episodes: {talk.assumption}"]

    def add(name: str, phase: str, nbytes: float, note: str = "") -> None:
        parts.append(Part(name, phase, int(nbytes), note))

    # -- baseline
    if gpu:
        add("CUDA context", "baseline", CUDA_CONTEXT, "documented (not measured here): context, cuBLAS workspace, lazily loaded kernels")
        if ranks > 1:
            add("NCCL buffers", "baseline", NCCL_BUFFERS, f"{ranks} ranks")
    else:
        add(
            "runtime (python, torch, transformers, tokenizer)",
            "baseline",
            CPU_BASELINE,
            "measured: 442 MiB imports + ~70 MiB allocator and run overhead",
        )

    # -- persistent
    n = arch.base_params
    add("base weights", "persistent", n * b, f"{n / 1e6:.1f}M params, {facts.dtype}: the frozen reference and frozen simulators' model")
    for spec, other in facts.extra_models.items():
        add(f"simulator model {spec}", "persistent", other.base_params * b, f"{other.base_params / 1e6:.1f}M params")
    trainable_roles = list(cfg.trainable_roles)
    lora_names = ([] if full else ["agent"]) + (["simulator"] if "user" in trainable_roles else [])
    lora = sum(arch.lora_params.get(name, 0) for name in lora_names)
    if lora:
        add("LoRA weights (fp32)", "persistent", lora * 4, f"{lora / 1e6:.2f}M params: {', '.join(lora_names)}")
        add("LoRA gradients (fp32)", "persistent", lora * 4)
        add("LoRA AdamW moments (2 x fp32)", "persistent", lora * 8)
    if full:
        if sharded:
            share = n / shard_ranks
            where = f"1/{shard_ranks} per rank" if shard_ranks > 1 else "one rank"
            add("agent master weights (fp32, sharded)", "persistent", share * 4, f"FSDP2 {where} (training.sharding)")
            add("agent gradients (fp32, sharded)", "persistent", share * 4)
            add("agent AdamW moments (2 x fp32, sharded)", "persistent", share * 8)
        else:
            add("agent's own copy (full fine-tuning)", "persistent", n * b, f"{facts.dtype}, every weight trained")
            add("agent gradients", "persistent", n * b, f"{facts.dtype}: plain AdamW on the weights themselves")
            add("agent AdamW moments (2 x)", "persistent", 2 * n * b, f"{facts.dtype}")

    if not gpu and facts.dtype == "float32" and cfg.sampler is None:
        # backends.packed_linear: every sampling model's nn.Linear weights (LoRA's included) get a oneDNN copy
        # at the row counts where this machine measured it faster; the copies stay with the model.
        linears = arch.linear_params * (2 if full else 1) + (0 if full else lora_all(arch, cfg))
        choice = facts.packing if full else facts.packing_lora
        if choice is None:
            add("packed linear weights (sampling)", "persistent", linears * 4, "assumed: this machine has not calibrated this shape yet")
        elif any(choice):
            add("packed linear weights (sampling)", "persistent", linears * 4, f"oneDNN copies; chosen at 1/8/64 rows: {list(choice)}")

    # -- rollout: the decode sessions' caches for the episodes in flight
    tasks_here = math.ceil(cfg.tasks_per_step / ranks)
    episodes = min(knobs.max_concurrent, tasks_here * cfg.rollout.group_size)
    sessions = _sessions(cfg, full) if cfg.sampler is None else []  # with a sampler server, every seat plays there
    if cfg.sampler is not None:
        assumptions.append(f"rollouts on the sampler {cfg.sampler}: no local key/value cache")
    kv_total = logits_total = step_total = 0
    kv_per_token = arch.kv_bytes_per_token(b)
    kv_notes = []
    for roles in sessions:
        conversations = episodes * len(roles)
        slot_space = 2 * MAX_ROWS  # DecodeSession.slot_space: max_rows live + max_parked (= max_rows)
        slots = min(slot_space, conversations)
        spilled = conversations - slots
        contexts = [talk.roles[r].context for r in roles if r in talk.roles]
        if facts.compiled_attention:
            # torch.empty buffers: a slot's pages are faulted in only for the columns written.
            per_episode = sum(contexts)
            kv = episodes * per_episode * kv_per_token
            how = f"{conversations} conversations x their written columns"
        else:
            columns = max(_grown_columns(talk.roles[r].turn_requests) for r in roles if r in talk.roles)
            kv = (slots * columns + spilled * max(contexts)) * kv_per_token
            how = f"{slots} slots x {columns} columns" + (f" + {spilled} spilled copies" if spilled else "")
        kv_total += kv
        kv_notes.append(how)
        logits_total += slot_space * arch.vocab * 4  # DecodeSession.logits: one fp32 row per slot
        rows = min(MAX_ROWS, conversations)
        prefill = min(
            PREFILL_BUDGET, math.ceil(episodes / cfg.rollout.group_size) * max(talk.roles[r].prompt for r in roles if r in talk.roles)
        )
        step_total = max(step_total, _step_working_set(arch, prefill + rows, rows, b))
    add(
        "KV cache (rollout)",
        "rollout",
        kv_total,
        f"{episodes} episodes in flight, {kv_per_token} B/token; " + "; ".join(kv_notes),
    )
    add("decode logits buffers", "rollout", logits_total, f"{len(sessions)} session(s) x 128 slots x vocab, fp32")
    add("decode step working set", "rollout", step_total, "one packed forward: a prefill chunk plus the decoding rows")
    if sharded:
        add(
            "agent gathered for the rollout",
            "rollout",
            n * b,
            f"the whole agent in {facts.dtype} on every rank (training.sharding.gathered)",
        )

    # -- learner: the largest micro-batch of any trainable role (the learners update one after the other)
    learner_parts: list[Part] = []
    activations: dict[str, int] = {}  # the chosen learner's micro-batch, with and without gradient checkpointing
    for role in trainable_roles:
        if role not in talk.roles:
            continue
        settings = cfg.learner if role == "agent" else (cfg.simulator_learner or cfg.learner)
        budget = knobs.token_budget if role == "agent" else knobs.simulator_token_budget
        tokens = talk.roles[role]
        trains_lora = not (full and role == "agent")
        batch = largest_micro_batch(tokens.prompt, tokens.response, cfg.rollout.group_size, tasks_here, budget)
        spec = ScoringShape(arch, batch, tokens, b, trains_lora, "agent" if role == "agent" else "simulator")
        use = spec.policy(knobs.gradient_checkpointing)
        other = spec.policy(not knobs.gradient_checkpointing)
        reference = spec.reference() if settings.kl_coef > 0 else 0
        transient = max(use.transient, reference)
        rows, prompts = batch
        on_off = {True: "on", False: "off"}
        candidate = [
            Part(
                f"activations kept ({role} micro-batch)",
                "learner",
                use.kept,
                f"{prompts} prompt(s) of {tokens.prompt} + {rows} responses of {tokens.response} tokens, "
                f"gradient checkpointing {on_off[knobs.gradient_checkpointing]} "
                f"(with it {on_off[not knobs.gradient_checkpointing]}: {(other.kept + max(other.transient, reference)) / GIB:.3f} GiB in all)",
            ),
            Part(
                "learner transients",
                "learner",
                transient,
                "the KL reference's no-grad scoring (its key/value cache)"
                if reference >= use.transient
                else "the LM head's chunk buffers / one layer's gradients",
            ),
        ]
        if sum(p.bytes for p in candidate) > sum(p.bytes for p in learner_parts):
            learner_parts = candidate
            activations = {
                f"{'with' if on else 'without'}_checkpointing": spec.policy(on).kept + max(spec.policy(on).transient, reference)
                for on in (True, False)
            }
    parts.extend(learner_parts)
    if sharded:
        add(
            "gathered layers (FSDP2)",
            "learner",
            (2 * arch.layer_params + arch.root_params) * b,
            "two decoder layers and the root in the compute dtype",
        )
    # -- optimizer step
    if gpu:
        moments = (n / shard_ranks if sharded else n) if full else 0
        temp = max(lora, moments) * (4 if (sharded or not full) else b)
        add("AdamW step temporaries", "optimizer", temp, "torch's foreach AdamW: one temporary per moment tensor")
    else:
        add("AdamW step temporaries", "optimizer", (arch.largest_param if full else 0) * b, "single-tensor AdamW: one tensor's temporary")
    if gpu and full and sharded:
        assumptions.append("FSDP2: per rank, 1/N of the fp32 master weights, gradients and moments; the rollout gathers the whole agent")
    assumptions.append(
        f"micro-batch tokens: learner.token_budget, at most the step's own batch ({tasks_here} tasks x {cfg.rollout.group_size} rollouts per rank)"
    )
    return Plan(
        device=facts.device,
        dtype=facts.dtype,
        knobs=knobs,
        parts=parts,
        capacity=facts.capacity,
        capacity_source=facts.capacity_source,
        assumptions=assumptions,
        activations=activations,
    )


def lora_all(arch: Architecture, cfg) -> int:
    """LoRA parameters on the base of a LoRA run (every adapter the trainer adds)."""
    return sum(arch.lora_params.values()) if cfg.simulator.mode == "trainable" else arch.lora_params.get("agent", 0)


def _sessions(cfg, full: bool) -> list[tuple[str, ...]]:
    """The decode sessions a rollout opens (one per model and sampling, ``Seat.batch_key``) and the roles in each."""
    same_model = _simulator_specs(cfg.simulator) == [cfg.model] and not full
    same_sampling = cfg.agent_sampling.model_dump_json(exclude={"seed"}) == _simulator_sampling(cfg.simulator).model_dump_json(
        exclude={"seed"}
    )
    local_sim = any(model_kind(s) for s in _simulator_specs(cfg.simulator))
    if not local_sim:
        return [("agent",)]
    if same_model and same_sampling:
        return [("agent", "user")]
    return [("agent",), ("user",)]


def model_kind(spec: str) -> bool:
    kind, _, arg = spec.partition(":")
    return (kind == "embedded" and not arg) or kind == "hf"


def _grown_columns(requests: Sequence[int]) -> int:
    """The column capacity ``RowCache.reserve`` ends with for these successive requests (geometric growth)."""
    columns = 0
    for need in requests:
        if need > columns:
            columns = need if columns == 0 else max(need, int(columns * RowCache.GROWTH))
    return columns


def _step_working_set(arch: Architecture, tokens: int, rows: int, b: int) -> int:
    """One no-grad packed forward: a layer's transient tensors for ``tokens`` tokens (residual, norm,
    q/k/v, attention out, three MLP-wide tensors) and the logits and sampling passes of ``rows`` rows."""
    per_token = 4 * arch.hidden + arch.q_dim + 2 * arch.kv_dim + 3 * arch.intermediate
    return tokens * per_token * b + rows * arch.vocab * 4 * 4


def largest_micro_batch(prompt: int, response: int, group: int, tasks: int, budget: int) -> tuple[int, int]:
    """(rows, distinct prompts) of the largest micro-batch ``Learner._micro_batches`` makes from ``tasks``
    groups of ``group`` streams of these lengths: a micro-batch costs its distinct prompts once each plus
    every response, and closes when the next stream would take it over ``budget``."""
    batches = []
    rows = prompts = 0
    for _ in range(tasks):
        for member in range(group):
            new = 1 if rows == 0 or member == 0 else 0
            if rows and (prompts + new) * prompt + (rows + 1) * response > budget:
                batches.append((rows, prompts))
                rows, prompts, new = 0, 0, 1
            rows, prompts = rows + 1, prompts + new
    batches.append((rows, prompts))
    return max(batches)


def per_token_layer_bytes(arch: Architecture, b: int, trains_lora: bool, lora_name: str) -> int:
    """Bytes autograd keeps per token in one decoder layer (module docstring)."""
    saved = (4 * arch.hidden + 2 * arch.q_dim + 4 * arch.intermediate) * b + (arch.heads + 2) * 4
    if trains_lora:
        saved += arch.lora_ranks.get(lora_name, 0) * 4
        if b != 4:  # peft casts each target module's input to the adapter's float32
            saved += arch.lora_inputs.get(lora_name, 0) * 4
    return saved


@dataclass(frozen=True)
class Scoring:
    saved: int  # what autograd saves for the backward (the tensors a saved_tensors_hooks would see)
    alive: int  # other tensors alive until the loss (the final hidden states, packed)
    transient: int  # the most alive on top of both at once (the head's chunk buffers, the backward's gradients)

    @property
    def kept(self) -> int:
        return self.saved + self.alive


@dataclass(frozen=True)
class ScoringShape:
    """One learner micro-batch: ``rows`` responses over ``prompts`` distinct prompts (``batch``)."""

    arch: Architecture
    batch: tuple[int, int]
    tokens: RoleTokens
    b: int
    trains_lora: bool
    lora_name: str

    def policy(self, checkpointing: bool) -> Scoring:
        """The scored policy with gradients. Without checkpointing (``Learner._hidden_shared_prompts``) each
        prompt runs once, its keys and values are repeated for every response, and every layer keeps what
        autograd saves. With it (``Learner._hidden_checkpointed``) every stream runs whole, each layer keeps
        only its input, and the backward recomputes one layer at a time."""
        arch, b = self.arch, self.b
        rows, prompts = self.batch
        p, r = self.tokens.prompt, self.tokens.response
        per = per_token_layer_bytes(arch, b, self.trains_lora, self.lora_name)
        n = rows * r  # response tokens the LM head scores
        head_trains = not self.trains_lora
        hidden = 2 * n * arch.hidden * b  # the final hidden states, and packed
        if checkpointing:
            width = p + r
            t = rows * width
            mask = rows * width * width * b
            kept = arch.layers * t * arch.hidden * b + mask
            layer = t * per + 2 * arch.kv_dim * t * b + mask + _eager(arch, rows, width, width, b)
            backward = 2 * layer  # one layer recomputed, and its gradients
        else:
            t = prompts * p + rows * (r - 1)
            kv = (prompts * p + rows * (p + r)) * 2 * arch.kv_dim * b
            mask = (rows * (r - 1) * (p + r - 1) + prompts * p * p) * b
            layer = t * per + kv + mask + _eager(arch, prompts, p, p, b) + _eager(arch, rows, r - 1, p + r - 1, b)
            kept = arch.layers * layer
            backward = layer  # one layer's activation gradients
        head_kept = n * arch.vocab * 4 * 2 if head_trains else n * arch.hidden * 4
        rope = 2 * t * arch.head_dim * b  # the rotary cos and sin of every position, shared by the layers
        return Scoring(kept + head_kept + rope, hidden, max(backward, head_buffers(arch, n)))

    def reference(self) -> int:
        """The KL reference's no-grad scoring while the policy's graph is alive: its key/value cache (the
        prompts' states repeated per response), one layer's transients and the head's buffers."""
        arch, b = self.arch, self.b
        rows, prompts = self.batch
        p, r = self.tokens.prompt, self.tokens.response
        cache = arch.layers * (prompts * p + rows * (p + r)) * 2 * arch.kv_dim * b
        layer = (prompts * p + rows * r) * (4 * arch.hidden + arch.q_dim + 3 * arch.intermediate) * b
        return cache + max(layer, head_buffers(arch, rows * r))


def _eager(arch: Architecture, rows: int, q: int, k: int, b: int) -> int:
    """Eager attention keeps its [rows, heads, q, k] probabilities (sdpa keeps none)."""
    return rows * arch.heads * q * k * b * 2 if arch.attention == "eager" else 0


def head_buffers(arch: Architecture, n: int) -> int:
    """``token_logprobs``: two [128, vocab] fp32 buffers while the head scores ``n`` tokens (a trained head
    keeps each chunk's log-softmax and exp instead, counted as kept)."""
    return 2 * min(CHUNK_ROWS, max(n, 1)) * arch.vocab * 4


# ---- fixes ---------------------------------------------------------------------------------------------
def find_fix(facts: Facts, plan: Plan) -> str | None:
    """The least change that makes a plan that does not fit fit, trying in order: gradient checkpointing,
    a smaller token budget, fewer episodes in flight, LoRA instead of full fine-tuning, FSDP over more GPUs."""
    if plan.fits:
        return None
    start = plan.knobs

    def fits(knobs: Knobs) -> bool:
        try:
            return estimate(facts, knobs).fits
        except PlanError:
            return False

    def halvings(value: int, floor: int) -> list[int]:
        out = []
        while value // 2 >= floor:
            value //= 2
            out.append(value)
        return out

    current = start
    changes: list[str] = []
    if not current.gradient_checkpointing:
        current = replace(current, gradient_checkpointing=True)
        changes.append("learner.gradient_checkpointing: true")
        if fits(current):
            return "; ".join(changes)
    for budget in halvings(current.token_budget, 64):
        trial = replace(current, token_budget=budget, simulator_token_budget=min(current.simulator_token_budget, budget))
        if fits(trial):
            return "; ".join([*changes, f"learner.token_budget: {budget}"])
    for concurrent in halvings(current.max_concurrent, 1):
        trial = replace(current, max_concurrent=concurrent)
        if fits(trial):
            return "; ".join([*changes, f"rollout.max_concurrent: {concurrent}"])
    if current.finetune == "full":
        trial = replace(current, finetune="lora", parallel="replicate")
        if fits(trial):
            return "; ".join([*changes, "finetune: lora"])
        if facts.device == "cuda":
            for gpus in range(max(current.gpus, 1) + (current.parallel == "fsdp"), 65):
                trial = replace(current, parallel="fsdp", gpus=gpus)
                if fits(trial):
                    return "; ".join([*changes, f"hardware.parallel: fsdp over {gpus} GPUs (torchrun --nproc-per-node {gpus})"])
    return None


def plan_run(cfg, gpus: int | None = None, gpu_memory_gib: float | None = None, memory_gib: float | None = None) -> Plan:
    """The plan of a training config as it stands (``scope plan``), with the fix when it does not fit."""
    if gpus is not None and gpus < 1:
        raise PlanError("--gpus must be 1 or more")
    facts = gather(cfg, gpus, gpu_memory_gib, memory_gib)
    plan = estimate(facts, knobs_of(facts))
    if not plan.fits:
        plan.fix = find_fix(facts, plan) or "no change in the list fits: a smaller model, or GPUs with more memory"
    return plan


def sampler_share(cfg, gpu_memory_gib: float | None = None, headroom_gib: float = 1.0) -> float:
    """The share of one GPU a vLLM sampler server may take (its ``--gpu-memory-utilization``) when the run
    of ``cfg`` trains on the same GPU: what the learner's plan leaves, less ``headroom_gib`` for allocator
    fragmentation. An error when the learner alone leaves the server less than a tenth of the GPU."""
    plan = plan_run(cfg, gpus=1, gpu_memory_gib=gpu_memory_gib)
    share = (plan.capacity - plan.total - headroom_gib * GIB) / plan.capacity
    if share < 0.1:
        raise PlanError(
            f"the learner needs {plan.total / GIB:.1f} of the GPU's {plan.capacity / GIB:.1f} GiB, leaving a colocated "
            f"vLLM server {max(share, 0):.0%} of it; {plan.fix or 'lower learner.token_budget or rollout.max_concurrent'}, "
            "or serve vLLM on another GPU"
        )
    return round(share, 3)
