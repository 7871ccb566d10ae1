"""Adjacency relations: which pairs of datasets a guarantee calls neighbours."""

from __future__ import annotations

import math
from enum import Enum
from typing import Union

from ..errors import AdjacencyMismatchError, UsageError


class Adjacency(str, Enum):
    """The neighbouring relation a privacy claim is made under.

    - ``add-remove-record``: D' = D plus or minus one record.
    - ``replace-record``: D' = D with one record replaced (same size).
    - ``add-remove-user``: D' = D plus or minus all records of one user.
    """

    ADD_REMOVE_RECORD = "add-remove-record"
    REPLACE_RECORD = "replace-record"
    ADD_REMOVE_USER = "add-remove-user"

    def __str__(self) -> str:  # so f-strings and JSON show the value
        return self.value

    @classmethod
    def parse(cls, value: "str | Adjacency") -> "Adjacency":
        if isinstance(value, Adjacency):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(a.value for a in cls)
            raise UsageError(f"adjacency must be one of {allowed}, got {value!r}.") from None


#: An adjacency or its name.
AdjacencyLike = Union[str, Adjacency]


def require_same(
    a: AdjacencyLike,
    b: AdjacencyLike,
    what: str = "guarantees",
    error: type = AdjacencyMismatchError,
) -> Adjacency:
    """Return the common adjacency of ``a`` and ``b``; combining different ones is an error
    (``error``, an :class:`AdjacencyMismatchError`), never a silent conversion (that must be asked
    for explicitly: :func:`convert`)."""
    a, b = Adjacency.parse(a), Adjacency.parse(b)
    if a is not b:
        raise error(f"cannot combine {what} under different adjacency: {a.value} vs {b.value}.")
    return a


def convert(epsilon: float, delta: float, source: AdjacencyLike, target: AdjacencyLike) -> tuple:
    """Documented, explicit conversions between adjacency relations.

    add-remove-record -> replace-record: a replacement is a removal then an addition, so by
    group privacy of size 2: (2 eps, (1 + e^eps) delta). Same relation: unchanged. Every other
    direction has no generic conversion and raises.
    """
    s, t = Adjacency.parse(source), Adjacency.parse(target)
    if s is t:
        return epsilon, delta
    if s is Adjacency.ADD_REMOVE_RECORD and t is Adjacency.REPLACE_RECORD:
        return 2.0 * epsilon, (1.0 + math.exp(epsilon)) * delta
    raise AdjacencyMismatchError(f"no generic conversion from {s.value} to {t.value}.")
