"""Records that group their fields into small records while their dict form stays flat."""

from __future__ import annotations

import dataclasses


class Grouped:
    """Mixin of a frozen dataclass some of whose fields (the class's ``GROUPS``: field name ->
    record type) are small records of their own. An inner field reads as an attribute of the whole
    (``result.counts``), :meth:`of` builds the whole from flat keys, :meth:`flat` lists them flat
    and :meth:`replace` changes them by name."""

    GROUPS: dict = {}

    def __init__(self, **values) -> None:
        """Flat construction, for a record declared ``@dataclass(frozen=True, init=False)`` (the
        dataclass's own ``__init__`` replaces this one otherwise): a group's fields may be given by
        their own names (over the group, when both are), so ``dataclasses.replace`` takes them too."""
        put_in_groups(self.GROUPS, values)
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _field_value(self, f, values))
        if values:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(values)}")

    @classmethod
    def flat_names(cls) -> set:
        """The names a flat dict of this record may hold."""
        own = {name for name in cls.__dataclass_fields__ if name not in cls.GROUPS}
        return own.union(*(group.__dataclass_fields__ for group in cls.GROUPS.values()))

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


def put_in_groups(groups: dict, values: dict) -> None:
    """Move the members of each group (``groups``: field name -> record type) that ``values`` gives
    by their own names into that group's record, over a record given for the group (``values``
    changed in place): flat keywords for :class:`Grouped` records and for requests."""
    for name, kind in groups.items():
        own = {f.name: values.pop(f.name) for f in dataclasses.fields(kind) if f.name in values}
        if own:
            given = values.get(name)
            values[name] = kind(**own) if given is None else dataclasses.replace(given, **own)


def _field_value(record: Grouped, f, values: dict):
    """The value of field ``f`` taken out of ``values`` (a group not given: all its defaults)."""
    group = record.GROUPS.get(f.name)
    if group is not None:
        given = values.pop(f.name, None)
        return group() if given is None else given
    if f.name in values:
        return values.pop(f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"{type(record).__name__} needs {f.name!r}")
