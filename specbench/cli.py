"""The ``specbench`` command line: Typer commands that hand their trailing arguments to Hydra.

``specbench eval target=tiny_llama pool=tiny dataset.limit=4`` and ``specbench eval -m
decoding.draft_length=2,4`` behave as in any Hydra app (run directories under ``outputs/``). The bridge to Hydra and
the error/fix exit every command shares are in ``specbench.bridge``.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import typer

from specbench.bridge import HYDRA_ARGS, PATH_ERRORS, check_output_directory, fail, hydra_run, os_failure
from specbench.configs import config_help
from specbench.errors import SpecbenchError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Multi-drafter speculative decoding: collect rewards, train drafter policies, evaluate.",
)

__all__ = ["app", "check_output_directory", "main", "os_failure"]


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
        fail(exc)
    except OSError as exc:  # a write that fails late: full disk, a read-only mount seen only by writes
        if exc.errno not in PATH_ERRORS + (errno.EEXIST,):  # PATH_ERRORS holds ENOSPC and EDQUOT
            raise
        fail(
            SpecbenchError(
                f"cannot write the merged rows into {out}: {exc.strerror}"
                + (f": {exc.filename}" if exc.filename else ""),
                "pass a writable directory: --out <a new or writable directory>",
            )
        )
    typer.echo(f"merged rows: {path}")


@app.command("train-policy", context_settings=HYDRA_ARGS, epilog=config_help("train_policy"))
def train_policy(ctx: typer.Context) -> None:
    """Train the query -> drafter policy (REINFORCE) on collected rows; writes policy.pt and tables."""
    hydra_run("train_policy", "train_policy", ctx.args)


@app.command("train-drafter", context_settings=HYDRA_ARGS, epilog=config_help("train_drafter"))
def train_drafter(ctx: typer.Context) -> None:
    """Train a draft head for the target by distillation (EAGLE-1 layout); writes a checkpoint directory."""
    hydra_run("train_drafter", "train_drafter", ctx.args)


OUTSIDE_HELP = (
    "runs outside the plan, repeatable: DIR (the replays of `make trace-seed` or `trace-mixed`), routing=DIR "
    "(`make routing-seed`'s prompt-level comparison): their verdicts join the report; robustness=DIR (replays over "
    "other arms): shown, not judged"
)


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
    long_horizon: list[str] = typer.Option(None, "--long-horizon", help=OUTSIDE_HELP),
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
    from specbench.reproduction import readme as readme_blocks
    from specbench.reproduction import render

    try:
        if readme and not publish:
            raise SpecbenchError(
                "--readme needs --publish (the README links the published copy)",
                "add --publish docs/reproduction",
            )
        if readme:  # checked before anything is written or published
            readme_blocks.check_readme(Path(readme))
        outside = render.Outside.parse(long_horizon)
        path = render.write(root, out, layout, long_horizon=outside, against=against, one_commit=one_commit)
        if publish:
            typer.echo(f"published: {readme_blocks.publish(path, publish)}")
        if readme:
            links = os.path.relpath(Path(publish).resolve(), Path(readme).resolve().parent)
            typer.echo(f"included in: {readme_blocks.include_in_readme(path, Path(readme), links)}")
    except SpecbenchError as exc:
        fail(exc)
    except OSError as exc:  # an unwritable --out / --publish, a file where a directory must go, a full disk
        mapped = os_failure(exc, "write the report elsewhere: --out <a writable directory>")
        if mapped is None:
            raise
        fail(mapped)


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
        check_no_report_options(list(ctx.args))
        plan.run(
            root,
            scale=scale_of(scale, profile),
            papers=paper or None,
            extra=list(ctx.args),
            questions=questions or plan.QUESTIONS,
            redo=redo,
        )
    except SpecbenchError as exc:
        fail(exc)
    except (OSError, RuntimeError) as exc:
        mapped = os_failure(exc, "write the runs elsewhere: --root <a writable directory>")
        if mapped is None:
            raise
        fail(mapped)


REPORT_OPTIONS = ("--long-horizon", "--against", "--one-commit", "--publish", "--readme", "--layout", "--out")


def check_no_report_options(args: list[str]) -> None:
    """An option of `specbench report` given to `reproduce` (whose trailing arguments are Hydra overrides of its
    steps) is refused naming the command it belongs to, not read as an override of the first step."""
    given = [a for a in args if a.split("=", 1)[0] in REPORT_OPTIONS]
    if given:
        name = given[0].split("=", 1)[0]
        raise SpecbenchError(
            f"{name} is an option of `specbench report`, not of `specbench reproduce` (whose trailing arguments are "
            "Hydra overrides of its steps)",
            f"run the plan, then its report: `specbench report ROOT {name} ...` (reproduce ends with the report "
            "without it; make report passes the replays and the second run)",
        )


def scale_of(scale: str | None, profile: str | None) -> str:
    """The scale ``reproduce`` runs: ``--scale``, else the deprecated ``--profile`` (warned), else cpu; the two
    options naming different scales are refused."""
    if profile is None:
        return scale or "cpu"
    if scale is not None and scale != profile:
        raise SpecbenchError(
            f"--scale {scale} and --profile {profile} disagree (--profile is the old name of --scale)",
            f"drop --profile: --scale {scale}",
        )
    logging.getLogger(__name__).warning("--profile is deprecated: use --scale %s (the same option)", profile)
    return profile


def main() -> None:
    app()


if __name__ == "__main__":
    main()
