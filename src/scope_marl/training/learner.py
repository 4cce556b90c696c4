"""A learner updates one role's policy (its LoRA adapter on the shared model) from that role's streams.

One learner per trainable role: in co-training the agent's and the simulator's learners each see
only their own role's RoleStreams and rewards, and each owns an optimizer over its own adapter's
parameters, so training one role can never move the other's weights. With ``adapter=None`` the
learner fine-tunes every weight of its model instead; the KL reference is then a separate, frozen
``reference`` model (there are no adapters to disable). Log-probs are recomputed
exactly as the rollout recorded them (docs/interfaces.md: temperature-scaled full distribution), so the
first update of a batch is on-policy: importance ratios of 1 and no clipping.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence

import torch

from scope_marl.backends.hf import HFChatModel
from scope_marl.config.train import LearnerConfig
from scope_marl.core.types import Episode, RoleStream
from scope_marl.training.data_parallel import all_ranks, all_reduce_, distributed, rank, shard_groups, world
from scope_marl.training.losses import behaviour_weights, get_advantage_fn, loss_agg_normalizer, policy_loss, zero_variance_share
from scope_marl.training.sharding import checkpointed_layers, full, is_sharded, run_body
from scope_marl.training.token_logprobs import body_and_head, check_head_decomposition, token_logprobs


class Learner:
    def __init__(
        self,
        chat: HFChatModel,
        role: str,
        adapter: str | None,
        temperature: float,
        config: LearnerConfig | None = None,
        reference: HFChatModel | None = None,
    ):
        self.chat, self.role, self.adapter, self.reference = chat, role, adapter, reference
        self.temperature = temperature if temperature > 0 else 1.0  # greedy rollouts are scored at T = 1
        self.config = config or LearnerConfig()
        self.threads = None  # a core.machine.ThreadGovernor to re-check between micro-batches (the trainer's), or None
        if adapter is None:  # full fine-tuning
            if chat.adapters:
                raise ValueError(f"full fine-tuning needs a model without LoRA adapters, this one has {chat.adapters}")
            if reference is None and self.config.kl_coef > 0:
                raise ValueError("full fine-tuning with kl_coef > 0 needs a frozen reference model (reference=...)")
            self.params = list(chat.model.parameters())
        else:
            if adapter not in chat.adapters:
                raise ValueError(f"adapter {adapter!r} is not on the model (it has {chat.adapters}); add it with chat.add_adapter first")
            self.params = [p for n, p in chat.model.named_parameters() if "lora_" in n and f".{adapter}." in n]
        if not self.params:
            raise ValueError(f"adapter {adapter!r} has no LoRA parameters to train")
        for p in self.params:
            p.requires_grad_(True)
        for scored in (chat, reference) if reference is not None else (chat,):
            check_head_decomposition(scored.model)
        # LoRA weights are float32 under any base (HFChatModel.add_adapter), so AdamW's state is too; a sharded
        # model's parameters are its float32 master shards (training.sharding).
        self.optimizer = torch.optim.AdamW(self.params, lr=self.config.lr, weight_decay=self.config.weight_decay)
        self.sharded = is_sharded(chat.model)
        self.steps = 0

    # ---- scoring ---------------------------------------------------------------------------------
    def _micro_batches(self, streams: Sequence[RoleStream]) -> list[list[int]]:
        """Consecutive stream indices whose forward pass stays within the token budget, counted as
        :meth:`score` runs it: each distinct prompt once, padded to the longest prompt, plus every
        response padded to the longest response. A GRPO group's rollouts share their prompt, so a
        group's later rollouts cost only their responses and a group is split only when it alone
        exceeds the budget (a split group runs its prompt once per micro-batch)."""
        batches, current = [], []
        prompts: set[tuple[int, ...]] = set()
        prompt_width = response_width = 0
        for i, s in enumerate(streams):
            prompt = tuple(s.prompt_ids)
            widths = max(prompt_width, len(prompt)), max(response_width, len(s.response_ids))
            cost = (len(prompts) + (prompt not in prompts)) * widths[0] + (len(current) + 1) * widths[1]
            if current and cost > self.config.token_budget:
                batches.append(current)
                current, prompts = [], set()
                widths = len(prompt), len(s.response_ids)
            current.append(i)
            prompts.add(prompt)
            prompt_width, response_width = widths
        return batches + ([current] if current else [])

    def score(self, streams: Sequence[RoleStream], use_adapter: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs and entropies of every response token, [B, T] (T = longest response), plus the loss mask.

        The rollouts of one GRPO group share their prompt, so each distinct prompt is run once and
        its key/value states are repeated for every response that continues it (autograd flows back
        through the shared states); with 4 rollouts of a 250-token prompt this halves the tokens the
        update pushes through the model. Prompts are left-padded, responses right-padded; positions
        count only real tokens, as at rollout. The LM head runs only where a response token is
        predicted. ``use_adapter=False`` scores the frozen reference (adapters disabled, or the
        separate reference model under full fine-tuning).
        """
        if self.adapter is None:
            return self._score(streams, self.chat.model if use_adapter else self.reference.model)
        model = self.chat.model
        if use_adapter:
            model.set_adapter(self.adapter)
            return self._score(streams, model)
        with model.disable_adapter():
            return self._score(streams, model)

    def _score(self, streams: Sequence[RoleStream], model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # The transformer body gives hidden states; the LM head runs only on the response positions,
        # packed without padding (token_logprobs). peft's LoRA layers sit inside the body, so the
        # active adapter (or disable_adapter) applies as it does to the whole model. Every tensor is
        # made on the model's device; log-probs, entropies and the mask are float32 whatever the weights.
        body, head = body_and_head(model)
        device = head.weight.device
        width = max(len(s.response_ids) for s in streams)
        ids_r = torch.full((len(streams), width), self.chat.pad_id, dtype=torch.long)
        mask_r = torch.zeros(len(streams), width, dtype=torch.bool)
        mask = torch.zeros(len(streams), width)
        for i, s in enumerate(streams):
            ids_r[i, : len(s.response_ids)] = torch.tensor(s.response_ids)
            mask_r[i, : len(s.response_ids)] = True
            mask[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float)
        ids_r, mask_r, mask = ids_r.to(device), mask_r.to(device), mask.to(device)
        run = functools.partial(run_body, model, body)
        checkpointing = self.config.gradient_checkpointing and torch.is_grad_enabled()
        if checkpointing or is_sharded(model):
            # A sharded model's every forward is a collective: one forward per scoring on every rank, whatever the streams.
            hidden = self._hidden_whole(streams, run, body, width, device, checkpointing)
        else:
            hidden = self._hidden_shared_prompts(streams, run, body, ids_r, mask_r, device)
        packed_logp, packed_entropy = token_logprobs(
            hidden[mask_r], head.weight, head.bias, ids_r[mask_r], self.temperature, entropy_grad=self.config.entropy_coef > 0
        )
        logp = hidden.new_zeros(len(streams), width, dtype=torch.float32).masked_scatter(mask_r, packed_logp)
        entropy = hidden.new_zeros(len(streams), width, dtype=torch.float32).masked_scatter(mask_r, packed_entropy)
        return logp, entropy, mask

    def _hidden_shared_prompts(self, streams, run, body, ids_r, mask_r, device) -> torch.Tensor:
        """[B, T, H] hidden states predicting each response token, each distinct prompt run once and its
        key/value states repeated for the responses that continue it (:meth:`score`)."""
        from transformers import DynamicCache

        prompts = list(dict.fromkeys(tuple(s.prompt_ids) for s in streams))
        which = torch.tensor([prompts.index(tuple(s.prompt_ids)) for s in streams], device=device)
        width_p = max(len(p) for p in prompts)
        width = ids_r.shape[1]
        ids_p = torch.full((len(prompts), width_p), self.chat.pad_id, dtype=torch.long)
        mask_p = torch.zeros(len(prompts), width_p, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids_p[i, width_p - len(p) :] = torch.tensor(p)
            mask_p[i, width_p - len(p) :] = 1
        ids_p, mask_p = ids_p.to(device), mask_p.to(device)
        cache = DynamicCache(config=body.config)
        hidden_p = run(
            input_ids=ids_p,
            attention_mask=mask_p,
            position_ids=(mask_p.cumsum(-1) - 1).clamp(min=0),
            cache=cache,
            use_cache=True,
        )
        hidden = hidden_p[:, -1][which][:, None]  # [B, 1, H]: predicts each response's first token
        cache.reorder_cache(which)  # one copy of the prompt's states per response (differentiable)
        prompt_len = mask_p.sum(-1)[which]
        positions = prompt_len[:, None] + torch.arange(width, device=device)[None, :]
        if width > 1:  # position j predicts response token j
            rest = run(
                input_ids=ids_r[:, :-1],
                attention_mask=torch.cat([mask_p[which], mask_r[:, :-1].long()], dim=1),
                position_ids=positions[:, :-1],
                cache=cache,
                use_cache=True,
            )
            hidden = torch.cat([hidden, rest], dim=1)
        return hidden

    def _hidden_whole(self, streams, run, body, width: int, device, checkpointing: bool) -> torch.Tensor:
        """The same hidden states from one forward of every stream whole (prompt + response, right-padded,
        no shared prompt states): more tokens through the model. With ``checkpointing`` each decoder layer
        keeps only its input and recomputes the rest in the backward (far fewer activations kept); a layer
        that writes a key/value cache could not be replayed (the replay would write it twice), hence no cache."""
        lengths = [len(s.prompt_ids) + len(s.response_ids) for s in streams]
        ids = torch.full((len(streams), max(lengths)), self.chat.pad_id, dtype=torch.long)
        attention = torch.zeros(len(streams), max(lengths), dtype=torch.long)
        for i, s in enumerate(streams):
            ids[i, : lengths[i]] = torch.tensor([*s.prompt_ids, *s.response_ids])
            attention[i, : lengths[i]] = 1
        ids, attention = ids.to(device), attention.to(device)
        with checkpointed_layers(body) if checkpointing else contextlib.nullcontext():
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
            whole = run(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False)
        # Response token j of stream i is predicted at position len(prompt_i) - 1 + j.
        index = torch.zeros(len(streams), width, dtype=torch.long)
        for i, s in enumerate(streams):
            start = len(s.prompt_ids) - 1
            index[i] = torch.arange(start, start + width).clamp(max=lengths[i] - 1)
        return whole.gather(1, index.to(device)[:, :, None].expand(-1, -1, whole.shape[-1]))

    # ---- supervised fine-tuning ------------------------------------------------------------------
    def supervised_step(self, streams: Sequence[RoleStream]) -> dict[str, float]:
        """One optimizer step of next-token cross-entropy on the streams' masked response tokens (SFT):
        the mean over every target token of the batch, micro-batched within the token budget."""
        started = time.perf_counter()
        self.chat.model.eval()  # no dropout
        self.optimizer.zero_grad(set_to_none=True)
        tokens = sum(s.num_sampled_tokens for s in streams)
        loss_sum = 0.0
        for batch in self._micro_batches(streams):
            if self.threads is not None:
                self.threads.recheck()
            logp, _, mask = self.score([streams[i] for i in batch])
            loss = -(logp * mask).sum() / tokens
            loss.backward()
            loss_sum += float(loss.detach())
        grad_norm = full(torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm))
        self.optimizer.step()
        self.steps += 1
        self.chat.prefix_cache.clear()  # cached states were computed with the old weights
        return {"loss": loss_sum, "tokens": tokens, "grad_norm": float(grad_norm), "update_s": time.perf_counter() - started}

    @torch.no_grad()
    def supervised_loss(self, streams: Sequence[RoleStream]) -> float:
        """Mean next-token cross-entropy (nats per target token) of the masked response tokens."""
        total, tokens = 0.0, 0
        for batch in self._micro_batches(streams):
            logp, _, mask = self.score([streams[i] for i in batch])
            total += float(-(logp * mask).sum())
            tokens += int(mask.sum())
        return total / max(tokens, 1)

    # ---- one update ------------------------------------------------------------------------------
    def trainable(self, episodes: Sequence[Episode]) -> list[Episode]:
        return [
            e
            for e in episodes
            if e.status in self.config.train_on
            and self.role in e.streams
            and e.streams[self.role].reward is not None
            and e.streams[self.role].num_sampled_tokens > 0
        ]

    def step(self, episodes: Sequence[Episode]) -> dict[str, float]:
        """One rollout batch -> ``epochs`` optimizer steps on this role. Returns metrics."""
        started = time.perf_counter()
        used = self.trainable(episodes)
        if not used:
            return {"episodes": 0, "skipped": len(episodes)}
        streams = [e.streams[self.role] for e in used]
        rewards = torch.tensor([s.reward for s in streams])
        groups = [e.group_id for e in used]
        advantages = get_advantage_fn(self.config.baseline)(rewards, groups, self.config.normalize_std)
        # Data-parallel (torchrun): every rank holds the whole batch and trains on whole groups of it;
        # advantages and normalizers are the whole batch's and gradients are summed across ranks before
        # the optimizer step, so every rank applies the full-batch update.
        my_groups = {e.group_id for e in shard_groups(used, rank(), world())}
        mine = [i for i, e in enumerate(used) if e.group_id in my_groups]
        max_tokens = max(len(s.response_ids) for s in streams)
        per_token = loss_agg_normalizer(self.config.aggregation) == "tokens"  # a micro-batch's loss is a mean over its tokens
        sampled = sum(s.num_sampled_tokens for s in streams)
        was_training = self.chat.model.training
        self.chat.model.eval()  # no dropout: the first update must score exactly what was sampled
        stats_sum: dict[str, float] = {}
        # Before this batch's first update the learner scores the weights that sampled it: the largest
        # gap between its log-probs and the rollout's is float error when the streams are token-exact.
        logprob_gap = gap_sum = 0.0
        rescored: dict[int, torch.Tensor] = {}  # micro-batch -> the learner's log-probs before the first update
        # The ratio's denominator is the learner's own re-scoring (its proximal policy) when asked for, and
        # always under an off-policy correction, whose weights compare it with the behaviour log-probs.
        proximal = self.config.old_logprobs == "learner" or self.config.correction != "none"
        correction_max = 0.0
        device = self.chat.device
        advantages = advantages.to(device)
        micro_batches = self._micro_batches([streams[i] for i in mine])
        # A sharded model gathers its weights layer by layer in every forward, a collective every rank must
        # join: ranks with fewer micro-batches run empty ones (a real stream, weighted zero) until all are done.
        idle = all_ranks(len(micro_batches), "max") - len(micro_batches) if self.sharded else 0
        for epoch in range(self.config.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for _ in range(idle):
                logp, _, _ = self.score(streams[:1])
                (logp.sum() * 0.0).backward()
            for m, local in enumerate(micro_batches):
                if self.threads is not None:
                    self.threads.recheck()  # a long update beside another busy process (core.machine)
                batch = [mine[i] for i in local]
                chunk = [streams[i] for i in batch]
                new_logp, entropy, mask = self.score(chunk)
                sampler_logp = torch.zeros(new_logp.shape)
                for j, s in enumerate(chunk):
                    sampler_logp[j, : len(s.logprobs)] = torch.tensor(s.logprobs)
                sampler_logp = sampler_logp.to(device)
                if epoch == 0:
                    # Every micro-batch of the first epoch is scored before the optimizer step: the learner's
                    # weights before this batch (the weights that sampled it, unless the batch is off-policy).
                    if proximal:
                        rescored[m] = new_logp.detach()
                    difference = (new_logp.detach() - sampler_logp).abs() * mask
                    logprob_gap = max(logprob_gap, float(difference.max()))
                    gap_sum += float(difference.sum())
                old_logp = rescored[m] if proximal else sampler_logp
                weights, correction = behaviour_weights(old_logp, sampler_logp, mask, self.config.correction, self.config.correction_cap)
                correction_max = max(correction_max, correction.pop("behaviour_logratio_max"))
                ref_logp = None
                if self.config.kl_coef > 0:
                    with torch.no_grad():
                        ref_logp, _, _ = self.score(chunk, use_adapter=False)
                loss, stats = policy_loss(
                    new_logp,
                    old_logp,
                    advantages[batch],
                    mask,
                    ref_logp,
                    entropy,
                    self.config.eps_low,
                    self.config.eps_high,
                    self.config.kl_coef,
                    self.config.entropy_coef,
                    self.config.aggregation,
                    max_tokens,
                    weights,
                )
                stats.update(correction)
                # Each micro-batch's loss is its own mean; weight it by its share of the batch-level
                # normalizer so the accumulated gradient equals the full-batch one.
                tokens = float(mask.sum())
                share = tokens / sampled if per_token else len(batch) / len(streams)
                (loss * share).backward()
                for key, value in stats.items():
                    stats_sum[key] = stats_sum.get(key, 0.0) + value * tokens
                stats_sum["loss"] = stats_sum.get("loss", 0.0) + float(loss.detach()) * share
            if distributed() and not self.sharded:  # a sharded model's gradients are summed by its reduce-scatter
                for p in self.params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    all_reduce_(p.grad)
            grad_norm = full(torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm))
            self.optimizer.step()
            self.steps += 1
        self.chat.model.train(was_training)
        self.chat.prefix_cache.clear()  # cached states were computed with the old weights
        n = sampled * self.config.epochs
        logprob_gap = all_ranks(logprob_gap, "max")
        for key in ("loss", "clip_fraction", "kl", "entropy", "ratio_mean", "truncated_fraction", "behaviour_logratio_mean"):
            stats_sum[key] = all_ranks(stats_sum[key])  # sums over every rank
        return {
            "episodes": len(used),
            "skipped": len(episodes) - len(used),
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
            "zero_variance_groups": zero_variance_share(rewards, groups),
            "nonzero_advantages": float((advantages.abs() > 1e-9).float().mean()),
            "trained_tokens": sampled,
            "loss": stats_sum["loss"] / self.config.epochs,
            "clip_fraction": stats_sum["clip_fraction"] / n,
            "kl": stats_sum["kl"] / n,
            "entropy": stats_sum["entropy"] / n,
            "ratio_mean": stats_sum["ratio_mean"] / n,
            # Off-policy correction (learner.correction): tokens whose weight the cap truncated, and how far
            # the learner's log-probs are from the behaviour's (0 on a batch sampled with the learner's weights).
            "truncated_fraction": stats_sum["truncated_fraction"] / n,
            "behaviour_logratio_mean": stats_sum["behaviour_logratio_mean"] / n,
            "behaviour_logratio_max": all_ranks(correction_max, "max"),
            "logprob_gap": logprob_gap,
            "logprob_gap_mean": all_ranks(gap_sum) / max(sampled, 1),
            "grad_norm": float(grad_norm),
            "update_s": time.perf_counter() - started,
        }
