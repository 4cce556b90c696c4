"""A ``ChatModel`` over any OpenAI-compatible chat-completions server.

SCOPE needs strong models it cannot run on a CPU: hosted judges and user simulators, or a
policy served by vLLM / SGLang (``vllm serve``, ``python -m sglang.launch_server``) on a GPU box.
They all speak the OpenAI chat-completions protocol, so one backend built on the official
``openai`` SDK covers them. It is text-in-text-out: servers do not return token ids, so this
backend cannot feed the learner, only act as an environment role or an evaluator.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import openai

from scope_marl.backends.base import Adapters, BackendError, Generation, Prompts, SamplingParams, Seeds, check_adapters, cut_at_stop
from scope_marl.core.types import Message

DEFAULT_BASE_URL = "https://api.openai.com/v1"
LOCAL_PLACEHOLDER_KEY = "EMPTY"  # what vLLM / SGLang accept when started without --api-key
MAX_API_STOPS = 4  # the OpenAI API rejects more; the rest are applied locally


def _is_local(base_url: str) -> bool:
    host = urlsplit(base_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpenAIChatModel:
    """Batched chat generation through an OpenAI-compatible server.

    Args:
        model: the model name the server knows (``gpt-4o-mini``, or the name given to ``vllm serve``).
        base_url: the API root including ``/v1``, e.g. ``http://127.0.0.1:8000/v1``. ``None`` means
            OpenAI itself; the ``OPENAI_BASE_URL`` variable is deliberately ignored so that a run's
            config alone says which server it used.
        api_key_env: name of the environment variable holding the API key. A loopback server
            needs none: a placeholder key is sent when the variable is unset.
        max_concurrency: at most this many requests in flight, across all ``generate`` calls.
        max_retries: retries after the first attempt on 408/409/429/5xx, timeouts and connection
            errors (the SDK's own retry loop: exponential backoff from 0.5 s, capped at 8 s, or the
            server's ``Retry-After`` when it sends one).
        timeout_s: per-attempt timeout in seconds.
        request_logprobs: ask for per-token log-probs (``Generation.logprobs``).
        response_format: default ``response_format`` sent with every request, e.g.
            ``{"type": "json_schema", "json_schema": {...}}``; ``generate`` can override it.
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        max_retries: int = 3,
        timeout_s: float = 60.0,
        request_logprobs: bool = False,
        response_format: dict | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.name = model
        self.model = model
        self.base_url = base_url or DEFAULT_BASE_URL
        self.api_key_env = api_key_env
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.request_logprobs = request_logprobs
        self.response_format = response_format

        api_key = os.environ.get(api_key_env)
        if not api_key:
            if not _is_local(self.base_url):
                raise BackendError(
                    f"environment variable {api_key_env} is not set; it must hold the API key for "
                    f"{self.base_url}. Set it (export {api_key_env}=sk-...) or pass api_key_env= the "
                    "name of the variable that holds the key."
                )
            api_key = LOCAL_PLACEHOLDER_KEY
        self._client = openai.OpenAI(api_key=api_key, base_url=self.base_url, max_retries=max_retries, timeout=timeout_s)
        # One pool per model, not per call, so the bound holds when several threads call generate().
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="openai-chat")
        self._closed = False

    def generate(
        self,
        prompts: Prompts,
        sampling: SamplingParams,
        adapters: Adapters = None,
        seeds: Seeds = None,
        *,
        response_format: dict | None = None,
    ) -> list[Generation]:
        """One completion per prompt, in order (each request with its row's seed when ``seeds`` is given).
        ``response_format`` overrides the default for this call."""
        check_adapters(adapters, len(prompts), known=[])
        if self._closed:
            raise BackendError(f"OpenAIChatModel({self.model!r}) was closed; create a new one")
        fmt = response_format if response_format is not None else self.response_format
        params = [sampling if seeds is None else sampling.model_copy(update={"seed": seed}) for seed in (seeds or [None] * len(prompts))]
        futures = [self._pool.submit(self._one, prompt, p, fmt) for prompt, p in zip(prompts, params)]
        try:
            return [f.result() for f in futures]
        except BaseException:
            # Do not spend requests on a batch that has already failed.
            for f in futures:
                f.cancel()
            raise

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._client.close()

    def __enter__(self) -> OpenAIChatModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _one(self, prompt: Sequence[Message], sampling: SamplingParams, fmt: dict | None) -> Generation:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in prompt],
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
        }
        if sampling.stop:
            kwargs["stop"] = sampling.stop[:MAX_API_STOPS]
        if sampling.seed is not None:
            kwargs["seed"] = sampling.seed
        if self.request_logprobs:
            kwargs["logprobs"] = True
        if fmt is not None:
            kwargs["response_format"] = fmt
        try:
            reply = self._client.chat.completions.create(**kwargs)
        except openai.APIError as err:
            raise self._error(err) from err
        if not reply.choices:
            raise BackendError(f"{self.base_url} returned no choices for model {self.model!r}; check the server log")
        choice = reply.choices[0]
        full = choice.message.content or ""
        # Stops past the 4th were not sent, and some servers keep the stop text: cut here too.
        text, cut = cut_at_stop(full, sampling.stop)
        logprobs = None
        if self.request_logprobs and choice.logprobs is not None and choice.logprobs.content:
            tokens = choice.logprobs.content
            if cut:
                tokens = _through_stop(tokens, full, len(text), sampling.stop)
            logprobs = [t.logprob for t in tokens]
        return Generation(
            text=text,
            token_ids=[],
            logprobs=logprobs,
            entropies=None,
            finish_reason="length" if choice.finish_reason == "length" else "stop",
        )

    def _error(self, err: openai.APIError) -> BackendError:
        # The SDK stamps each attempt with its retry number; the failing request carries the last one.
        try:
            attempts = int(err.request.headers["x-stainless-retry-count"]) + 1
        except (AttributeError, KeyError, ValueError):
            attempts = 1
        if isinstance(err, openai.APIStatusError):
            last = f"HTTP {err.status_code}: {err.message}"
            hint = {
                401: f"the API key in ${self.api_key_env}",
                403: f"the API key in ${self.api_key_env} and its access to this model",
                404: "the model name and that base_url ends in /v1",
                429: "the rate limit / quota, or lower max_concurrency",
            }.get(err.status_code, "the server log, and that it serves this model")
        elif isinstance(err, openai.APITimeoutError):
            last = f"timed out after {self.timeout_s} s"
            hint = "that the server is not overloaded, or raise timeout_s"
        else:
            last = f"{type(err).__name__}: {err.message} ({err.__cause__ or 'no detail'})"
            hint = "that the server is running and reachable at this base_url"
        return BackendError(
            f"chat completion failed at {self.base_url} for model {self.model!r} after {attempts} "
            f"attempt(s) (max_retries={self.max_retries}); last error: {last}. Check {hint}."
        )


def _through_stop(tokens: list[Any], full: str, cut: int, stop: Sequence[str]) -> list[Any]:
    """The tokens up to the end of the stop string found at ``cut`` (ids of a matched stop count as sampled)."""
    end = cut + max((len(s) for s in stop if s and full.startswith(s, cut)), default=0)
    kept, pos = [], 0
    for t in tokens:
        if pos >= end:
            break
        kept.append(t)
        pos += len(t.token)
    return kept
