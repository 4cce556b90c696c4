"""The binding public names of docs/interfaces.md are importable where that page says they are."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from scope_marl.cli import app


def test_binding_import_paths():
    from scope_marl.envs.p4g import episode_donation, parse_donation
    from scope_marl.envs.p4g.donation import episode_donation as episode_impl
    from scope_marl.envs.p4g.donation import parse_donation as parse_impl
    from scope_marl.simulators.candidates import Candidate as CandidateImpl
    from scope_marl.simulators.verbalized import Candidate, parse_candidates

    assert parse_donation is parse_impl and episode_donation is episode_impl and Candidate is CandidateImpl
    assert parse_donation("I'll give 50 cents") == 0.5
    assert parse_candidates('{"responses": [{"text": "a", "probability": 70}, {"text": "b", "probability": 30}]}', 2, "prob") == [
        Candidate("a", 0.7),
        Candidate("b", 0.3),
    ]


@pytest.mark.parametrize(
    "command",
    [["generate"], ["rollout"], ["train"], ["demo"], ["eval"], ["report"], ["lab"], ["diagnose", "gamma"], ["data", "p4g"]],
)
def test_every_command_has_help_with_an_example(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, f"scope {' '.join(command)} --help shows no example"
