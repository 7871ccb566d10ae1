"""Which people a dataset reads: row ids in named sources (:data:`SOURCES`), each as private (trained on under the DP claim)
or public (read without noise). Every built-in dataset and MixMin task declares its :class:`RowSet` s; the ledger
(:mod:`dpaudit.ledger.rows`) budgets people across dataset names from them (docs/ledger.md, "One budget per person"). Row ids
are positions in public files, not data values; still, they never enter release.json."""

from __future__ import annotations

from dataclasses import dataclass

#: Source of every built-in name (dataset or task): what an entry without recorded rows (written before rows were declared) is
#: assumed to have read, privately, in full (fail closed).
SOURCES = {
    "mnist": "mnist",
    "mnist-mix": "mnist",
    "cifar10": "cifar10",
    "cardio": "kaggle-cardio",
    "heart": "uci-heart-cleveland",
    "heart-mix": "uci-heart-cleveland",
    "digits": "sklearn-digits",
    "digits-mix": "sklearn-digits",
    "breast-cancer": "sklearn-breast-cancer",
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
    if getattr(getattr(ids, "dtype", None), "kind", "") in ("i", "u"):  # tolist: Python ints
        return tuple(ids.tolist())
    return tuple(map(int, ids.tolist() if hasattr(ids, "tolist") else ids))
