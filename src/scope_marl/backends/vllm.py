"""A vLLM server as a token-in-token-out backend, with LoRA adapters loaded into it at run time.

vLLM cannot share this project's environment (it pins its own torch and transformers), so it runs as
its own server (``scope serve vllm``) and this client talks to its OpenAI-compatible HTTP API:

- ``POST /v1/completions`` with the prompt as token ids (rendered here with the same tokenizer and chat
  template the local learner uses), ``return_token_ids`` for the sampled ids, ``logprobs: 0`` for the
  sampled token's log-prob, ``seed`` per prompt, the end-of-turn ids as ``stop_token_ids`` and
  ``skip_special_tokens: false``. Each prompt is its own request (its own seed); the server batches
  concurrent requests itself. In a rollout each turn is sent the moment it is ready
  (``open_session``, ``backends.remote_session``), so the server's continuous batching sees every
  turn that could run.
- ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (the server runs with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``): an adapter ``agent`` updated at step 7 is served as
  ``agent-TAG-v7`` (TAG: random per client, so two runs can share a server); once it is loaded, the
  previous version is unloaded, or, for a caller still playing with it (asynchronous rollouts), kept
  until that caller unloads it. A thread can pin adapter names to versions (:meth:`VLLMChatModel.pinned`)
  so that a batch plays with the versions it started with while newer ones are loaded. Pool members
  are adapters too.

Log-probs against our definition (temperature-scaled full distribution, before top-p): vLLM's default
``--logprobs-mode raw_logprobs`` is the log-softmax of the raw logits (no temperature), and
``processed_logprobs`` is taken after temperature *and* top-k/top-p (renormalized over the nucleus).
``scope serve vllm`` starts the server in ``processed_logprobs`` mode, which equals ours whenever
``top_p == 1``; with ``top_p < 1`` each is higher than ours by minus the log of the nucleus's mass.
Either way the learner trains with ``learner.old_logprobs: learner`` (its own re-scoring) and reports
the sampler/learner gap per step (``logprob_gap``, ``logprob_gap_mean``). Entropies are not returned.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx

from scope_marl.backends.base import (
    Adapters,
    BackendError,
    CacheKeys,
    ContextLengthError,
    Generation,
    PromptIds,
    Seeds,
    check_adapters,
    cut_at_stop,
)
from scope_marl.backends.chat_tokens import ChatTokens
from scope_marl.backends.remote_session import RemoteSession
from scope_marl.core.seeds import derive_seed
from scope_marl.core.types import SamplingParams


def api_root(base_url: str) -> str:
    """``http://host:port`` from a URL given with or without its ``/v1``."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class VLLMChatModel(ChatTokens):
    """``vllm:MODEL@URL``: MODEL is the name the server serves the base weights under."""

    def __init__(
        self,
        served_model: str,
        base_url: str,
        tokenizer,
        default_system_prompt: str | None = None,
        name: str | None = None,
        timeout_s: float = 600.0,
        max_parallel: int = 256,
        transport: httpx.BaseTransport | None = None,
    ):
        super().__init__(tokenizer, default_system_prompt)
        self.served_model = served_model
        self.base_url = api_root(base_url)
        self.name = name or f"vllm:{served_model}@{self.base_url}"
        headers = {"Authorization": f"Bearer {os.environ['VLLM_API_KEY']}"} if os.environ.get("VLLM_API_KEY") else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers, transport=transport)
        self._pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="vllm")
        self._served: dict[str, str] = {}  # our adapter name -> the versioned name the server holds
        self._pins = threading.local()  # per thread: adapter name -> the served version it plays with
        self._tag = secrets.token_hex(3)  # two clients (two runs) on one server never collide on a name
        self._context_length: int | None = None

    # ---- server --------------------------------------------------------------------------------
    def _unreachable(self, err: Exception) -> BackendError:
        return BackendError(
            f"no vLLM server answers at {self.base_url} ({type(err).__name__}); start one with "
            f"`scope serve vllm --model {self.served_model}` or pass the right URL in vllm:MODEL@URL"
        )

    def _post(self, path: str, body: dict) -> httpx.Response:
        try:
            response = self._http.post(path, json=body)
        except httpx.TransportError as err:
            raise self._unreachable(err) from None
        if response.status_code >= 400:
            raise BackendError(f"the vLLM server at {self.base_url} refused {path} ({response.status_code}): {_message(response)}")
        return response

    @property
    def context_length(self) -> int:
        """The server's ``max_model_len`` for the base model (asked once)."""
        if self._context_length is None:
            try:
                models = self._http.get("/v1/models").json()["data"]
            except httpx.TransportError as err:
                raise self._unreachable(err) from None
            base = next((m for m in models if m["id"] == self.served_model), None)
            if base is None:
                raise BackendError(f"the vLLM server at {self.base_url} serves {[m['id'] for m in models]}, not {self.served_model!r}")
            self._context_length = int(base.get("max_model_len") or 2048)
        return self._context_length

    # ---- adapters ------------------------------------------------------------------------------
    @property
    def adapters(self) -> list[str]:
        return list(self._served)

    def served_name(self, adapter: str | None) -> str:
        """The name the server knows ``adapter`` by: the version this thread pinned, else the newest."""
        if adapter is None:
            return self.served_model
        pinned = getattr(self._pins, "names", None)
        return pinned[adapter] if pinned and adapter in pinned else self._served[adapter]

    @contextmanager
    def pinned(self, names: Mapping[str, str]) -> Iterator[None]:
        """Requests sent from this thread use the served versions ``names`` (adapter -> served name)
        instead of the newest, so a batch keeps the weights it started with while others are loaded."""
        self._pins.names = dict(names)
        try:
            yield
        finally:
            self._pins.names = None

    def load_adapter(self, name: str, path: str | os.PathLike, version: int, unload_previous: bool = True) -> str:
        """Serve the saved adapter at ``path`` (peft layout, readable by the server) as version ``version``
        of ``name``; the previous version is unloaded once the new one is in, unless ``unload_previous``
        is False (then the caller unloads it with :meth:`unload` when nothing plays with it any more).
        Returns the served name."""
        if not (Path(path) / "adapter_config.json").is_file():
            raise BackendError(f"{path} is not a saved adapter directory (no adapter_config.json)")
        served = f"{name}-{self._tag}-v{version}"
        if self._served.get(name) == served:
            return served
        self._post("/v1/load_lora_adapter", {"lora_name": served, "lora_path": str(Path(path).resolve())})
        stale, self._served[name] = self._served.get(name), served
        if stale is not None and unload_previous:
            self.unload(stale)
        return served

    def unload(self, served: str) -> None:
        """Unload one served version (a name :meth:`load_adapter` returned) from the server."""
        self._post("/v1/unload_lora_adapter", {"lora_name": served})

    def add_adapter(self, name: str, source) -> None:
        """A saved adapter directory (a pool member, a checkpoint's adapter) under ``name``, version 0."""
        if not isinstance(source, str | os.PathLike):
            raise BackendError("a vLLM server loads adapters from saved directories; save the adapter first (save_pretrained)")
        if name in self._served:
            raise BackendError(f"adapter name {name!r} is already taken; choose another name")
        self.load_adapter(name, source, 0)

    def remove_adapter(self, name: str) -> None:
        """Unload every version of ``name`` from the server."""
        served = self._served.pop(name, None)
        if served is not None:
            self.unload(served)

    # ---- generation ------------------------------------------------------------------------------
    def generate_ids(
        self, prompt_ids: PromptIds, sampling: SamplingParams, adapters: Adapters = None, cache_keys: CacheKeys = None, seeds: Seeds = None
    ) -> list[Generation]:
        """One completion per prompt, token ids in and out (the server's prefix cache plays the role of ``cache_keys``)."""
        n = len(prompt_ids)
        adapters = self._check(prompt_ids, adapters)
        if seeds is not None and len(seeds) != n:
            raise BackendError(f"got {len(seeds)} seeds for {n} prompts; pass one per prompt or None")
        # Without per-prompt seeds, sampling.seed still gives each prompt its own stream (one shared seed would
        # make equal prompts sample equal replies).
        if seeds is None and sampling.seed is not None:
            seeds = [derive_seed(sampling.seed, i) for i in range(n)]
        # Served names are read here, in the caller's thread, where its pins hold (not in the pool's threads).
        rows = [
            (list(p), self.served_name(a), seeds[i] if seeds is not None else None) for i, (p, a) in enumerate(zip(prompt_ids, adapters))
        ]
        return list(self._pool.map(lambda row: self._one(*row, sampling, self.context_length), rows))

    def open_session(self, sampling: SamplingParams) -> RemoteSession:
        """Turns sent as one request each the moment they are ready, handed back as each finishes
        (``backends.remote_session``); the rollout engine keeps one per model and sampling."""
        sent = 0

        def send(prompt: list[int], adapter: str | None, seed: int | None) -> Future:
            nonlocal sent
            self._check([prompt], [adapter])
            if seed is None and sampling.seed is not None:  # as generate_ids: each prompt its own stream
                seed = derive_seed(sampling.seed, sent)
            sent += 1
            return self._pool.submit(self._one, prompt, self.served_name(adapter), seed, sampling, self.context_length)

        return RemoteSession(send)

    def _check(self, prompt_ids: Sequence[Sequence[int]], adapters: Sequence[str | None] | None) -> list[str | None]:
        """Refuse prompts the server would refuse (an unknown adapter, a full context) before sending any."""
        adapters = check_adapters(adapters, len(prompt_ids), self.adapters)
        limit = self.context_length
        too_long = [i for i, p in enumerate(prompt_ids) if len(p) >= limit]
        if too_long:
            raise ContextLengthError(f"prompt(s) {too_long} fill the server's {limit}-token context; shorten the conversation")
        if any(len(p) == 0 for p in prompt_ids):
            raise BackendError("empty prompt: every prompt needs at least one token")
        return adapters

    def request(self, prompt: list[int], served: str, seed: int | None, sampling: SamplingParams, limit: int) -> dict:
        """The ``/v1/completions`` body for one prompt to the served name ``served`` (:meth:`served_name`;
        what the recorded-exchange test checks)."""
        body = {
            "model": served,
            "prompt": prompt,
            "max_tokens": min(sampling.max_new_tokens, limit - len(prompt)),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": sorted(self.stop_ids),
            "stop": list(sampling.stop),
        }
        if seed is not None:
            body["seed"] = int(seed) % 2**63
        return body

    def _one(self, prompt: list[int], served: str, seed: int | None, sampling: SamplingParams, limit: int) -> Generation:
        choice = self._post("/v1/completions", self.request(prompt, served, seed, sampling, limit)).json()["choices"][0]
        ids = list(choice.get("token_ids") or [])
        logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise BackendError(
                f"the vLLM server returned {len(ids)} token ids but {len(logprobs)} log-probs; "
                "it must support return_token_ids and logprobs (vLLM >= 0.10)"
            )
        body = ids[:-1] if ids and ids[-1] in self.stop_ids else ids
        text, _ = cut_at_stop(self.decode(body), sampling.stop)
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Generation(text=text, token_ids=ids, logprobs=logprobs, entropies=None, finish_reason=finish, prompt_ids=prompt)

    def release(self, cache_keys: Iterable[Hashable]) -> None:
        """Nothing to free here: the server's prefix cache manages itself."""

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._http.close()


def _message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    error = data.get("error", data) if isinstance(data, dict) else data
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]


def load_vllm(arg: str) -> VLLMChatModel:
    """``MODEL@URL`` -> a client. MODEL ``embedded`` uses the embedded model's tokenizer and system
    prompt; any other MODEL must be a local model directory (its tokenizer is read from there)."""
    model, _, url = arg.partition("@")
    if not url:
        raise BackendError(f"vllm:{arg} names no server; write vllm:MODEL@URL, e.g. vllm:embedded@http://127.0.0.1:8001")
    if model == "embedded":
        from scope_marl.backends.embedded import DEFAULT_SYSTEM_PROMPT, load_tokenizer

        return VLLMChatModel(model, url, load_tokenizer(), DEFAULT_SYSTEM_PROMPT, name=f"vllm:{arg}")
    if not (Path(model) / "tokenizer_config.json").is_file():
        raise BackendError(f"vllm:{arg}: {model!r} is not a local model directory with a tokenizer; the client tokenizes here")
    from transformers import AutoTokenizer

    return VLLMChatModel(model, url, AutoTokenizer.from_pretrained(model), name=f"vllm:{arg}")
