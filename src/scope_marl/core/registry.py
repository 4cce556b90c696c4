"""Name -> implementation tables: the environments, simulator modes, advantage baselines and loss
aggregations a config can name.

The pattern of tau2-bench's ``registry.py`` and verl's ``core_algos``: an implementation is added by
one registration next to its code, and found by the name a config gives; an unknown name is an error
that lists the known ones (and says where to register another). The tables themselves live with what
they hold (``assembly.ENVIRONMENTS`` / ``SIMULATOR_MODES``, ``training.losses.ADVANTAGES`` /
``LOSS_AGGREGATIONS``); this module is only the table, so any layer can keep one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A name no implementation is registered under; the message lists the registered ones."""


class Registry(Generic[T]):
    """Implementations by name. ``kind`` names what they are in messages ("environment"); ``where``
    says how to add one (e.g. "@register_env in scope_marl/assembly.py")."""

    def __init__(self, kind: str, where: str = "") -> None:
        self.kind = kind
        self.where = where
        self._entries: dict[str, T] = {}

    def add(self, name: str, value: T) -> T:
        """Register ``value`` under ``name``; a second, different value under one name is an error."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} is registered under a non-empty string, not {name!r}")
        if name in self._entries and self._entries[name] is not value:
            raise ValueError(f"{self.kind} {name!r} is registered twice ({self._entries[name]!r} and {value!r}); pick another name")
        self._entries[name] = value
        return value

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`: ``@REGISTRY.register("name")`` above the implementation."""

        def decorate(value: T) -> T:
            return self.add(name, value)

        return decorate

    def get(self, name: str) -> T:
        """The implementation registered under ``name``; :class:`UnknownName` lists the known ones."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            hint = f"; add one with {self.where}" if self.where else ""
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}{hint}") from None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
