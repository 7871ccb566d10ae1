"""Records that group their fields into small records while their dict form stays flat.

One rule for every grouped record (requests, releases, plans, audit records): a member of a group
is given, read and changed by its own name, as if declared in place of its group
(``request.workers`` is ``request.trials.workers``; ``Release(noise_seed_file=...)``,
``dataclasses.replace(result, counts=...)``), and the group reads as a record of its own.
"""

from __future__ import annotations

import dataclasses


class FlatKeywords(type):
    """Metaclass of :class:`Grouped`: the keywords of a call are put in their groups before the
    dataclass's own ``__init__`` runs, so ``dataclasses.replace`` takes member names too."""

    def __call__(cls, *args, **kwargs):
        put_in_groups(cls.groups(), kwargs)
        unknown = [name for name in kwargs if name not in cls.__dataclass_fields__]
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)}")
        return super().__call__(*args, **kwargs)


class Grouped(metaclass=FlatKeywords):
    """Mixin of a frozen dataclass some of whose fields are small records of their own, declared
    with :func:`group` (or listed in the class's ``GROUPS``: field name -> record type)."""

    GROUPS: dict = {}

    @classmethod
    def groups(cls) -> dict:
        """Field name -> record type of each group, in declaration order (found once per class:
        every flat read asks)."""
        if "_groups" not in cls.__dict__:
            declared = {f.name: f.metadata.get("group") for f in dataclasses.fields(cls)}
            cls._groups = cls.GROUPS or {name: kind for name, kind in declared.items() if kind}
        return cls._groups

    @classmethod
    def flat_names(cls) -> set:
        """The names a flat dict of this record may hold."""
        groups = cls.groups()
        inner = [member for group in groups.values() for member in dataclasses.fields(group)]
        return {f.name for f in (*dataclasses.fields(cls), *inner) if f.name not in groups}

    def __getattr__(self, name: str):
        for group in type(self).groups():
            inner = self.__dict__.get(group)  # absent while a copy is being built
            if inner is not None and name in inner.__dataclass_fields__:
                return getattr(inner, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @classmethod
    def of(cls, **keys):
        """The record of flat keys (the constructor, which takes them, under the name callers use)."""
        return cls(**keys)

    def flat(self) -> dict:
        """Every field, the groups' fields in place of the groups (values not copied)."""
        out = {}
        groups = self.groups()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out.update(vars(value) if f.name in groups else {f.name: value})
        return out

    def replace(self, **changes):
        """A copy with flat keys changed."""
        return dataclasses.replace(self, **changes)


def group(record_type: type):
    """A field of a :class:`Grouped` record holding a small record of related fields.

    Args:
        record_type: a frozen dataclass, every field with a default (its names unique in the
            record that holds it).

    Returns:
        the dataclass field (default: ``record_type()``); its members are given, read and
        written by their own names, as if declared in place of the group.
    """
    return dataclasses.field(default_factory=record_type, metadata={"group": record_type})


def put_in_groups(groups: dict, values: dict) -> None:
    """Move the members of each group (``groups``: field name -> record type) that ``values`` gives
    by their own names into that group's record (``values`` changed in place): over the record
    given for the group, else into a new one (its other fields at their defaults)."""
    for name, kind in groups.items():
        own = {f.name: values.pop(f.name) for f in dataclasses.fields(kind) if f.name in values}
        given = values.get(name)
        if given is None:
            values[name] = kind(**own)
        elif own:
            values[name] = dataclasses.replace(given, **own)
