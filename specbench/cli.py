"""The ``specbench`` command line: Typer commands that hand their trailing arguments to Hydra.

``specbench eval target=tiny_llama pool=tiny dataset.limit=4`` and ``specbench eval -m
decoding.draft_length=2,4`` behave as in any Hydra app (run directories under ``outputs/``).
"""

from __future__ import annotations

import sys

import typer

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Multi-drafter speculative decoding: collect rewards, train drafter policies, evaluate.")
HYDRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["--help"]}


def _fail(exc: SpecbenchError) -> None:
    typer.secho(f"error: {exc.problem}", fg="red", err=True)
    if exc.fix:
        typer.secho(f"fix:   {exc.fix}", err=True)
    raise SystemExit(2)


def hydra_run(config_name: str, pipeline, args: list[str]) -> None:
    """Run ``pipeline(cfg, output_dir)`` under ``@hydra.main`` with ``args`` as Hydra's argv."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    try:
        path = conf_dir()
    except SpecbenchError as exc:
        _fail(exc)

    @hydra.main(version_base=None, config_path=path, config_name=config_name)
    def _main(cfg):
        try:
            return pipeline(cfg, HydraConfig.get().runtime.output_dir)
        except SpecbenchError as exc:
            _fail(exc)

    sys.argv = [f"specbench {config_name}", *args]
    _main()


@app.command("eval", context_settings=HYDRA_ARGS)
def eval_(ctx: typer.Context) -> None:
    """Timed decoding: speedup, MAT, acceptance and exact match vs autoregressive (Hydra overrides follow)."""
    from specbench.pipelines import evaluate

    hydra_run("eval", evaluate.run, ctx.args)


@app.command("bench", context_settings=HYDRA_ARGS)
def bench_(ctx: typer.Context) -> None:
    """Our decode loop vs Hugging Face generate / assisted generation: seconds, speedups, output match."""
    from specbench.pipelines import bench

    hydra_run("bench", bench.run, ctx.args)


@app.command("cascades", context_settings=HYDRA_ARGS)
def cascades_(ctx: typer.Context) -> None:
    """Speculative cascades: quality vs speedup per (rule, alpha), curves.csv/md and a PNG per task."""
    from specbench.pipelines import cascades

    hydra_run("cascades", cascades.run, ctx.args)


@app.command("collect", context_settings=HYDRA_ARGS)
def collect(ctx: typer.Context) -> None:
    """Offline rewards for the drafter policy: per query, target/drafter outputs, alignment, costs, embedding."""
    from specbench.pipelines import collect as pipeline

    hydra_run("collect", pipeline.run, ctx.args)


@app.command("merge")
def merge(sources: list[str] = typer.Argument(..., help="collect output directories (shards)"),
          out: str = typer.Option(..., "--out", help="directory to write the merged rows.jsonl into")) -> None:
    """Join the rows of several `specbench collect` shards into one directory."""
    from specbench.pipelines import collect as pipeline

    try:
        path = pipeline.merge(sources, out)
    except SpecbenchError as exc:
        _fail(exc)
    typer.echo(f"merged rows: {path}")


@app.command("train-policy", context_settings=HYDRA_ARGS)
def train_policy(ctx: typer.Context) -> None:
    """Train the query -> drafter policy (REINFORCE) on collected rows; writes policy.pt and tables."""
    from specbench.pipelines import train_policy as pipeline

    hydra_run("train_policy", pipeline.run, ctx.args)


@app.command("train-drafter", context_settings=HYDRA_ARGS)
def train_drafter(ctx: typer.Context) -> None:
    """Train a draft head for the target by distillation (EAGLE-1 layout); writes a checkpoint directory."""
    from specbench.pipelines import train_drafter as pipeline

    hydra_run("train_drafter", pipeline.run, ctx.args)


@app.command("report")
def report(root: str = typer.Argument("outputs/reproduce", help="the root that `specbench reproduce` wrote its runs to"),
           out: str = typer.Option(None, "--out", help="report directory (default: ROOT/report)"),
           publish: str = typer.Option(None, "--publish",
                                       help="also copy the report here (docs/reproduction: the README links it)")) -> None:
    """Each paper's tables and figures from the run directories under ROOT, published numbers beside ours,
    and each claim checked (REPORT.md)."""
    from specbench.reproduction import render

    try:
        path = render.write(root, out)
        if publish:
            typer.echo(f"published: {render.publish(path, publish)}")
    except SpecbenchError as exc:
        _fail(exc)


@app.command("reproduce", context_settings=HYDRA_ARGS)
def reproduce(ctx: typer.Context,
              root: str = typer.Option("outputs/reproduce", "--root", help="where the runs and the report go"),
              profile: str = typer.Option("cpu", "--profile", help="cpu: the CPU-scale plan; tiny: a dry run on tiny models"),
              paper: list[str] = typer.Option(None, "--paper", help="only these papers (huang, metasd, cascades)")) -> None:
    """Every CPU-scale reproduction end to end (resumable), then `specbench report`; extra Hydra
    overrides apply to every step."""
    from specbench.reproduction import plan

    try:
        plan.run(root, profile=profile, papers=paper or None, extra=list(ctx.args))
    except SpecbenchError as exc:
        _fail(exc)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
