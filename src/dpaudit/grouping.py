"""Records that keep related fields in small frozen sub-records yet are built, read and written flat.

A record subclasses :class:`Grouped` and is declared ``@dataclass(frozen=True, init=False)``;
``GROUPS`` maps a field to its sub-record class. ``Record(a=1, steps=3)`` puts ``steps`` into its
group, ``record.steps`` reads it from there, :meth:`Grouped.flat_dict` writes the groups' fields
in place of the group (so a published file keeps its keys and their order), and
``dataclasses.replace`` takes flat names too. Pure bookkeeping: no value is changed or dropped.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields, replace


class Grouped:
    """The flat construction, reading and writing of a grouped frozen record (module docstring)."""

    GROUPS: dict = {}

    def __init__(self, **values) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _field_value(self, f, values))
        if values:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(values)}")

    @classmethod
    def flat_names(cls) -> set:
        """The names a flat dict of this record may hold."""
        own = {name for name in cls.__dataclass_fields__ if name not in cls.GROUPS}
        return own.union(*(group.__dataclass_fields__ for group in cls.GROUPS.values()))

    def __getattr__(self, name: str):
        """A grouped field by its flat name (only called when ``name`` is not a field)."""
        for group, cls in self.GROUPS.items():
            if name in cls.__dataclass_fields__ and group in self.__dict__:
                return getattr(self.__dict__[group], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def flat_dict(self, drop: tuple = ()) -> dict:
        """``asdict`` with every group's fields in its place, without the groups named in ``drop``."""
        out = {}
        for name, value in asdict(self).items():
            if name not in self.GROUPS:
                out[name] = value
            elif name not in drop:
                out.update(value)
        return out


def _field_value(record: Grouped, f, values: dict):
    """The value of field ``f`` taken out of ``values`` (a group: from its own and flat names)."""
    group = record.GROUPS.get(f.name)
    if group is not None:
        own = {g.name: values.pop(g.name) for g in fields(group) if g.name in values}
        given = values.pop(f.name, None)
        return group(**own) if given is None else replace(given, **own)
    if f.name in values:
        return values.pop(f.name)
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise TypeError(f"{type(record).__name__} needs {f.name!r}")
