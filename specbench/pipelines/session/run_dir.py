"""A run directory: claimed by one command and one process at a time (``lock_run_dir``: an flock on its
``.specbench.yaml``), refused when its records were made with other settings (``claim_run_dir``, compared by
``compared_settings`` / ``differences``), its composed config saved atomically (``start_run``)."""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from specbench import provenance
from specbench.configs import canonical_option
from specbench.errors import SpecbenchError
from specbench.files import atomic_path, sweep_temporaries
from specbench.pipelines.session.settings import resolve_target_dtype
from specbench.pipelines.session.tables import COMMANDS, check_config, command_name
from specbench.records import BATCHES, CONFIG, EXAMPLES, ROUNDS
from specbench.validate import Sections

log = logging.getLogger(__name__)


# Settings a rerun into a run directory may change, because they change neither the records the run
# writes nor what the records mean: the torch thread count (speed only, and every query's methods
# run back to back under one setting, so per-query comparisons stay fair), the untimed warm-up, the
# run name (where outputs go), the overwrite flags themselves, and which shard a collect process
# takes (each shard writes its own rows file). Hydra's own settings (hydra.*) are not in the config
# a pipeline gets. Every other key is compared: a rerun with any other change is a different run.
NOT_COMPARED = (
    "commands",  # an experiment's declaration of the commands it serves, not a setting (runs before it lack it)
    "threads",
    "warmup",
    "run_name",
    "overwrite",
    "collect.overwrite",
    "collect.shard",
    "collect.num_shards",
)


def canonical_method(spec):
    """A method spec with a selector's older config name replaced by its option's (``selector:etc`` ->
    ``selector:explore_commit``: ``configs.aliases``)."""
    if isinstance(spec, str) and spec.startswith("selector:"):
        return "selector:" + canonical_option("selector", spec.split(":", 1)[1])
    return spec


# Keys added after runs were made, each with the value that does what its absence did: a run made before the key
# existed resumes under a config that holds that value (and is refused under any other).
ADDED = {"decoding.batch_size": 1}


def compared_settings(cfg) -> dict:
    """The resolved settings of a config (a DictConfig or a plain dict) that a rerun must match:
    everything but :data:`NOT_COMPARED`, and a key of :data:`ADDED` only where it is not its old behaviour's value."""
    tree = OmegaConf.to_container(cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg), resolve=True)
    if isinstance(tree.get("methods"), list):  # selector:<an older name> is the renamed option's run
        tree["methods"] = [canonical_method(m) for m in tree["methods"]]
    for key in (*NOT_COMPARED, *ADDED):
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and (key not in ADDED or node.get(leaf, ADDED[key]) == ADDED[key]):
            node.pop(leaf, None)
    return tree


UNSET = object()


def changes(old, new, prefix: str = "") -> list[tuple[str, object, object]]:
    """``(dotted key, old value, new value)`` for every setting that differs between two settings
    trees, in the new tree's order; a key whose value is a mapping on both sides is compared key by
    key, anything else (a list, a mapping on one side only) as a whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(new) + [k for k in old if k not in new]
        return [c for k in keys for c in changes(old.get(k, UNSET), new.get(k, UNSET), f"{prefix}{k}.")]
    return [] if old == new else [(prefix[:-1], old, new)]


def differences(old: dict, new: dict, limit: int = 10) -> list[str]:
    """``key: old -> new`` for each setting that differs (:func:`changes`): the first ``limit`` with
    their values, then the names of the rest."""
    diff = changes(old, new)
    lines = [f"{k}: {_show(a)} -> {_show(b)}" for k, a, b in diff[:limit]]
    rest = [k for k, _, _ in diff[limit:]]
    return lines + ([f"and {len(rest)} more: {', '.join(rest)}"] if rest else [])


def _show(value, width: int = 48) -> str:
    text = "(unset)" if value is UNSET else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass(frozen=True)
class RunFiles:
    """What a resumable pipeline keeps in its run directory: ``results``, globs of the records a
    rerun resumes; ``settings``, the file holding the settings those records were made with; and
    ``overwrite``, the config key that lets a rerun with other settings delete those records."""

    results: tuple[str, ...]
    settings: str = CONFIG
    overwrite: str = "overwrite"


def claim_run_dir(out: Path, cfg: DictConfig, files: RunFiles) -> None:
    """Refuse to resume records made with other settings (naming every setting that differs), unless
    the config's ``files.overwrite`` key is true: then delete them. A directory without records
    (new, or a run that stopped before its first one) is always taken."""
    found = [p for pattern in files.results for p in sorted(out.glob(pattern)) if p.is_file()]
    if not any(p.stat().st_size for p in found):
        return
    saved = out / files.settings
    diff = (
        differences(compared_settings(OmegaConf.load(saved)), compared_settings(cfg))
        if saved.exists()
        else [f"(no {files.settings} to compare with)"]
    )
    if not diff:
        return
    if not OmegaConf.select(cfg, files.overwrite, default=False):
        raise SpecbenchError(
            f"{out} holds results of a different config than this run's, so it cannot resume them; differs in: "
            + "; ".join(diff),
            f"rerun with the directory's own settings to resume it, pick a new directory (hydra.run.dir=...), "
            f"or pass {files.overwrite}=true to delete its results ({', '.join(p.name for p in found)})",
        )
    log.warning(
        "%s=true: deleting the results of another config in %s (%s)",
        files.overwrite,
        out,
        ", ".join(p.name for p in found),
    )
    for p in found:
        p.unlink()


# eval and cascades: examples.jsonl and rounds.jsonl, resumed by (query id, method) (``Records``).
RECORDS = RunFiles(results=(EXAMPLES, ROUNDS, BATCHES))


def save_config(cfg, path: Path) -> None:
    """``OmegaConf.save`` through a temporary file and ``os.replace`` (never a torn config)."""
    with atomic_path(path) as tmp:
        OmegaConf.save(cfg, tmp)


def start_run(
    cfg: DictConfig,
    output_dir: str | Path,
    files: RunFiles | None = None,
    command: str | None = None,
    sections: Sections | None = None,
) -> Path:
    """The door every pipeline passes: validate the composed config (:func:`tables.check_config`: the command line
    and the reproduction plan get the same checks; ``sections``: the command's own, else the training commands'
    by name), create the run directory and take it
    (:func:`lock_run_dir`: one process at a time, one command per directory; ``command`` defaults to Hydra's
    config name), then (with ``files``: after :func:`claim_run_dir`) save the composed config there
    (``target.dtype`` resolved: :func:`resolve_target_dtype`; and the settings file of ``files``) and the code,
    packages and machine this process runs (``provenance.json``: :func:`provenance.record`), apply ``threads``."""
    check_config(
        cfg, sections if sections is not None else COMMANDS.get(command_name(command or hydra_command()))
    )
    resolve_target_dtype(cfg)
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise SpecbenchError(
            f"the run directory {out} is a file", "write the run elsewhere: hydra.run.dir=<a directory>"
        )
    out.mkdir(parents=True, exist_ok=True)
    lock_run_dir(out, command or hydra_command())
    if files is not None:
        claim_run_dir(out, cfg, files)
    save_hydra_record(cfg, out)
    save_config(cfg, out / CONFIG)
    provenance.record(out)
    if files is not None and files.settings != CONFIG:
        save_config(OmegaConf.create(compared_settings(cfg)), out / files.settings)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    return out


# Hydra's record of a run (config, hydra settings, overrides), written once the run holds out
HYDRA_DIR = ".hydra"


def save_hydra_record(cfg: DictConfig, out: Path) -> None:
    """Inside a Hydra app: its ``.hydra/`` record (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``), which Hydra
    itself no longer writes (``hydra.output_subdir: null``, conf/hydra/run_dirs.yaml) because it would write it before
    the run takes its directory: a refused run would overwrite the holder's record."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    except ImportError:  # pragma: no cover - hydra is a dependency
        hydra_cfg = None
    if hydra_cfg is None:
        return
    record = out / HYDRA_DIR
    save_config(cfg, record / CONFIG)
    save_config(
        OmegaConf.create({"hydra": OmegaConf.to_container(hydra_cfg, resolve=False)}), record / "hydra.yaml"
    )
    save_config(OmegaConf.create(list(hydra_cfg.overrides.task)), record / "overrides.yaml")


class RunDirTaken(SpecbenchError):
    """A run directory held by another process, or owned by another command (:func:`lock_run_dir`): the
    refused run must leave that directory as it is (not remove it as a run that wrote nothing)."""


CLAIM_FILE = ".specbench.yaml"  # the directory's owner (command) and the process holding it (flock)

_HELD: dict[str, tuple[int, str]] = {}  # real path of a claim file -> (open fd holding its lock, command)


def hydra_command() -> str | None:
    """The command of the Hydra app running now (``eval``, ``train-policy``, ...), None outside one."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().job.config_name).replace("_", "-")
    except Exception:  # noqa: BLE001 - not under @hydra.main (a pipeline called directly, compose)
        return None


def _read_claim(path: Path) -> dict:
    try:
        claim = OmegaConf.to_container(OmegaConf.load(path)) if path.stat().st_size else {}
    except Exception:  # noqa: BLE001 - a claim torn by a kill: no owner known
        log.warning("%s is unreadable: taking the directory as unclaimed", path)
        return {}
    return claim if isinstance(claim, dict) else {}


def _holder(claim: dict) -> str:
    h = claim.get("holder") or {}
    if not h:
        return "another process"
    return f"pid {h.get('pid')} on {h.get('host')} (`{h.get('argv')}`), started {h.get('started')}"


def lock_run_dir(
    path: str | Path, command: str | None, fix: str | None = None, elsewhere: str | None = None
) -> Path:
    """Take the run directory ``path`` for this process and ``command`` (e.g. ``"eval"``, ``"reproduce"``),
    for the rest of the process's life; returns ``path``.

    - One writer at a time: an exclusive ``fcntl.flock`` on ``<path>/.specbench.yaml``, held open until the
      process exits (the kernel releases it then, so a killed run leaves no stale lock). A second process
      is refused with a SpecbenchError naming the holder (pid, host, command line, start time: written
      into that file); ``fix`` replaces the default fix line (another hydra.run.dir).
      ``elsewhere``: how this command is pointed at another directory (default ``hydra.run.dir=<another
      directory>``), for the refusal below.
    - One command per directory: the file records the command that first wrote the directory, and a run
      of another command into it is refused (it would replace that command's files). ``command`` None
      (a pipeline called outside the CLI without naming itself) locks without checking the owner.
    - A fresh hold sweeps the temporary files an atomic write left when its process was killed inside it
      (``files.sweep_temporaries``: nothing else can be writing them now).
    Reentrant: the process that holds the directory may take it again (a resume in the same process).
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    command = None if command is None else str(command).replace("_", "-")
    file = out / CLAIM_FILE
    held = _still_held(file)
    _check_owner(out, run_command(out), command, fix, elsewhere)
    fd = held if held is not None else _flock(file, out, command, fix)
    owner = run_command(out)  # as it is now that this process holds it
    text = OmegaConf.to_yaml(
        OmegaConf.create(
            {
                "command": owner or command,
                "holder": {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "argv": " ".join(sys.argv),
                    "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                },
            }
        )
    )
    data = text.encode()
    os.pwrite(fd, data, 0)  # in place (the lock is on this file), then cut: never an empty claim
    os.ftruncate(fd, len(data))
    _HELD[os.path.realpath(file)] = (fd, owner or command)
    if held is None:
        for stale in sweep_temporaries(out):
            log.info("removed %s, left by a write that was killed", stale)
    return out


def _still_held(file: Path) -> int | None:
    """The descriptor this process holds the claim ``file`` by, None when it holds none (or held a file that was
    removed with its directory, a failed run's, and made again)."""
    key = os.path.realpath(file)
    held = _HELD.get(key)
    if held is None:
        return None
    try:
        same = os.fstat(held[0]).st_ino == os.stat(file).st_ino
    except OSError:
        same = False
    if not same:
        os.close(held[0])
        del _HELD[key]
        return None
    return held[0]


def _check_owner(
    out: Path,
    owner: str | None,
    command: str | None,
    fix: str | None,
    elsewhere: str | None,
    fd: int | None = None,
) -> None:
    """Refuse a run of ``command`` into a directory that ``owner`` (another command) wrote; ``fd``: a descriptor to
    close first (the lock just taken)."""
    if command is None or not owner or owner == command:
        return
    if fd is not None:
        os.close(fd)
        raise RunDirTaken(
            f"{out} belongs to `specbench {owner}` (recorded in {out / CLAIM_FILE}), so `specbench "
            f"{command}` cannot run into it",
            fix or f"write the {command} run elsewhere: hydra.run.dir=<another directory>",
        )
    raise RunDirTaken(
        f"{out} belongs to `specbench {owner}` (recorded in {out / CLAIM_FILE}), so `specbench {command}` cannot run "
        f"into it: it would replace {owner}'s files (config.yaml, summaries) and {owner} would refuse its own records",
        f"write the {command} run elsewhere: {elsewhere or 'hydra.run.dir=<another directory>'}",
    )


def _flock(file: Path, out: Path, command: str | None, fix: str | None) -> int:
    """An exclusive, non-blocking ``flock`` on the claim ``file``: its descriptor, or the refusal naming the
    process that holds it (or the command that took the directory while this one waited)."""
    fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        claim = _read_claim(file)
        os.close(fd)
        raise RunDirTaken(
            f"{out} is being written by another specbench run: {_holder(claim)} "
            f"(specbench {claim.get('command') or '?'}); two runs in one directory would both append every "
            "record and build their summaries on the doubled records",
            fix
            or "wait for that run to finish (or stop it), or write this run elsewhere: "
            "hydra.run.dir=<another directory>",
        ) from None
    _check_owner(out, run_command(out), command, fix, None, fd=fd)
    return fd


def run_command(path: str | Path) -> str | None:
    """The command that owns a run directory (its ``.specbench.yaml``), None when unrecorded."""
    file = Path(path) / CLAIM_FILE
    return _read_claim(file).get("command") if file.is_file() else None
