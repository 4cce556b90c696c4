"""The collapse lab: simulator models, shared classes, panels, the theory effect, the p4g fit."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lab_exact import best_policy, expected_reward, played_weights

from scope_marl.config import ConfigError
from scope_marl.evaluation.stats import t_interval
from scope_marl.lab import arms, loop, report
from scope_marl.lab import run as lab_run
from scope_marl.lab.episodes import play
from scope_marl.lab.games import load_game
from scope_marl.lab.games.p4g import FITTED, p4g_game
from scope_marl.lab.games.theory import theory_game
from scope_marl.lab.panel import (
    HELDOUT_PANEL,
    VALIDATION_PANEL,
    PanelError,
    build_panel,
    load_panel,
    persona_weights,
)
from scope_marl.lab.policy import StrategyPolicy
from scope_marl.lab.simulators import (
    ActTurn,
    FrozenActs,
    PopulationActs,
    TrainableActs,
    VerbalizedActs,
    _FixedUniform,
    draw,
    entropy_nats,
    sharpen,
)
from scope_marl.simulators.candidates import Candidate, draw_candidate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=["theory", "p4g"])
def game(request):
    return load_game(request.param)


def tiny(game_name: str, **overrides) -> arms.Settings:
    """Settings small enough for a unit test (seconds for all arms)."""
    fields = {"steps": 6, "eval_every": 3, "eval_groups": 4, "eval_group_size": 4, "groups": 4, "group_size": 4, "pool_every": 2}
    return arms.with_settings(game_name, **{**fields, **overrides})


def context(game, n: int, seed: int = 0, **fixed) -> ActTurn:
    gen = torch.Generator().manual_seed(seed)
    rand = lambda high: torch.randint(high, (n,), generator=gen)
    ctx = ActTurn(0, rand(len(game.personas)), rand(len(game.acts) + 1), rand(len(game.strategies)), torch.rand(n, generator=gen), gen)
    for key, value in fixed.items():
        setattr(ctx, key, torch.full((n,), value) if isinstance(value, (int, float)) else value)
    return ctx


# ---- the lab reuses the LLM path's classes ------------------------------------------------------


def test_lab_uses_the_shared_simulator_and_loss_classes():
    from scope_marl.lab import simulators as lab_simulators
    from scope_marl.lab.arms import Rotation, SimulatorPool
    from scope_marl.lab.loop import group_advantages, policy_loss
    from scope_marl.simulators import base, candidates, pool, rotation
    from scope_marl.training import losses

    assert Rotation is rotation.Rotation
    assert SimulatorPool is pool.SimulatorPool
    assert group_advantages is losses.group_advantages
    assert policy_loss is losses.policy_loss
    assert lab_simulators.draw_candidate is candidates.draw_candidate
    assert lab_simulators.Candidate is candidates.Candidate
    for cls in (FrozenActs, VerbalizedActs, TrainableActs, PopulationActs):
        assert issubclass(cls, base.Simulator)


# ---- gamma-sharpening ---------------------------------------------------------------------------


def test_gamma_one_reproduces_the_estimated_distribution(game):
    human = FrozenActs.sharpened(game, gamma=1.0, adherence=1.0)
    assert human.simulator_id == "human"
    torch.testing.assert_close(human.table(), game.reply, atol=1e-6, rtol=0)
    ctx = context(game, 64)
    probs, played = human.distribution(ctx)
    torch.testing.assert_close(probs, game.reply[ctx.persona, ctx.previous, ctx.strategy], atol=1e-6, rtol=0)
    assert torch.equal(played, ctx.persona)


def test_large_gamma_approaches_the_mode(game):
    top1 = [float(sharpen(game.reply, g).amax(-1).mean()) for g in (1.0, 2.0, 4.0, 16.0, 64.0)]
    assert top1 == sorted(top1)  # the modal act's mass only grows with gamma
    entropies = [float(entropy_nats(sharpen(game.reply, g)).mean()) for g in (1.0, 2.0, 4.0, 16.0, 64.0)]
    assert entropies == sorted(entropies, reverse=True)
    sorted_probs = game.reply.sort(-1, descending=True).values
    unique_mode = sorted_probs[..., 0] > sorted_probs[..., 1] * 1.05
    peaked = sharpen(game.reply, 200.0).amax(-1)
    assert bool((peaked[unique_mode] > 0.99).all())
    assert torch.equal(sharpen(game.reply, 200.0).argmax(-1)[unique_mode], game.reply.argmax(-1)[unique_mode])


def test_sharpen_rejects_non_positive_gamma():
    with pytest.raises(ValueError, match="gamma"):
        sharpen(torch.tensor([0.5, 0.5]), 0.0)


def test_sampled_acts_follow_the_simulator_distribution():
    game = theory_game()
    llm = FrozenActs.sharpened(game, gamma=2.0)
    ctx = context(game, 40_000, persona=1, previous=game.start, strategy=2, persona_draw=0.0)
    acts = llm.answer(ctx).reply
    frequencies = torch.bincount(acts, minlength=len(game.acts)).float() / len(acts)
    torch.testing.assert_close(frequencies, sharpen(game.reply, 2.0)[1, game.start, 2], atol=0.01, rtol=0)


def test_a_collapsed_simulator_plays_the_modal_persona():
    game = theory_game()
    ctx = context(game, 2000)
    assert bool((FrozenActs.sharpened(game, 4.0, adherence=0.0).played(ctx) == game.modal_persona).all())
    assert torch.equal(FrozenActs.sharpened(game, 4.0, adherence=1.0).played(ctx), ctx.persona)
    kept = (FrozenActs.sharpened(game, 4.0, adherence=0.3).played(ctx) == ctx.persona)[ctx.persona != game.modal_persona]
    assert abs(float(kept.float().mean()) - 0.3) < 0.05


# ---- Verbalized Sampling --------------------------------------------------------------------------


def test_batched_draw_picks_what_draw_candidate_picks():
    rng = random.Random(0)
    for _ in range(300):
        k = rng.randint(1, 6)
        weights = [rng.choice([0.0, rng.random(), rng.random() * 1e-9]) for _ in range(k)]
        if not any(weights):
            weights[rng.randrange(k)] = rng.random() + 1e-3
        u = rng.choice([rng.random(), 0.0, 1.0 - 1e-17, 0.999999999])
        expected = draw_candidate([Candidate(str(i), w) for i, w in enumerate(weights)], _FixedUniform(u))
        assert int(draw(torch.tensor([weights], dtype=torch.float64), torch.tensor([u], dtype=torch.float64))[0]) == expected


def test_vs_exact_path_draws_the_same_replies_as_the_batched_path():
    game = p4g_game()
    llm = FrozenActs.sharpened(game, 4.0, adherence=0.0)
    for method in ("prob", "random"):
        batched = VerbalizedActs(llm, method=method).answer(context(game, 300, seed=5))
        exact = VerbalizedActs(llm, method=method, exact=True).answer(context(game, 300, seed=5))
        assert torch.equal(batched.reply, exact.reply)
        assert math.isclose(batched.info["candidate_entropy"], exact.info["candidate_entropy"], rel_tol=1e-5)


def test_vs_lists_k_distinct_candidates_and_undoes_most_of_the_collapse():
    game = p4g_game()
    llm = FrozenActs.sharpened(game, 4.0, adherence=0.0)
    vs = VerbalizedActs(llm, k=5, method="prob", residual=1 / 3)
    assert vs.gamma_vs == pytest.approx(2.0) and vs.adherence == pytest.approx(2 / 3)
    acts, weights, _ = vs.candidates(context(game, 200))
    assert acts.shape == (200, 5)
    assert all(len(set(row)) == 5 for row in acts.tolist())
    torch.testing.assert_close(weights.sum(1), torch.ones(200))
    _, uniform, _ = VerbalizedActs(llm, k=5, method="random").candidates(context(game, 200))
    assert torch.allclose(uniform, torch.full_like(uniform, 0.2))
    # Replies are more diverse than the collapsed simulator's, less than a human's.
    ctx = context(game, 20_000, strategy=0, previous=game.start, persona=0)
    entropy = lambda acts: float(entropy_nats(torch.bincount(acts, minlength=len(game.acts)).float() / len(acts)))
    assert entropy(llm.answer(ctx).reply) < entropy(vs.answer(ctx).reply) < entropy(FrozenActs.sharpened(game).answer(ctx).reply)


# ---- trainable simulator, rotation, pool --------------------------------------------------------


def test_trainable_simulator_starts_as_the_simulator_it_copies():
    game = theory_game()
    llm = FrozenActs.sharpened(game, 4.0, adherence=0.0)
    user = TrainableActs(llm)
    torch.testing.assert_close(user.table(), llm.table(), atol=1e-6, rtol=0)
    ctx = context(game, 50)
    acts = user.answer(ctx).reply
    current, reference = user.log_probs(llm.played(ctx), ctx.previous, ctx.strategy, acts)
    torch.testing.assert_close(current, reference)
    assert current.requires_grad


def test_rotation_gives_every_group_one_member_round_robin():
    game = theory_game()
    rotation = arms.opponent("rotation", game, arms.SETTINGS["theory"], 0, Path(".")).simulator
    gen = torch.Generator().manual_seed(0)
    d = play(game, StrategyPolicy(game), rotation, torch.zeros(6, dtype=torch.long), 5, gen, first_group=12)
    assert d.simulators == ["llm-0", "llm-1", "llm-2"] * 2
    assert d.group_ids[:5] == ["12"] * 5 and d.group_ids[5] == "13"


def test_population_arm_snapshots_distinct_members_into_the_pool(tmp_path):
    game = theory_game()
    s = tiny("theory", steps=8, pool_every=2, pool_size=3)
    opp = arms.opponent("population", game, s, seed=0, workdir=tmp_path)
    assert len(opp.pool) == 1 and opp.pool.members[0].pinned
    policy = StrategyPolicy(game)
    optimizer = torch.optim.Adam(policy.parameters(), lr=s.lr)
    sim_optimizer = torch.optim.Adam([opp.trainable.logits], lr=s.sim_lr)
    gen = torch.Generator().manual_seed(0)
    for step in range(s.steps):
        d = play(game, policy, opp.simulator, torch.zeros(s.groups, dtype=torch.long), s.group_size, gen, first_group=step * s.groups)
        assert all(sim.startswith("pool:m") for sim in d.simulators)
        loop.update_agent(policy, optimizer, d, s)
        loop.update_simulator(opp.trainable, sim_optimizer, d, s)
        if (step + 1) % s.pool_every == 0:
            opp.pool.add(opp.trainable.save(tmp_path / f"staging-{step}"), step=step + 1)
    members = opp.pool.members
    assert len(members) == 3 and members[0].step == 0  # FIFO kept the pinned base
    assert len({m.content_hash for m in members}) == 3  # the simulator moved between snapshots
    opp.pool.verify()
    first = opp.simulator.for_group(7)
    assert first is opp.simulator.for_group(7)  # seeded by group, loaded once


def test_updates_are_on_policy_at_the_first_step():
    game = theory_game()
    s = arms.SETTINGS["theory"]
    policy = StrategyPolicy(game)
    gen = torch.Generator().manual_seed(0)
    d = play(game, policy, FrozenActs.sharpened(game, 4.0, 0.0), torch.zeros(8, dtype=torch.long), 8, gen)
    stats = loop.update_agent(policy, torch.optim.Adam(policy.parameters(), lr=s.lr), d, s)
    assert stats["on_policy_gap"] < 1e-6
    assert stats["clip_fraction"] == 0.0


# ---- outcome and exact evaluation -----------------------------------------------------------------


def test_theory_outcome_values():
    game = theory_game()
    agree, engage, question, refuse = range(4)
    acts = torch.tensor([[agree, 0, 0], [engage, engage, agree], [refuse, 0, 0], [engage, question, engage], [engage, question, question]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    torch.testing.assert_close(game.outcome(acts, mask), torch.tensor([1.0, 0.81, 0.0, 0.25 * 0.81, 0.1 * 0.81]))


def test_p4g_outcome_counts_each_act_once_and_clamps():
    game = p4g_game()
    o = game.outcome
    agree, negative = game.acts.index("agree"), game.acts.index("negative")
    acts = torch.full((2, game.turns), agree)
    acts[1] = negative
    mask = torch.ones_like(acts, dtype=torch.bool)
    expected = torch.tensor([o.intercept + float(o.any_act[agree]), o.intercept + float(o.any_act[negative])]).clamp(0, 1)
    torch.testing.assert_close(o(acts, mask), expected)


def test_exact_evaluation_matches_monte_carlo():
    game = theory_game()
    policy = StrategyPolicy(game)
    gen = torch.Generator().manual_seed(1)
    d = play(game, policy, FrozenActs.sharpened(game), torch.multinomial(game.weights, 1500, True, generator=gen), 10, gen)
    exact = float(expected_reward(game, policy.logits.detach().softmax(-1), game.reply, game.weights))
    assert abs(float(d.rewards.mean()) - exact) < 4 * float(d.rewards.std()) / math.sqrt(len(d.rewards))


def test_theory_game_has_the_collapse_property():
    """The design check of theory.py, exact: the best policy against the training LLM (gamma 4,
    persona ignored) is worse against humans than the untrained uniform policy, while the best
    policy against the VS-recovered simulator and against humans are better."""
    game = theory_game()
    s = arms.SETTINGS["theory"]
    human = lambda pi: float(expected_reward(game, pi, game.reply, game.weights))
    uniform = torch.full((game.turns, len(game.acts) + 1, len(game.strategies)), 1 / len(game.strategies))
    collapsed = best_policy(
        game, sharpen(game.reply, s.train_gamma), played_weights(game, game.weights, s.train_adherence), steps=150, lr=0.3
    )
    vs = VerbalizedActs(FrozenActs.sharpened(game, s.train_gamma, s.train_adherence))
    recovered = best_policy(game, vs.table(), played_weights(game, game.weights, vs.adherence), steps=150, lr=0.3)
    best = best_policy(game, game.reply, game.weights, steps=150, lr=0.3)
    assert collapsed[0, game.start].argmax() == game.strategies.index("ask")  # ask at once
    assert human(collapsed) < human(uniform) - 0.05
    assert human(recovered) > human(uniform) + 0.05
    assert human(best) >= human(recovered) - 1e-3


# ---- training runs --------------------------------------------------------------------------------


@pytest.mark.parametrize("arm", arms.ARMS)
def test_every_arm_runs_on_both_games_with_finite_numbers(game, arm):
    s = tiny(game.name)
    panel = build_panel(game, load_panel(HELDOUT_PANEL))
    run = loop.train_arm(game, arm, seed=0, s=s, panel=panel)
    assert [p["step"] for p in run["curve"]] == [0, 3, 6]
    for point in run["curve"]:
        for key in lab_run.METRICS:
            assert math.isfinite(point[key])
        assert 0.0 <= point["heldout_reward"] <= 1.0
        assert set(point["per_simulator"]) == {m.id for m in load_panel(HELDOUT_PANEL).simulators}
    assert run["max_on_policy_gap"] < 1e-6


def test_theory_collapse_effect_on_a_small_fixed_seed_run():
    """Single-simulator RL: training reward up, held-out reward and entropy down; VS and
    co-training end above it held-out (2 seeds, shortened training)."""
    game = theory_game()
    s = arms.with_settings("theory", steps=60, eval_every=30, eval_groups=32)
    panel = build_panel(game, load_panel(HELDOUT_PANEL))
    runs = {arm: [loop.train_arm(game, arm, seed, s, panel) for seed in (0, 1)] for arm in ("single", "vs_prob", "cotrain")}
    mean = lambda arm, where, key: sum(r[where][key] for r in runs[arm]) / 2
    assert mean("single", "final", "train_reward") > mean("single", "start", "train_reward") + 0.1
    assert mean("single", "final", "heldout_reward") < mean("single", "start", "heldout_reward") - 0.02
    assert mean("single", "final", "policy_entropy") < mean("single", "start", "policy_entropy") - 0.3
    for arm in ("vs_prob", "cotrain"):
        assert mean(arm, "final", "heldout_reward") > mean("single", "final", "heldout_reward") + 0.03, arm


def test_run_lab_writes_results_report_and_plot(tmp_path, monkeypatch):
    monkeypatch.setitem(arms.SETTINGS, "theory", tiny("theory"))
    lines = []
    results = lab_run.run_lab("theory", arms=["single", "vs_prob"], seeds=2, out=tmp_path, log=lines.append)
    assert len(lines) == 4
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["results"]["vs_prob"]["heldout_vs_single"]["n"] == 2
    assert saved["settings"]["steps"] == 6
    assert "| single |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "collapse.png").stat().st_size > 0
    table = report.format_table(results)
    assert "vs_prob" in table and "held-out - single" in table and "vs_prob vs single" in table
    with pytest.raises(ValueError, match="unknown arm"):
        lab_run.run_lab("theory", arms=["single", "sft"], seeds=1, out=tmp_path)
    with pytest.raises(ValueError, match="unknown lab game"):
        lab_run.run_lab("tau2", seeds=1, out=tmp_path)


def test_runs_are_reproducible_and_custom_panels_are_used(tmp_path, monkeypatch):
    game = theory_game()
    panel = build_panel(
        game, load_panel(write(tmp_path, "simulators:\n  - {id: human}\n  - {id: vs, gamma: 4, adherence: 0, vs: {method: random}}\n"))
    )
    first, second = (loop.train_arm(game, "population", 3, tiny("theory"), panel) for _ in range(2))
    assert first["curve"] == second["curve"]
    assert set(first["final"]["per_simulator"]) == {"human", "vs"}
    monkeypatch.setitem(arms.SETTINGS, "theory", tiny("theory"))
    results = lab_run.run_lab("theory", arms=["single"], seeds=1, panel=tmp_path / "panel.yaml", out=tmp_path / "out", log=lambda _: None)
    assert set(results["results"]["single"]["per_simulator"]) == {"human", "vs"}


def test_interval_is_a_student_t_interval():
    stats = t_interval([1.0, 2.0, 3.0])
    assert stats["mean"] == 2.0
    assert stats["high"] - 2.0 == pytest.approx(4.303 * 1.0 / math.sqrt(3))


# ---- panels ---------------------------------------------------------------------------------------


def test_default_panels_load_and_are_disjoint(game):
    heldout, validation = load_panel(HELDOUT_PANEL), load_panel(VALIDATION_PANEL)
    key = lambda m: (m.gamma, m.adherence, json.dumps(m.personas), m.vs)
    assert not {key(m) for m in heldout.simulators} & {key(m) for m in validation.simulators}
    assert not {m.id for m in heldout.simulators} & {m.id for m in validation.simulators}
    assert heldout.simulators[0].gamma == 1.0 and heldout.simulators[0].adherence == 1.0  # the human model
    train = arms.SETTINGS[game.name]
    trained_on = {(train.train_gamma, train.train_adherence), *train.rotation}
    assert not trained_on & {(m.gamma, m.adherence) for m in heldout.simulators + validation.simulators}
    assert len(build_panel(game, heldout)) == 6


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "panel.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "field", "hint"),
    [
        ("simulators:\n  - {id: a, gamma: -1}\n", "simulators[0].gamma", "> 0"),
        ("simulators:\n  - {id: a, adherence: 1.5}\n", "simulators[0].adherence", "between 0"),
        ("simulators:\n  - {id: a}\n  - {id: b, gama: 2}\n", "simulators[1].gama", "did you mean 'gamma'"),
        ("simulators:\n  - {id: a, vs: {method: top}}\n", "simulators[0].vs.method", "prob or random"),
        ("simulators:\n  - {id: a}\n  - {id: a}\n", "simulators", "duplicate simulator ids"),
        ("simulators: []\n", "simulators", "at least one"),
        ("simulators:\n  - {gamma: 2}\n", "simulators[0].id", "unique id"),
        ("simulators:\n  - {id: a, personas: everyone}\n", "simulators[0].personas", "population, modal, minority"),
    ],
)
def test_panel_errors_name_the_field_and_the_fix(tmp_path, text, field, hint):
    with pytest.raises(ConfigError) as err:
        load_panel(write(tmp_path, text))
    message = str(err.value)
    assert field in message and hint in message and "Fix:" in message


def test_panel_persona_names_are_checked_against_the_game(tmp_path):
    panel = load_panel(write(tmp_path, "simulators:\n  - {id: skeptics, personas: [skeptic]}\n"))
    [(_, _, weights)] = build_panel(theory_game(), panel)
    assert weights.tolist() == [0.0, 1.0, 0.0]
    with pytest.raises(PanelError, match=r"simulators\[0\]\.personas: unknown persona 'skeptic' for game p4g.*high-care"):
        build_panel(p4g_game(), panel)
    too_many = load_panel(write(tmp_path, "simulators:\n  - {id: a, vs: {k: 6}}\n"))
    with pytest.raises(PanelError, match=r"simulators\[0\]\.vs\.k"):
        build_panel(theory_game(), too_many)


def test_panel_persona_selectors():
    game = theory_game()
    panel = load_panel(HELDOUT_PANEL)
    spec = panel.simulators[0].model_copy(update={"personas": "minority"})
    minority = persona_weights(game, spec, "x")
    assert minority[game.modal_persona] == 0 and minority.sum() == pytest.approx(1.0)
    spec = spec.model_copy(update={"personas": {"warm": 1, "guarded": 3}})
    assert persona_weights(game, spec, "x").tolist() == [0.25, 0.0, 0.75]


# ---- the p4g fit ----------------------------------------------------------------------------------


def test_p4g_json_holds_only_fitted_figures():
    fit = json.loads(FITTED.read_text())
    assert FITTED.stat().st_size < 50_000

    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for k, v in value.items():
                yield k
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)

    # No dialogue text: every string is a label, a name or a sentence of ours describing the model.
    assert max(len(s) for s in strings(fit)) < 300
    game = p4g_game()
    assert game.reply.shape == (2, len(game.acts) + 1, len(game.strategies), len(game.acts))
    assert game.turns == 10 and not game.terminal.any()
    assert fit["personas"]["dialogues"][0] + fit["personas"]["dialogues"][1] == fit["dialogues"] == 300


@pytest.mark.integration
def test_fit_script_reproduces_the_committed_json(tmp_path):
    from scope_marl.envs.p4g.corpus import find_corpus_dir

    corpus = find_corpus_dir(required=False)
    if corpus is None or not (corpus / "300_dialog.csv").exists():
        pytest.skip(
            "the P4G corpus (../shared/data/p4g or $SCOPE_P4G_DIR) is not on this machine; the committed p4g_lab.json is tested without it"
        )
    out = tmp_path / "p4g_lab.json"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fit_lab_p4g.py"), "--data-dir", str(corpus), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert json.loads(out.read_text()) == json.loads(FITTED.read_text())


@pytest.mark.integration
def test_scope_lab_command_prints_the_table_and_names_bad_arms(tmp_path):
    from typer.testing import CliRunner

    from scope_marl.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["lab", "--game", "theory", "--arms", "single,vs_prob", "--seeds", "2", "--out", str(tmp_path / "lab")])
    assert result.exit_code == 0, result.output
    assert "vs_prob" in result.output and "held-out reward" in result.output
    saved = json.loads((tmp_path / "lab" / "results.json").read_text())
    assert set(saved["arms"]) == {"single", "vs_prob"}
    assert (tmp_path / "lab" / "collapse.png").stat().st_size > 10_000
    bad = runner.invoke(app, ["lab", "--arms", "single,nope", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "nope" in bad.output
