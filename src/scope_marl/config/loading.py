"""Reading YAML into a schema, and the one error explainer every config and panel file goes through.

Every section forbids unknown keys, so a typo is an error that names the field, suggests the
nearest known name ("did you mean ...?") and lists the allowed ones, instead of a silently ignored
setting. A schema may add a fix per field name (``fixes``) that the explainer appends.
"""

from __future__ import annotations

import copy
import difflib
import os
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from scope_marl.core import files


class ConfigError(ValueError):
    """A config file that cannot be used; the message names each bad field and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def removed_field(name: str, fix: str) -> PydanticCustomError:
    """The error a section's ``model_validator(mode="before")`` raises for a field that was removed or
    renamed: the explainer shows it at ``section.name`` with ``fix`` (the replacement), e.g.
    ``learner.constant_groups: constant_groups was removed: folded into `baseline`; ...``."""
    return PydanticCustomError("removed_field", "{field} was removed: {fix}", {"field": name, "fix": fix})


def read_yaml(path: str | os.PathLike) -> object:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a folder; pass a YAML config file (see configs/ for examples)")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; see configs/ for examples")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a UTF-8 text file (is it binary?); a config is YAML text, see configs/ for examples") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None


def validate(data: object, schema: type[BaseModel], what: str, fixes: dict[str, str] | None = None) -> BaseModel:
    """``schema.model_validate(data)``, with a :class:`ConfigError` that explains every bad field."""
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{what} has {err.error_count()} invalid field(s):\n" + explain(err, schema, fixes)) from None


def load_config(
    path: str | os.PathLike,
    schema: type[BaseModel] | None = None,
    defaults: dict | None = None,
    fixes: dict[str, str] | None = None,
    list_key: str | None = None,
) -> BaseModel:
    """A YAML mapping validated against ``schema`` (default: the ``scope rollout`` config).

    ``defaults`` fill keys the file leaves out (e.g. a panel's name from its file name); a file that
    is a bare list is read as ``{list_key: the list}`` when ``list_key`` is given.
    """
    if schema is None:
        from scope_marl.config.rollout import RolloutRunConfig

        schema = RolloutRunConfig
    path = Path(path)
    data = read_yaml(path)
    if data is None:  # an empty file (or comments only) is a mistake, not a request for every default
        raise ConfigError(f"{path} is empty; write at least the sections you mean (see configs/ for examples)")
    if isinstance(data, list) and list_key is not None:
        data = {list_key: data}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(data).__name__}")
    return validate({**(defaults or {}), **data}, schema, str(path), fixes)


def load_saved_config(path: str | os.PathLike, schema: type[BaseModel]) -> BaseModel:
    """The config a run saved beside itself (``RUN_DIR/config.yaml``), written by this or an older release:
    settings renamed since are read with their old meaning (the schema's ``upgrade_saved``, if it has one)."""
    return saved_config(read_yaml(path), schema, str(path))


def saved_config(data, schema: type[BaseModel], where: str) -> BaseModel:
    """A config a run saved (its config.yaml, or the copy in a checkpoint's state.json) read as this
    release reads it: renamed settings upgraded (the schema's ``upgrade_saved``), then validated, so
    fields added since take their defaults."""
    upgrade = getattr(schema, "upgrade_saved", None)
    if upgrade is not None and isinstance(data, dict):
        data = upgrade(copy.deepcopy(data))
    return validate(data, schema, where)


def resolve_named(name_or_path: str | os.PathLike, builtin_dir: Path) -> Path | None:
    """The file ``name_or_path`` names: itself when it exists, else the built-in ``builtin_dir/NAME.yaml``."""
    path = Path(name_or_path)
    if path.exists():
        return path
    builtin = builtin_dir / f"{name_or_path}.yaml"
    return builtin if builtin.exists() else None


def load_named(
    name_or_path: str | os.PathLike, schema: type[BaseModel], builtin_dir: Path, kind: str = "panel", fixes: dict[str, str] | None = None
) -> BaseModel:
    """The one panel loader: a YAML path, or a built-in file of ``builtin_dir`` named by its stem.

    A file that leaves out ``name`` is named after its stem when the schema has a ``name`` field; a
    file that is a bare list holds the ``simulators``.
    """
    path = resolve_named(name_or_path, builtin_dir)
    if path is None:
        builtin = ", ".join(sorted(p.stem for p in builtin_dir.glob("*.yaml")))
        raise ConfigError(f"{kind} {str(name_or_path)!r} is neither a file nor a built-in {kind}; built-in: {builtin}")
    defaults = {"name": path.stem} if "name" in schema.model_fields else None
    return load_config(path, schema, defaults, fixes, list_key="simulators")


def dump_config(config: BaseModel, path: str | os.PathLike) -> None:
    files.write_text(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


# ---- the explainer -----------------------------------------------------------------------------

# Parts of an error location that name a branch of an untagged union (``literal['a','b']``,
# ``list[str]``, ``str``) rather than a field: left out of the field path shown to the user.
_SCALAR_BRANCHES = {"str", "int", "float", "bool", "none"}


def _is_branch(part) -> bool:
    return isinstance(part, str) and ("[" in part or part in _SCALAR_BRANCHES)


def field_path(loc: tuple) -> str:
    """``('simulators', 1, 'vs', 'k')`` -> ``simulators[1].vs.k``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def explain(err: ValidationError, schema: type[BaseModel], fixes: dict[str, str] | None = None) -> str:
    """One line per error: where, what is wrong (with the value given), and the fix when known."""
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not _is_branch(p))
        if e["type"] == "removed_field":  # raised by the section, about one of its keys
            loc = (*loc, e["ctx"]["field"])
        where = field_path(loc) or "(top level)"
        message = e["msg"].removeprefix("Value error, ")  # a validator's own message says it all
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            key = str(e.get("ctx", {}).get("discriminator", "")).strip("'")
            where += "." + key
            tags = [t for m in _models_at(schema, loc) for t in sorted(_tags(m))] if e["type"] == "union_tag_not_found" else []
            if tags:
                message = f"missing; set {key} to one of: {', '.join(tags)}"
        field = next((p for p in reversed(loc) if isinstance(p, str)), None)
        fix = (fixes or {}).get(field)
        if "input" in e and loc and e["type"] not in ("missing", "union_tag_invalid", "removed_field"):  # (not the whole file again)
            message += f" (got {_short(e['input'])})"
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(schema, loc[:-1])
            close = difflib.get_close_matches(str(field), allowed, n=1)
            message = "unknown field" + (f" (got {_short(e['input'])})" if "input" in e else "")
            fix = (f"did you mean {close[0]!r}? " if close else "") + (
                f"allowed fields here: {', '.join(allowed)}" if allowed else "remove it"
            )
        lines.append(f"  - {where}: {message}" + (f". Fix: {fix}" if fix else ""))
    return "\n".join(dict.fromkeys(lines))  # an untagged union reports one error per branch


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fields_at(schema: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the nested model at ``loc`` (best effort; [] when it is not one model)."""
    models = _models_at(schema, loc)
    return list(models[0].model_fields) if len(models) == 1 else []


def _models_at(schema: type[BaseModel], loc: tuple) -> list[type[BaseModel]]:
    """The models a nested field at ``loc`` may hold (best effort; [] when unknown): one, or a union's members.

    A tagged union (``env: {name: p4g}``) appears in ``loc`` as its tag, which selects the member.
    """
    models = [schema]
    for part in loc:
        if isinstance(part, int):  # an item of a list field: the item's model was found at the list
            continue
        if not isinstance(part, str):
            return []
        tagged = [m for m in models if part in _tags(m)]
        if len(models) > 1 and tagged:
            models = tagged
            continue
        field = models[0].model_fields.get(part)
        if field is None:
            return []
        models = [a for a in (field.annotation, *_union_members(field.annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not models:
            return []
    return models


def _union_members(annotation) -> list:
    out = []
    for arg in typing.get_args(annotation):
        out += [arg, *_union_members(arg)]
    return out


def _tags(model: type[BaseModel]) -> set[str]:
    """The literal values of a model's discriminator field (``name`` or ``mode``)."""
    return {v for key in ("name", "mode") if key in model.model_fields for v in typing.get_args(model.model_fields[key].annotation)}
