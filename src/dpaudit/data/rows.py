"""Which people a dataset reads: row ids in named sources, each as private or public.

A person's privacy budget belongs to the person, not to the name of a dataset: ``heart`` and ``heart-mix`` both read rows of the
Cleveland file. Every built-in dataset and MixMin task therefore declares, per partition, the rows it reads as :class:`RowSet` s:
a *source* (one file or bundled collection, :data:`SOURCES`), the row ids in it (a row's position in the source file, 60,000 + row
for MNIST's test file), and a role. ``private``: the partition a release trains on under its DP claim. ``public``: read without
noise (public sources, proxies and pretraining of DP-MixMin, and the validation and test partitions whose metrics are published).
The ledger (:mod:`dpaudit.ledger.rows`) keeps only keyed hashes of the ids, composes releases whose private rows
intersect, and refuses a release that would read as public what another holds private (or the reverse).

Row ids are positions in public files, not data values; still, they never enter release.json."""

from __future__ import annotations

from dataclasses import dataclass

#: Source of every built-in name (dataset or task): what an entry without recorded rows (written before rows were declared) is
#: assumed to have read, privately, in full (fail closed).
SOURCES = {
    "mnist": "mnist", "mnist-mix": "mnist", "cifar10": "cifar10", "cardio": "kaggle-cardio",
    "heart": "uci-heart-cleveland", "heart-mix": "uci-heart-cleveland",
    "digits": "sklearn-digits", "digits-mix": "sklearn-digits", "breast-cancer": "sklearn-breast-cancer",
}
#: Row ids of a test file follow those of the training file (MNIST: 60,000 + row; CIFAR-10: 50,000 + row).
TEST_OFFSET = {"mnist": 60_000, "cifar10": 50_000}
ROLES = ("private", "public")


@dataclass(frozen=True)
class RowSet:
    """Rows of ``source`` a release reads in ``role``; ``ids`` None: every row (rows unknown)."""
    source: str
    role: str
    ids: tuple | None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}.")


def row_sets(source: str, partitions: dict, private: str = "train") -> tuple[RowSet, ...]:
    """The :class:`RowSet` s of a dataset whose partition ``private`` is trained on under DP and whose other partitions (``name ->
    ids``) are read without noise."""
    out = [RowSet(source, "private", _ids(partitions[private]))]
    public = [i for p, ids in partitions.items() if p != private for i in _ids(ids)]
    if public:
        out.append(RowSet(source, "public", tuple(public)))
    return tuple(out)


def _ids(ids) -> tuple:
    return tuple(int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids))
