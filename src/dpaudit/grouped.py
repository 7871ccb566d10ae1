"""Records that group their fields into small records while their dict form stays flat."""

from __future__ import annotations

import dataclasses


class Grouped:
    """Mixin of a frozen dataclass some of whose fields (the class's ``GROUPS``: field name ->
    record type) are small records of their own. An inner field reads as an attribute of the whole
    (``result.counts``), :meth:`of` builds the whole from flat keys, :meth:`flat` lists them flat
    and :meth:`replace` changes them by name."""

    GROUPS: dict = {}

    def __getattr__(self, name: str):
        for group in type(self).GROUPS:
            inner = self.__dict__.get(group)  # absent while a copy is being built
            if inner is not None and name in inner.__dataclass_fields__:
                return getattr(inner, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @classmethod
    def of(cls, **keys):
        """The record of flat keys, each inner one put in its group."""
        for group, kind in cls.GROUPS.items():
            names = [f.name for f in dataclasses.fields(kind)]
            keys[group] = kind(**{k: keys.pop(k) for k in names if k in keys})
        return cls(**keys)

    def flat(self) -> dict:
        """Every field, the groups' fields in place of the groups (values not copied)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            inner = dataclasses.fields(value) if f.name in self.GROUPS else ()
            out.update({g.name: getattr(value, g.name) for g in inner} or {f.name: value})
        return out

    def replace(self, **changes):
        """A copy with flat keys changed."""
        return type(self).of(**{**self.flat(), **changes})
