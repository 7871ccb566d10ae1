"""File helpers shared by the loaders: hashing, the data folder's ``SHA256SUMS``, one-line errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import DataError

SHA256SUMS = "SHA256SUMS"


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file; md5 only to compare with published checksums."""
    h = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _relative(path: Path, data_dir: Path) -> str | None:
    try:
        return path.relative_to(data_dir).as_posix()
    except ValueError:
        return None


def read_text(path: Path, encoding: str = "utf-8") -> str:
    """The text of ``path``; a file that cannot be read or decoded is a one-line DataError."""
    try:
        return path.read_text(encoding=encoding)
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}.") from None


def read_sha256sums(data_dir: Path) -> dict[str, str]:
    """``relative path -> sha256`` from ``<data_dir>/SHA256SUMS`` (empty when the file is absent)."""
    path = data_dir / SHA256SUMS
    if not path.is_file():
        return {}
    sums: dict[str, str] = {}
    for line in read_text(path).splitlines():
        parts = line.strip().split(maxsplit=1)
        if len(parts) == 2:
            sums[parts[1].lstrip("*").strip()] = parts[0].lower()
    return sums


def require_files(folder: Path, names: list[str] | tuple[str, ...], what: str) -> None:
    """Raise one :class:`DataError` line naming every expected file and the folder searched."""
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DataError(
            f"{what} files not found: expected {', '.join(names)} in {folder} (missing: {', '.join(missing)})."
        )


def hash_and_verify(
    data_dir: Path, folder: Path, names: list[str] | tuple[str, ...], what: str
) -> dict[str, str]:
    """sha256 of each file (all must exist: :func:`require_files`); checked against ``<data_dir>/SHA256SUMS`` where it lists the
    file. Returns ``file name -> sha256``. A mismatch is a :class:`DataError` (corrupt or altered file)."""
    require_files(folder, names, what)
    sums = read_sha256sums(data_dir)
    out: dict[str, str] = {}
    for name in names:
        path = folder / name
        try:
            digest = file_digest(path)
        except OSError as exc:
            raise DataError(f"cannot read {what} file {path}: {exc.strerror or exc}.") from None
        expected = sums.get(_relative(path, data_dir) or name)
        if expected is not None and expected != digest:
            raise DataError(
                f"{what} file {path} is corrupt: sha256 must be {expected} (from {data_dir / SHA256SUMS}), "
                f"got {digest}."
            )
        out[name] = digest
    return out


def sums_note(data_dir: Path, folder: Path, names: list[str] | tuple[str, ...]) -> str:
    """One phrase for ``notes``: whether the files' sha256 were checked against SHA256SUMS."""
    sums = read_sha256sums(data_dir)
    listed = [_relative(folder / name, data_dir) in sums for name in names]
    if listed and all(listed):
        return f"sha256 of all {len(names)} source files verified against {SHA256SUMS}"
    if any(listed):
        return f"sha256 of {sum(listed)} of {len(names)} source files verified against {SHA256SUMS}; the others recorded only"
    return f"no {SHA256SUMS} entries for the source files; their sha256 are recorded only"


def count_note(kept: str, n: int, expected: int) -> str:
    """``"<kept> <n> rows"`` for ``notes``, saying so when the published file gives ``expected``."""
    differs = f" (the original file gives {expected}: this file differs from the published one)"
    return f"{kept} {n} rows" + (differs if n != expected else "")
