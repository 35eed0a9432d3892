"""The command line's bridge to Hydra and its one way of failing: ``hydra_run`` runs a pipeline under ``@hydra.main``
with a command's trailing arguments as Hydra's argv (checks before the pipeline loads, a run directory that holds no
result removed), and every refusal leaves as ``error:``/``fix:`` lines with exit code 2 (``fail``; a file-system
failure mapped by ``os_failure``). ``specbench.cli`` holds the Typer commands that use it.
"""

from __future__ import annotations

import errno
import importlib
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from specbench.configs import check_experiment_command, conf_dir, hydra_error, hydra_overrides
from specbench.errors import SpecbenchError

HYDRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["--help"]}
# OSError numbers that mean "this path cannot be written (or read) here": a read-only directory or file
# system, a full disk, a file where a directory should be
PATH_ERRORS = (
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.ENOTDIR,
    errno.ENOENT,
    errno.EISDIR,
)
FULL = (errno.ENOSPC, errno.EDQUOT)
RESUME = "then rerun the same command: it resumes from its records (what was written is kept whole)"


def os_failure(exc: BaseException, elsewhere: str) -> SpecbenchError | None:
    """The error/fix lines of a failed file operation, wherever it happened (one mapping for every command): a
    full disk or quota (``write()`` errors carry no file name, and ``torch.save`` wraps ENOSPC in a RuntimeError
    about an "unexpected pos"), or a path that cannot be written or read (``elsewhere``: how to write the run to
    another place). None: not a file-system failure."""
    chain, e = [], exc
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in (
        chain
    ):  # a full disk anywhere in the chain names itself first (a wrapped ENOSPC says more than its wrapper)
        if isinstance(e, OSError) and e.errno in FULL:
            where = f" writing {e.filename}" if e.filename else ""
            return SpecbenchError(
                f"no space left on the device{where} ({e.strerror or 'disk full or quota reached'})",
                f"free some space (or raise the quota), {RESUME}; or {elsewhere}",
            )
    for e in chain:
        if isinstance(e, RuntimeError) and ("unexpected pos" in str(e) or "file write failed" in str(e)):
            return SpecbenchError(
                f"a checkpoint write failed ({str(e).splitlines()[0][:160]}): the disk is most likely full",
                f"free some space, {RESUME}; or {elsewhere}",
            )
        if (
            isinstance(e, OSError)
            and e.errno == errno.EEXIST
            and e.filename
            and Path(e.filename).exists()
            and not Path(e.filename).is_dir()
        ):  # mkdir(exist_ok=True) on a file
            return SpecbenchError(f"{e.filename} is a file, not a directory", elsewhere)
        if isinstance(e, OSError) and e.errno in PATH_ERRORS and e.filename:
            return SpecbenchError(
                f"{e.strerror}: {e.filename}",
                f"check that path (permissions, a file where a directory should be, a missing "
                f"parent), or {elsewhere}",
            )
    return None


def fail(exc: SpecbenchError) -> None:
    """Print ``exc`` as ``error:``/``fix:`` lines and exit with code 2 (bad input, said once for every command)."""
    typer.secho(f"error: {exc.problem}", fg="red", err=True)
    if exc.fix:
        typer.secho(f"fix:   {exc.fix}", err=True)
    raise SystemExit(2)


def hydra_run(config_name: str, pipeline: str, args: list[str]) -> None:
    """Run ``specbench.pipelines.<pipeline>.run(cfg, output_dir)`` under ``@hydra.main`` with ``args`` as Hydra's
    argv. The keys of no class, those of the tables that load no more than torch (decoding, cascade, dataset,
    train-policy) and a selector's (its class's signature) are validated before the pipeline's module (models,
    transformers) is imported, so a bad value of one is answered in about 1.6 s; every typed key (target, pool,
    the commands' own sections too: ``pipelines.keys``) once the pipeline is imported, before its own first
    checks, and again at its door (``run_dir.start_run``) before it loads anything.
    Bad input of any kind (Hydra's composition errors included) stops with ``error:``/``fix:``
    lines and exit code 2; a run that fails before writing any result removes its directory. An
    ``+experiment`` written for another command (its ``commands`` key) is refused.
    """
    import hydra
    from hydra.core.hydra_config import HydraConfig

    light = light_check(config_name)

    try:
        path = conf_dir()
    except SpecbenchError as exc:
        fail(exc)

    @hydra.main(version_base=None, config_path=path, config_name=config_name)
    def _main(cfg):
        out = HydraConfig.get().runtime.output_dir
        with discard_if_unused(Path(out)):
            try:
                check_experiment_command(HydraConfig.get().runtime.choices.get("experiment"), config_name)
                light(cfg)  # what loads no more than torch, at once
                if cfg.get("methods") is not None and cfg.get("pool") is not None:
                    from specbench.pipelines.methods import check_methods

                    check_methods(cfg)  # method names against the pool, before the pipeline loads
                module = importlib.import_module(f"specbench.pipelines.{pipeline}")
                from specbench.pipelines import keys

                # every typed key, before the pipeline's own first checks (its door repeats it)
                keys.check(cfg, config_name)
                return module.run(cfg, out)
            except Exception as exc:  # noqa: BLE001 - bad input is reported, anything else re-raised
                _fail_or_raise(exc, config_name)

    argv = sys.argv
    try:
        sys.argv = [f"specbench {config_name}", *hydra_overrides(args)]
        with _hydra_raises():
            _main()
    except Exception as exc:  # noqa: BLE001 - Hydra's composition errors, an unwritable run directory
        _fail_or_raise(exc, config_name)
    finally:
        sys.argv = argv


def light_check(config_name: str) -> Callable:
    """What the command line checks before it imports the pipeline: the keys of no class, the sections whose modules
    load no more than torch (decoding, cascade, dataset; a light command's own, ``LIGHT_SECTIONS``) and a selector's
    arguments (its class's signature), so a bad value of one is answered in about a second."""
    from specbench import selection
    from specbench.decoding.cascade import Cascade
    from specbench.decoding.sampling import DECODING
    from specbench.pipelines.batch_settings import check_batched
    from specbench.tasks.datasets import DatasetSettings
    from specbench.validate import schema, tables, validate

    light = {"decoding": DECODING, "cascade": (Cascade,), "dataset": (DatasetSettings,)}
    own = LIGHT_SECTIONS.get(config_name)
    rules = schema(*tables(light), *tables(own() if own else {}))

    def check(cfg) -> None:
        validate(cfg, rules, locate=selection.TARGETS.get)
        check_batched(cfg, config_name)  # decoding.batch_size: eval only, and what a batch can run

    return check


def _policy_sections():
    from specbench.policy import model

    return model.SECTIONS


# the commands whose own sections are declared in modules that load no more than torch, by config name
LIGHT_SECTIONS: dict[str, Callable] = {"train_policy": _policy_sections}


def _fail_or_raise(exc: Exception, config_name: str) -> None:
    """Report ``exc`` (being handled) as error/fix lines and exit 2 if it is bad input; else re-raise it."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    if isinstance(exc, SpecbenchError):
        fail(exc)
    if isinstance(exc, (ConfigCompositionException, OverrideParseException)):
        fail(hydra_error(exc, config_name))
    if (
        isinstance(exc, OSError)
        and exc.errno == errno.EEXIST
        and exc.filename
        and Path(exc.filename).exists()
        and not Path(exc.filename).is_dir()
    ):  # mkdir(exist_ok=True) on a file: hydra.run.dir=<a file>
        fail(
            SpecbenchError(
                f"{exc.filename} is a file, not a directory",
                "write the run elsewhere: hydra.run.dir=<a directory> (a new one, or one of "
                "this command's run directories)",
            )
        )
    where = (
        "out=<a writable directory> (or name=<name>)"
        if config_name == "train_drafter"
        else "hydra.run.dir=<a writable directory>"
    )  # train-drafter writes its head to out=
    mapped = os_failure(exc, f"write the run elsewhere: {where}")
    if mapped is not None:
        fail(mapped)
    raise exc


@contextmanager
def _hydra_raises() -> Iterator[None]:
    """Let exceptions leave ``@hydra.main`` as they are (Hydra's switch for it is HYDRA_FULL_ERROR)
    instead of Hydra printing them and exiting 1, so they can be reported as error/fix lines."""
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


def _unused(out: Path) -> bool:
    """``out`` holds no result: nothing but configs, logs (Hydra's ``.hydra/``, ``config.yaml``,
    the job log), the record of what ran it (``provenance.json``) and empty files."""
    from specbench.records import PROVENANCE

    return out.is_dir() and all(
        p.is_dir() or p.suffix in (".yaml", ".log") or p.name == PROVENANCE or p.stat().st_size == 0
        for p in out.rglob("*")
    )


@contextmanager
def discard_if_unused(out: Path) -> Iterator[None]:
    """A run that fails before writing its first result removes its directory, if the directory
    held no result when the run started (Hydra had just made it)."""
    fresh = _unused(out)
    try:
        yield
    except BaseException as exc:
        # a directory another process holds (RunDirTaken) is that process's, however empty it looks; the class
        # exists only once run_dir was imported (looked up, not imported: bad input stops before the models load)
        run_dir = sys.modules.get("specbench.pipelines.session.run_dir")
        taken = run_dir is not None and (
            isinstance(exc, run_dir.RunDirTaken) or isinstance(exc.__context__, run_dir.RunDirTaken)
        )  # reported as exit 2
        if fresh and _unused(out) and not taken:
            shutil.rmtree(out, ignore_errors=True)
        raise


def check_output_directory(path: Path, option: str) -> None:
    """Refuse an output directory that is a file, lies under a file, or cannot be written, before
    anything is read or written (``option`` names the flag in the fix)."""
    fix = f"pass a directory you can write to: {option} <a new or writable directory>"
    if path.exists() and not path.is_dir():
        raise SpecbenchError(f"{option} {path} is a file, not a directory", fix)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise SpecbenchError(
            f"{option} {path}: {existing} is a file, so no directory can be made under it", fix
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be made: {existing} is not writable"
        raise SpecbenchError(f"{option} {path} {what}", fix)
