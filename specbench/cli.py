"""The ``specbench`` command line: Typer commands that hand their trailing arguments to Hydra.

``specbench eval target=tiny_llama pool=tiny dataset.limit=4`` and ``specbench eval -m
decoding.draft_length=2,4`` behave as in any Hydra app (run directories under ``outputs/``).
"""

from __future__ import annotations

import errno
import importlib
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from specbench.configs import check_experiment_command, conf_dir, config_help, hydra_error, hydra_overrides
from specbench.errors import SpecbenchError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Multi-drafter speculative decoding: collect rewards, train drafter policies, evaluate.",
)
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


def _fail(exc: SpecbenchError) -> None:
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
        _fail(exc)

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
    from specbench.tasks.datasets import DatasetSettings
    from specbench.validate import schema, tables, validate

    light = {"decoding": DECODING, "cascade": (Cascade,), "dataset": (DatasetSettings,)}
    own = LIGHT_SECTIONS.get(config_name)
    rules = schema(*tables(light), *tables(own() if own else {}))
    return lambda cfg: validate(cfg, rules, locate=selection.TARGETS.get)


def _policy_sections():
    from specbench.policy import model

    return model.SECTIONS


# the commands whose own sections are declared in modules that load no more than torch, by config name
LIGHT_SECTIONS: dict[str, Callable] = {"train_policy": _policy_sections}


def _fail_or_raise(exc: Exception, config_name: str) -> None:
    """Report ``exc`` (being handled) as error/fix lines and exit 2 if it is bad input; else re-raise it."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    if isinstance(exc, SpecbenchError):
        _fail(exc)
    if isinstance(exc, (ConfigCompositionException, OverrideParseException)):
        _fail(hydra_error(exc, config_name))
    if (
        isinstance(exc, OSError)
        and exc.errno == errno.EEXIST
        and exc.filename
        and Path(exc.filename).exists()
        and not Path(exc.filename).is_dir()
    ):  # mkdir(exist_ok=True) on a file: hydra.run.dir=<a file>
        _fail(
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
        _fail(mapped)
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


@app.command("eval", context_settings=HYDRA_ARGS, epilog=config_help("eval", experiments=True))
def eval_(ctx: typer.Context) -> None:
    """Timed decoding: speedup, MAT, acceptance and exact match vs autoregressive (Hydra overrides follow)."""
    hydra_run("eval", "evaluate", ctx.args)


@app.command("bench", context_settings=HYDRA_ARGS, epilog=config_help("bench"))
def bench_(ctx: typer.Context) -> None:
    """Our decode loop vs Hugging Face generate / assisted generation: seconds, speedups, output match."""
    hydra_run("bench", "bench", ctx.args)


@app.command("profile", context_settings=HYDRA_ARGS, epilog=config_help("profile"))
def profile_(ctx: typer.Context) -> None:
    """Cost profile of the target and its pool: verification cost vs new tokens, drafter cost per token."""
    hydra_run("profile", "profile", ctx.args)


@app.command("trace", context_settings=HYDRA_ARGS, epilog=config_help("trace", experiments=True))
def trace_(ctx: typer.Context) -> None:
    """Acceptance traces: every drafter's draft and its greedy acceptance at every output position (for replay)."""
    hydra_run("trace", "trace", ctx.args)


@app.command("replay", context_settings=HYDRA_ARGS, epilog=config_help("replay", experiments=True))
def replay_(ctx: typer.Context) -> None:
    """Selectors replayed exactly over traces: many seeds, predicted times, convergence (no model loaded)."""
    hydra_run("replay", "replay", ctx.args)


@app.command("cascades", context_settings=HYDRA_ARGS, epilog=config_help("cascades", experiments=True))
def cascades_(ctx: typer.Context) -> None:
    """Speculative cascades: quality vs speedup per (rule, alpha), curves.csv/md and a PNG per task."""
    hydra_run("cascades", "cascades", ctx.args)


@app.command("collect", context_settings=HYDRA_ARGS, epilog=config_help("collect", experiments=True))
def collect(ctx: typer.Context) -> None:
    """Offline rewards for the drafter policy: per query, target/drafter outputs, alignment, costs, embedding."""
    hydra_run("collect", "collect", ctx.args)


@app.command("merge")
def merge(
    sources: list[str] = typer.Argument(..., help="collect output directories (shards)"),
    out: str = typer.Option(..., "--out", help="directory to write the merged rows.jsonl into"),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="replace the rows of a collection already in --out"
    ),
    allow_incomplete: bool = typer.Option(
        False, "--allow-incomplete", help="merge a collection that stopped early (else refused)"
    ),
) -> None:
    """Join the rows of several `specbench collect` shards into one directory."""
    from specbench.pipelines import collected

    try:
        check_output_directory(Path(out), "--out")
        path = collected.merge(sources, out, overwrite=overwrite, allow_incomplete=allow_incomplete)
    except SpecbenchError as exc:
        _fail(exc)
    except OSError as exc:  # a write that fails late: full disk, a read-only mount seen only by writes
        if exc.errno not in PATH_ERRORS + (errno.EEXIST,):  # PATH_ERRORS holds ENOSPC and EDQUOT
            raise
        _fail(
            SpecbenchError(
                f"cannot write the merged rows into {out}: {exc.strerror}"
                + (f": {exc.filename}" if exc.filename else ""),
                "pass a writable directory: --out <a new or writable directory>",
            )
        )
    typer.echo(f"merged rows: {path}")


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


@app.command("train-policy", context_settings=HYDRA_ARGS, epilog=config_help("train_policy"))
def train_policy(ctx: typer.Context) -> None:
    """Train the query -> drafter policy (REINFORCE) on collected rows; writes policy.pt and tables."""
    hydra_run("train_policy", "train_policy", ctx.args)


@app.command("train-drafter", context_settings=HYDRA_ARGS, epilog=config_help("train_drafter"))
def train_drafter(ctx: typer.Context) -> None:
    """Train a draft head for the target by distillation (EAGLE-1 layout); writes a checkpoint directory."""
    hydra_run("train_drafter", "train_drafter", ctx.args)


@app.command("report")
def report(
    root: str = typer.Argument(
        "outputs/reproduce", help="the root that `specbench reproduce` wrote its runs to"
    ),
    out: str = typer.Option(None, "--out", help="report directory (default: ROOT/report)"),
    publish: str = typer.Option(
        None, "--publish", help="also copy the report here (docs/reproduction: the README links it)"
    ),
    layout: str = typer.Option(
        None, "--layout", help="cpu | paper (default: the one `specbench reproduce` recorded in ROOT)"
    ),
    readme: str = typer.Option(
        None,
        "--readme",
        help="with --publish: also write the report's index into this "
        "file, between its generated-report markers",
    ),
    long_horizon: str = typer.Option(
        None,
        "--long-horizon",
        help="the long-horizon replays of `make trace-mixed` (outputs/long_horizon): "
        "their verdicts join the report",
    ),
    against: str = typer.Option(
        None,
        "--against",
        help="a second root of the same plan: a verdict that reads otherwise there is marked unstable (never "
        "counted held); STABILITY.md lists both runs' verdicts",
    ),
    one_commit: bool = typer.Option(
        False, "--one-commit", help="refuse a root whose runs came from several commits or uncommitted code"
    ),
) -> None:
    """Each paper's tables and figures from the run directories under ROOT, published numbers beside ours,
    and each claim checked (REPORT.md)."""
    from specbench.reproduction import render

    try:
        if readme and not publish:
            raise SpecbenchError(
                "--readme needs --publish (the README links the published copy)",
                "add --publish docs/reproduction",
            )
        if readme:  # checked before anything is written or published
            render.check_readme(Path(readme))
        path = render.write(
            root, out, layout, long_horizon=long_horizon, against=against, one_commit=one_commit
        )
        if publish:
            typer.echo(f"published: {render.publish(path, publish)}")
        if readme:
            links = os.path.relpath(Path(publish).resolve(), Path(readme).resolve().parent)
            typer.echo(f"included in: {render.include_in_readme(path, Path(readme), links)}")
    except SpecbenchError as exc:
        _fail(exc)
    except OSError as exc:  # an unwritable --out / --publish, a file where a directory must go, a full disk
        mapped = os_failure(exc, "write the report elsewhere: --out <a writable directory>")
        if mapped is None:
            raise
        _fail(mapped)


@app.command("reproduce", context_settings=HYDRA_ARGS)
def reproduce(
    ctx: typer.Context,
    root: str = typer.Option("outputs/reproduce", "--root", help="where the runs and the report go"),
    scale: str = typer.Option(
        None,
        "--scale",
        help="cpu (default): the CPU-scale plan; tiny: a dry run "
        "of it on tiny models; paper: the paper-scale "
        "experiments (GPU)",
    ),
    profile: str = typer.Option(None, "--profile", hidden=True, help="deprecated: the old name of --scale"),
    paper: list[str] = typer.Option(
        None,
        "--paper",
        help="only these papers (huang, metasd, cascades; paper scale: also spec_bench); a paper the scale keeps "
        "apart (cpu: cascades) runs only when named here",
    ),
    questions: str = typer.Option(
        None,
        "--questions",
        help="Spec-Bench's question.jsonl (paper scale; default data/spec_bench/question.jsonl)",
    ),
    redo: bool = typer.Option(
        False,
        "--redo",
        help="run again the finished steps whose settings (or upstream "
        "steps) differ from this call's, deleting their old "
        "records (without it such a call is refused)",
    ),
) -> None:
    """Every reproduction of a scale end to end (resumable), then `specbench report`; extra Hydra
    overrides apply to every decoding step (eval, collect, cascades). Every step's config is validated
    before anything runs; a finished step whose settings differ is refused unless --redo."""
    from specbench.reproduction import plan

    try:
        if profile is not None:
            if scale is not None and scale != profile:
                raise SpecbenchError(
                    f"--scale {scale} and --profile {profile} disagree (--profile is the old name of "
                    "--scale)",
                    f"drop --profile: --scale {scale}",
                )
            logging.getLogger(__name__).warning(
                "--profile is deprecated: use --scale %s (the same option)", profile
            )
        plan.run(
            root,
            scale=scale or profile or "cpu",
            papers=paper or None,
            extra=list(ctx.args),
            questions=questions or plan.QUESTIONS,
            redo=redo,
        )
    except SpecbenchError as exc:
        _fail(exc)
    except (OSError, RuntimeError) as exc:
        mapped = os_failure(exc, "write the runs elsewhere: --root <a writable directory>")
        if mapped is None:
            raise
        _fail(mapped)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
