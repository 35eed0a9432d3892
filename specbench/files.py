"""Files written whole and files told apart: a write that replaces its file in one ``os.replace`` (never torn by an
interruption), the modes a plain write gives (libraries' own writers leave 0600), the temporaries a killed process
left, and the fingerprint of a checkpoint's weight files (what resumes check). The record types and the JSONL files
a run appends to are ``specbench/records.py``.
"""

from __future__ import annotations

import functools
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: Path):
    """A temporary path beside ``path`` to write to; on success it replaces ``path`` in one ``os.replace``,
    so an interruption (Ctrl-C, kill -9) leaves either the old file or the new one, never a torn one.

        with atomic_path(out / "state.pt") as tmp:
            torch.save(blob, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if tmp.exists():  # mkstemp makes it 0600: give the mode a plain write under the user's umask gives
            os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@functools.cache
def current_umask() -> int:
    """The process's umask (read once, by setting it and back: the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_tensors(tensors: dict, path: Path) -> None:
    """``safetensors`` ``save_file`` through :func:`atomic_path`: never torn, and the file mode a plain write under the
    user's umask gives (safetensors' own writer leaves 0600)."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp))


def plain_modes(directory: Path) -> None:
    """Give every file under ``directory`` (a library's writes: ``save_pretrained``) the mode a plain write under the
    user's umask gives (0644 under umask 022), and every directory 0755."""
    mask = current_umask()
    for p in [Path(directory), *Path(directory).rglob("*")]:
        if p.is_symlink():
            continue
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def sweep_temporaries(directory: Path) -> list[Path]:
    """Remove the temporary files :func:`atomic_path` left in ``directory`` when a process was killed inside a
    write (SIGKILL skips every cleanup): ``.<name>.<random>.tmp``. Call it only while holding the directory (its
    run lock), so that no live write is swept."""
    removed = []
    for p in Path(directory).glob(".*.tmp"):
        if p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def atomic_write_text(path: Path, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding=encoding)


# -- checkpoint fingerprints ---------------------------------------------------------------------------

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
HASHED_BYTES = 1 << 30  # files up to 1 GiB are hashed by content; larger ones by size and mtime


def files_fingerprint(path: str | Path | None) -> str | None:
    """A short hash of a checkpoint directory's weights and configs (``*.safetensors``, ``*.bin``, ...,
    ``config.json``, ``specbench.json``; train-drafter's ``state.pt`` left out): what a drafter loaded from
    it computes with, so a retrained checkpoint behind an unchanged config is noticed. None for None (a hub
    id or an embedded model: fixed by name)."""
    if path is None:
        return None
    import hashlib

    path = Path(path)
    files = (
        [path]
        if path.is_file()
        else sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.name != "state.pt"
            and (p.suffix in WEIGHT_SUFFIXES or p.name in ("config.json", "specbench.json"))
        )
    )
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(path) if f != path else f.name}\0{st.st_size}\0".encode())
        if st.st_size > HASHED_BYTES:
            h.update(str(st.st_mtime_ns).encode())
            continue
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def existing(paths, what: str, fix: str) -> None:
    """Refuse a path that does not exist, saying so (a script given a wrong path must not read it as an empty run):
    ``what`` names the kind of path (an eval run directory, a trace run), ``fix`` how to make or find one."""
    from specbench.errors import SpecbenchError

    for p in [paths] if isinstance(paths, (str, Path)) else list(paths):
        if p is not None and not Path(p).exists():
            raise SpecbenchError(f"{what} {p} does not exist", fix)
