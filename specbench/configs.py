"""Where the Hydra configs live (the repository's top-level ``conf/``), the groups' options, and reading one
option of a group through Hydra's compose API (``load_option``) for code that picks options by name at run
time (``methods: [selector:ucb, ...]``) rather than through Hydra's command line."""

from __future__ import annotations

import functools
import os
import re
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.errors import SpecbenchError


def conf_dir() -> str:
    path = Path(os.environ.get("SPECBENCH_CONF", Path(__file__).resolve().parent.parent / "conf"))
    if not (path / "eval.yaml").exists():
        raise SpecbenchError(
            f"config directory {path} not found",
            "install specbench from its repository with `pip install -e .`, or set SPECBENCH_CONF",
        )
    return str(path)


def group_options(group: str) -> list[str]:
    """The options of a config group: its own ``*.yaml`` files, not those of subfolders (such as
    ``selector/base/``, which hold configs the options include, not options), nor the older names ``aliases``
    keeps."""
    renamed = aliases(group)
    return [name for name in _files(group) if name not in renamed]


def _files(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(conf_dir()) / group).glob("*.yaml") if p.is_file())


def aliases(group: str) -> dict[str, str]:
    """``{older name: option}`` of a group: a config kept under its older name (``selector/etc.yaml``, now
    ``explore_commit``) holds nothing but a defaults list naming one other option of its group (and ``_self_``),
    so ``selector=etc`` and ``methods: [selector:etc]`` compose the renamed option."""
    return _aliases(conf_dir(), group)


@functools.cache
def _aliases(root: str, group: str) -> dict[str, str]:
    found = {}
    for path in sorted((Path(root) / group).glob("*.yaml")):
        node = OmegaConf.load(path)
        names = [str(d) for d in node.get("defaults") or [] if isinstance(d, str) and d != "_self_"]
        if isinstance(node, DictConfig) and set(node) == {"defaults"} and len(names) == 1:
            found[path.stem] = names[0]
    return found


def canonical_option(group: str, name: str) -> str:
    """``name``, or the option an older name of ``group`` now stands for (``aliases``)."""
    return aliases(group).get(name, name)


def config_help(config_name: str, experiments: bool = False) -> str:
    """The config groups a command composes (from the defaults list of ``conf/<config_name>.yaml``)
    with their options, the default marked ``*``: the epilog of the command's ``--help``."""
    try:
        defaults = OmegaConf.load(Path(conf_dir()) / f"{config_name}.yaml").get("defaults") or []
    except (SpecbenchError, OSError):
        return ""
    chosen = {}
    for entry in defaults:
        if isinstance(entry, DictConfig) and len(entry) == 1:
            group, option = next(iter(entry.items()))
            if not str(group).startswith(("hydra", "override ")):
                chosen[str(group)] = None if option is None else str(option)
    lines = [
        f"{group}: " + ", ".join(o + ("*" if o == chosen[group] else "") for o in group_options(group))
        for group in chosen
    ]
    if experiments and "experiment" not in chosen:
        lines.append("experiment: " + ", ".join(group_options("experiment")))
    keys = (
        f"Any key of conf/{config_name}.yaml or of a group can be set too (KEY=VALUE); add --cfg job to print "
        "the composed config instead of running it."
    )
    if not lines:
        return keys
    return (
        "Config groups (GROUP=OPTION on the command line, * the default; experiment=NAME, or +experiment=NAME, "
        "applies a preset):\n" + "\n".join(f"  {line}" for line in lines) + "\n\n" + keys
    )


EXPERIMENT = re.compile(r"^\+{0,2}experiment=")


def hydra_overrides(overrides) -> list[str]:
    """Command-line overrides as Hydra takes them: ``+experiment=NAME`` (the spelling of presets before the root
    configs listed ``experiment: null`` in their defaults) becomes ``experiment=NAME``, so both select the preset;
    ``experiment=null`` (every root's default) is dropped. Two experiments are refused: Hydra would keep the last
    without a word."""
    out, chosen = [], []
    for o in map(str, overrides):
        if EXPERIMENT.match(o):
            name = EXPERIMENT.sub("", o)
            if name in ("null", "None", ""):
                continue
            chosen.append(name)
            o = f"experiment={name}"
        out.append(o)
    if len(chosen) > 1:
        raise SpecbenchError(
            f"{len(chosen)} experiments given ({', '.join(chosen)}): a run takes one preset, and "
            "Hydra would keep only the last without a word",
            f"keep one experiment=NAME and give the other's settings as overrides (conf/experiment/"
            f"{chosen[0]}.yaml shows them)",
        )
    return out


def experiment_commands(name: str) -> list[str] | None:
    """The commands an experiment is written for: the ``commands`` key of ``conf/experiment/<name>.yaml``, read as
    data (the file alone, before anything is composed). None: the file declares none, or there is no such file."""
    from omegaconf import OmegaConf

    path = Path(conf_dir()) / "experiment" / f"{name}.yaml"
    if not path.is_file():
        return None
    commands = OmegaConf.load(path).get("commands")
    return [str(c) for c in commands] if commands else None


def check_experiment_command(name: str | None, config_name: str) -> None:
    """Refuse an experiment under a command it is not written for (``specbench eval
    experiment=cascades_cpu`` would otherwise run a plain eval with the cascade keys ignored)."""
    if not name:
        return
    commands = experiment_commands(name)
    command = config_name.replace("_", "-")
    if commands and command not in commands:
        runs = " or ".join(f"`specbench {c} experiment={name} ...`" for c in commands)
        raise SpecbenchError(
            f"experiment '{name}' is written for {', '.join(commands)}, not {command} "
            f"(conf/experiment/{name}.yaml, its commands key)",
            f"run {runs}",
        )


@contextmanager
def composing():
    """Hydra's compose API over ``conf/``, whatever Hydra holds now: inside a running Hydra app (the CLI), a
    test's ``initialize_config_dir`` or none. The global Hydra state is set aside and given back after."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base=None):
            yield
    finally:
        restore_gh_from_backup(backup)


def load_option(group: str, name: str) -> DictConfig:
    """``conf/<group>/<name>.yaml`` as Hydra composes it for ``<group>=<name>`` (its defaults list applied), the
    ``<group>`` node alone: for code that picks options by name at run time (``methods: [selector:ucb]``)."""
    from hydra import compose
    from hydra.errors import HydraException

    group = group.strip("/")
    options = group_options(group)
    if name not in options and name not in aliases(group):
        raise SpecbenchError(
            f"no {group} config named '{name}'",
            f"use one of: {', '.join(options)}" if options else f"add conf/{group}/{name}.yaml",
        )
    try:
        with composing():
            cfg = compose(config_name=None, overrides=[f"+{group}={name}"])
    except HydraException as exc:
        raise hydra_error(exc, "eval") from exc
    node = OmegaConf.select(cfg, group.replace("/", "."))
    if not isinstance(node, DictConfig):
        raise SpecbenchError(
            f"conf/{group}/{name}.yaml does not land at '{group.replace('/', '.')}' (its # @package "
            "header moves it)",
            f"drop the header, or set the option with {group}={name} instead",
        )
    return OmegaConf.create(
        OmegaConf.to_container(node, resolve=False)
    )  # a plain (not struct) copy of its own


def hydra_error(exc: Exception, config_name: str) -> SpecbenchError:
    """One of Hydra's composition or override-parsing errors as error/fix lines."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    command = config_name.replace("_", "-")
    helps = f"`specbench {command} --help` lists the config groups and their options"
    if isinstance(exc, MissingConfigException) and exc.options is not None:
        group, _, name = exc.missing_cfg_file.rpartition("/")
        return SpecbenchError(f"no {group} config named '{name}'", f"use one of: {', '.join(exc.options)}")
    lines = [line.strip() for line in str(exc).split("Config search path:")[0].splitlines() if line.strip()]
    if isinstance(exc, OverrideParseException):
        return SpecbenchError(
            f"cannot read the override: {' '.join(x for x in lines if not x.startswith('See '))}",
            "write each override as KEY=VALUE (a list: KEY=[a,b]; quote values with spaces, brackets "
            "or letters outside ASCII, e.g. \"name='k\u00f6pf'\"); see "
            "https://hydra.cc/docs/advanced/override_grammar/basic/",
        )
    cause = exc.__cause__
    quoted = re.search(r"'([^']+)'", lines[0]) if lines else None
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and quoted:  # a key the config does not have
        parent = getattr(cause, "parent_node", None)
        keys = [str(k) for k in parent if k != "hydra"] if hasattr(parent, "keys") else []
        where = (
            f" ({cause.full_key.rpartition('.')[0] or 'the config'} has: {', '.join(keys)})" if keys else ""
        )
        return SpecbenchError(
            f"unknown config key '{quoted.group(1)}'{where}",
            f"check the spelling ({helps}); to add a new key on purpose, prefix it with +",
        )
    problem = lines[0].rstrip(".") if lines else type(exc).__name__
    fix = " ".join(lines[1:]) or helps
    return SpecbenchError(problem[:1].lower() + problem[1:], fix[:1].lower() + fix[1:])
