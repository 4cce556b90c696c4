"""The `scope` CLI's own surface (no model weights needed): help with an example, `scope generate`, and a model
spec it cannot load as a clear error. (Formerly tests/test_cli_and_scripted.py; the scripted backend's tests are in
tests/test_scripted_backend.py.)"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from scope_marl.backends import BackendError, load_backend
from scope_marl.cli import app

runner = CliRunner()


def test_load_backend_rejects_unknown_spec_listing_the_forms():
    with pytest.raises(BackendError, match=r"unknown model spec 'gpt'.*embedded \| hf:PATH"):
        load_backend("gpt")
    with pytest.raises(BackendError, match="config.json missing"):
        load_backend("hf:/nonexistent/model")


def test_cli_generate_prints_replies_with_mean_logprob():
    result = runner.invoke(app, ["generate", "--model", "scripted:Sure, I will donate.|No thanks.", "--prompt", "Donate?", "--n", "2"])
    assert result.exit_code == 0, result.output
    assert "Sure, I will donate." in result.output and "No thanks." in result.output
    assert "mean log-prob" in result.output


def test_cli_bad_spec_is_a_clear_error_not_a_traceback():
    result = runner.invoke(app, ["generate", "--model", "gpt", "--prompt", "hi"])
    assert result.exit_code == 2
    assert "unknown model spec" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", [[], ["generate"]])
def test_help_has_an_example(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output
    if command:
        assert "Example: scope generate" in result.output
