"""Reading the raw Persuasion for Good corpus (Wang et al. 2019, Apache-2.0).

The files are never copied into this repository: they are read from a directory the user gives
(argument, config field or ``$SCOPE_P4G_DIR``), else from ``../shared/data/p4g`` beside the project
checkout when present. Each CSV row of a dialogue file is one sentence; consecutive sentences of
one speaker in one turn form one message. Role ``B4``: 0 persuader (our ``agent``), 1 persuadee
(our ``user``).
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from scope_marl.core.types import Message
from scope_marl.envs.base import AGENT, USER

ENV_VAR = "SCOPE_P4G_DIR"
FILES = ("full_dialog.csv", "full_info.csv", "300_dialog.csv", "300_info.csv")
ROLE_OF = {"0": AGENT, "1": USER}
SURVEY_SUFFIX = ".x"


class CorpusNotFound(FileNotFoundError):
    """No corpus directory; the message says where it looked and how to provide one."""


def _named(explicit: str | os.PathLike | None) -> tuple[Path, str] | None:
    """The folder the user named (the argument or config field, else ``$SCOPE_P4G_DIR``), and how."""
    if explicit:
        return Path(explicit), "env.data_dir"
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]), f"${ENV_VAR}"
    return None


def find_corpus_dir(path: str | os.PathLike | None = None, required: bool = True) -> Path | None:
    """The corpus directory: ``path``, else ``$SCOPE_P4G_DIR``, else ``../shared/data/p4g``.

    A folder the user named must hold the corpus, ``required`` or not: a typo in a path is an error,
    never a silent switch to synthetic personas. Only when no folder was named may the search come
    back empty (``required=False``).
    """
    named = _named(path)
    here = Path(__file__).resolve()
    tried = [named[0]] if named else [Path.cwd() / ".." / "shared" / "data" / "p4g", here.parents[5] / "shared" / "data" / "p4g"]
    for candidate in tried:
        if (candidate / "full_dialog.csv").exists() and (candidate / "full_info.csv").exists():
            return candidate.resolve()
    if named:
        raise CorpusNotFound(
            f"{named[1]} names {named[0]}, which does not hold the Persuasion for Good corpus ({', '.join(FILES)}). "
            f"Fix the path, or unset it (source: synthetic samples personas instead), or fetch the corpus with: scope data p4g --download DIR"
        )
    if not required:
        return None
    raise CorpusNotFound(
        "Persuasion for Good corpus not found (looked in: " + ", ".join(str(p) for p in tried) + "). "
        f"Set {ENV_VAR} or the config field env.data_dir to a folder holding {', '.join(FILES)}, "
        "or fetch it with: scope data p4g --download DIR"
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_dialogues(corpus_dir: str | os.PathLike, file: str = "full_dialog.csv") -> dict[str, list[Message]]:
    """Dialogue id -> messages in order (sentences of one speaker's turn joined with a space)."""
    dialogues: dict[str, list[Message]] = {}
    last_key: dict[str, tuple[str, str]] = {}
    for row in _rows(Path(corpus_dir) / file):
        did, role, turn = row["B2"], ROLE_OF[row["B4"]], row["Turn"]
        text = (row["Unit"] or "").strip()
        messages = dialogues.setdefault(did, [])
        if messages and last_key.get(did) == (turn, role):
            messages[-1] = Message(role=role, content=f"{messages[-1].content} {text}".strip())
        else:
            messages.append(Message(role=role, content=text))
        last_key[did] = (turn, role)
    return dialogues


def _number(value: str | None) -> float | None:
    if value is None or value.strip() == "":
        return None
    try:
        x = float(value)
    except ValueError:
        return None
    return None if math.isnan(x) else x


@dataclass
class Participant:
    """One survey respondent. ``survey`` maps a trait (``agreeable``, ``age``, ``sex``...) to its value;
    missing cells are absent, never NaN."""

    user_id: str
    role: str
    donation: float | None  # B6: actual donation after the task, dollars (outliers kept as given)
    turns: int | None  # B7
    survey: dict[str, float | str] = field(default_factory=dict)


def read_participants(corpus_dir: str | os.PathLike, file: str = "full_info.csv") -> dict[str, dict[str, Participant]]:
    """Dialogue id -> role -> Participant."""
    out: dict[str, dict[str, Participant]] = {}
    for row in _rows(Path(corpus_dir) / file):
        survey: dict[str, float | str] = {}
        for key, value in row.items():
            if not key.endswith(SURVEY_SUFFIX) or value is None or value.strip() == "" or value.strip().lower() == "nan":
                continue
            number = _number(value)
            survey[key[: -len(SURVEY_SUFFIX)]] = number if number is not None else value.strip()
        turns = _number(row.get("B7"))
        out.setdefault(row["B2"], {})[ROLE_OF[row["B4"]]] = Participant(
            user_id=row["B3"],
            role=ROLE_OF[row["B4"]],
            donation=_number(row.get("B6")),
            turns=int(turns) if turns is not None else None,
            survey=survey,
        )
    return out


def read_intended_donations(corpus_dir: str | os.PathLike, file: str = "300_info.csv") -> dict[str, float]:
    """Dialogue id -> the persuadee's intended donation ``B5`` as annotated (only where filled)."""
    out = {}
    for row in _rows(Path(corpus_dir) / file):
        amount = _number(row.get("B5"))
        if ROLE_OF.get(row["B4"]) == USER and amount is not None:
            out[row["B2"]] = amount
    return out
