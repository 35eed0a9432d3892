"""Where the Hydra configs live (the repository's top-level ``conf/``), and reading one option of a
config group the way Hydra composes it (``load_option``) for code that picks options by name at run
time (``methods: [selector:ucb, ...]``) rather than through Hydra's command line."""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from specbench.errors import SpecbenchError


def conf_dir() -> str:
    path = Path(os.environ.get("SPECBENCH_CONF", Path(__file__).resolve().parent.parent / "conf"))
    if not (path / "eval.yaml").exists():
        raise SpecbenchError(f"config directory {path} not found",
                             "install specbench from its repository with `pip install -e .`, or set SPECBENCH_CONF")
    return str(path)


def group_options(group: str) -> list[str]:
    """The options of a config group: its own ``*.yaml`` files, not those of subfolders (such as
    ``selector/base/``, which hold configs the options include, not options)."""
    return sorted(p.stem for p in (Path(conf_dir()) / group).glob("*.yaml") if p.is_file())


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
    lines = [f"{group}: " + ", ".join(o + ("*" if o == chosen[group] else "") for o in group_options(group))
             for group in chosen]
    if experiments and "experiment" not in chosen:
        lines.append("experiment: " + ", ".join(group_options("experiment")))
    keys = (f"Any key of conf/{config_name}.yaml or of a group can be set too (KEY=VALUE); add --cfg job to print "
            "the composed config instead of running it.")
    if not lines:
        return keys
    return ("Config groups (GROUP=OPTION on the command line, * the default; experiment=NAME, or +experiment=NAME, "
            "applies a preset):\n"
            + "\n".join(f"  {line}" for line in lines) + "\n\n" + keys)


def hydra_overrides(overrides) -> list[str]:
    """Command-line overrides as Hydra takes them: ``+experiment=NAME`` (the spelling of presets before the root
    configs listed ``experiment: null`` in their defaults) becomes ``experiment=NAME``, so both select the preset."""
    return [re.sub(r"^\+{1,2}experiment=", "experiment=", str(o)) for o in overrides]


_PACKAGE_HEADER = re.compile(r"#\s*@package\s+(\S+)")
_COMMANDS_HEADER = re.compile(r"#\s*@commands\s+(\S+)")


def experiment_commands(name: str) -> list[str] | None:
    """The commands an experiment is written for: the ``# @commands a,b`` line of the header of
    ``conf/experiment/<name>.yaml`` (a Hydra config header, as ``# @package`` is: it declares
    without adding a key to the composed config). None: the file declares none, or there is no such file."""
    path = Path(conf_dir()) / "experiment" / f"{name}.yaml"
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return None
        match = _COMMANDS_HEADER.match(line)
        if match:
            return [c for c in match.group(1).split(",") if c]
    return None


def check_experiment_command(name: str | None, config_name: str) -> None:
    """Refuse an experiment under a command it is not written for (``specbench eval
    experiment=cascades_cpu`` would otherwise run a plain eval with the cascade keys ignored)."""
    if not name:
        return
    commands = experiment_commands(name)
    command = config_name.replace("_", "-")
    if commands and command not in commands:
        runs = " or ".join(f"`specbench {c} experiment={name} ...`" for c in commands)
        raise SpecbenchError(f"experiment '{name}' is written for {', '.join(commands)}, not {command} "
                             f"(conf/experiment/{name}.yaml, its '# @commands' line)", f"run {runs}")


def load_option(group: str, name: str) -> DictConfig:
    """``conf/<group>/<name>.yaml`` with its defaults list applied: what Hydra composes under
    ``<group>`` for ``<group>=<name>``, without composing a whole config.

    As in Hydra, a defaults entry names a config relative to the including config's group (``/`` at
    the start: relative to ``conf/``), ``GROUP: OPTION`` picks an option of a group, ``@PACKAGE``
    places it relative to the including config's package (``_here_``: at it), and the configs are
    merged in list order with the including config's own content at ``_self_`` (at the end when the
    list has no ``_self_``). Not supported (an error): ``override`` entries, interpolated option
    names, and configs that would land outside ``<group>`` (``_global_`` packages)."""
    group = group.strip("/")
    path = Path(conf_dir()) / group / f"{name}.yaml"
    if not path.is_file():
        options = group_options(group)
        raise SpecbenchError(f"no {group} config named '{name}'",
                             f"use one of: {', '.join(options)}" if options else f"add conf/{group}/{name}.yaml")
    header = _package_header(path)
    package = _absolute(header) if header is not None else group.replace("/", ".")
    return _compose(f"{group}/{name}", package, root=package, seen=())


def _package_header(path: Path) -> str | None:
    """The ``# @package`` of a config file's leading comment block (None: none)."""
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return None
        match = _PACKAGE_HEADER.match(line)
        if match:
            return match.group(1)
    return None


def _absolute(package: str) -> str:
    """A package with Hydra's ``_global_`` prefixes resolved to an absolute dotted path."""
    idx = package.rfind("_global_")
    if idx == -1:
        return package
    return package[idx + len("_global_") + 1:]


def _join(parent: str, package: str) -> str:
    """Hydra's final package: ``package`` relative to ``parent`` (``_global_`` makes it absolute)."""
    joined = package if not parent else (parent if not package else f"{parent}.{package}")
    return _absolute(joined)


def _compose(config_path: str, package: str, root: str, seen: tuple[str, ...]) -> DictConfig:
    """The config at ``conf/<config_path>.yaml`` (absolute package ``package``) with its defaults
    list applied, returned as the node at ``root`` (the package of the option being loaded)."""
    if config_path in seen:
        raise SpecbenchError(f"defaults of conf/{config_path}.yaml include themselves ({' -> '.join(seen)})",
                             "remove the cycle from the defaults lists")
    seen = (*seen, config_path)
    file = Path(conf_dir()) / f"{config_path}.yaml"
    loaded = OmegaConf.load(file)
    if not isinstance(loaded, DictConfig):
        raise SpecbenchError(f"conf/{config_path}.yaml is not a mapping", "a config file must hold keys")
    defaults = loaded.pop("defaults", None)
    own = _place(loaded, package, root, config_path)
    if defaults is None:
        return own
    if not isinstance(defaults, ListConfig):
        raise SpecbenchError(f"conf/{config_path}.yaml: defaults must be a list", "write `defaults: [...]`")

    base_dir = config_path.rsplit("/", 1)[0] if "/" in config_path else ""
    parts: list[DictConfig] = []
    has_self = False
    for entry in defaults:
        if entry == "_self_":
            has_self = True
            parts.append(own)
            continue
        for child_path, child_package in _entry_configs(entry, base_dir, package, config_path):
            parts.append(_compose(child_path, child_package, root, seen))
    if not has_self:
        parts.append(own)
    return OmegaConf.merge(*parts) if parts else own


def _entry_configs(entry, base_dir: str, parent_package: str, where: str) -> list[tuple[str, str]]:
    """The (config path, absolute package) pairs one defaults entry stands for."""
    def fail(why: str) -> SpecbenchError:
        return SpecbenchError(f"conf/{where}.yaml: defaults entry {entry!r}: {why}",
                              "load it through Hydra (compose) instead of specbench.configs.load_option")

    optional = False
    if isinstance(entry, str):
        key, options = entry, None
    elif isinstance(entry, DictConfig) and len(entry) == 1:
        key, options = next(iter(entry.items_ex(resolve=False)))
        key = str(key)
        if key.startswith("optional "):
            optional, key = True, key[len("optional "):].strip()
        if key.startswith("override "):
            raise fail("override entries are not supported")
        if options is None:
            return []
        if isinstance(options, ListConfig):
            options = [str(o) for o in options]
        else:
            options = [str(options)]
        if any("${" in o for o in options):
            raise fail("interpolated option names are not supported")
    else:
        raise fail("not a config path or a `GROUP: OPTION` pair")

    path, at, package = key.partition("@")
    package = ("" if package == "_here_" else package) if at else None
    configs = [path] if options is None else [f"{path}/{o}" for o in options]
    pairs = []
    for config in configs:
        absolute = config.startswith("/")
        rel = config.lstrip("/")
        full = rel if absolute or not base_dir else f"{base_dir}/{rel}"
        file = Path(conf_dir()) / f"{full}.yaml"
        if not file.is_file():
            if optional:
                continue
            raise fail(f"conf/{full}.yaml not found")
        if package is not None:
            pkg = package
        else:
            header = _package_header(file)
            # no @PACKAGE: the config's header, else its group path as written in the entry
            pkg = f"_global_.{header}" if header is not None and not header.startswith("_global_") else header
            if pkg is None:
                pkg = rel.rsplit("/", 1)[0].replace("/", ".") if "/" in rel else ""
        pairs.append((full, _join(parent_package, pkg)))
    return pairs


def _place(node: DictConfig, package: str, root: str, where: str) -> DictConfig:
    """``node`` (content for absolute ``package``) as a config relative to ``root``."""
    if package == root:
        return node
    if root and not package.startswith(f"{root}."):
        raise SpecbenchError(f"conf/{where}.yaml lands at '{package or '<the top level>'}', outside '{root}'",
                             "load it through Hydra (compose) instead of specbench.configs.load_option")
    rel = package[len(root) + 1:] if root else package
    for key in reversed(rel.split(".")):
        node = OmegaConf.create({key: node})
    return node


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
        return SpecbenchError(f"cannot read the override: {' '.join(x for x in lines if not x.startswith('See '))}",
                              "write each override as KEY=VALUE (a list: KEY=[a,b]; quote values with spaces or "
                              "brackets); see https://hydra.cc/docs/advanced/override_grammar/basic/")
    cause = exc.__cause__
    quoted = re.search(r"'([^']+)'", lines[0]) if lines else None
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and quoted:  # a key the config does not have
        parent = getattr(cause, "parent_node", None)
        keys = [str(k) for k in parent.keys() if k != "hydra"] if hasattr(parent, "keys") else []
        where = f" ({cause.full_key.rpartition('.')[0] or 'the config'} has: {', '.join(keys)})" if keys else ""
        return SpecbenchError(f"unknown config key '{quoted.group(1)}'{where}",
                              f"check the spelling ({helps}); to add a new key on purpose, prefix it with +")
    problem = lines[0].rstrip(".") if lines else type(exc).__name__
    fix = " ".join(lines[1:]) or helps
    return SpecbenchError(problem[:1].lower() + problem[1:], fix[:1].lower() + fix[1:])
