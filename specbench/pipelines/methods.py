"""Methods of a run: ``methods=[autoregressive, fixed:<arm>, fixed:*, selector, selector:<name>]`` -> selectors (and the
batch-only ``goodput:<arm>`` and ``hf:generate``, which ``pipelines/waves.py`` decodes: ``Method.budget``,
``Method.hf``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from specbench.arms import AGAIN, AUTOREGRESSIVE, GOODPUT, HF_GENERATE
from specbench.configs import canonical_option, load_option
from specbench.errors import SpecbenchError
from specbench.selection import Fixed, FixedTree, Selector
from specbench.selection.budget import PROFILE
from specbench.validate import check_arguments


@dataclass
class Method:
    name: str
    make_selector: Callable[[], Selector]
    config: dict | None = None  # a selector method's instantiated config (replay reseeds it: ``reseeded``)
    # the batch-only methods (``arms.BATCH_ONLY``): ``goodput:<drafter>`` (its drafter, with the batch budget cutting
    # each round's drafts) and ``hf:generate`` (Hugging Face's batched greedy decoding)
    budget: bool = False
    hf: bool = False

    @property
    def drafter(self) -> str:
        """The drafter a ``goodput:`` method drafts with."""
        return self.make_selector().arm if self.budget else AUTOREGRESSIVE

    @property
    def batch_only(self) -> bool:
        return self.budget or self.hf

    def reseeded(self, arms: list[str], offset: int) -> Selector:
        """A new selector of this method whose ``seed`` (and its inner UCB's) is shifted by ``offset``; methods
        without a seed (fixed arms, trees) are deterministic and come back as they are."""
        if not offset or self.config is None:
            return self.make_selector()
        scfg = dict(self.config)
        if "seed" in scfg:
            scfg["seed"] = int(scfg["seed"] or 0) + offset
        if isinstance(scfg.get("ucb"), dict):
            scfg["ucb"] = {**scfg["ucb"], "seed": int(scfg["ucb"].get("seed") or 0) + offset}
        return make_selector(scfg, arms)

    @property
    def seeded(self) -> bool:
        """Whether reseeding changes this method: a selector that draws from its own rng (``Selector.randomized``).
        The others (UCB and its variants, sequential halving, explore-then-commit, trees, fixed arms) are
        deterministic: every seed gives the same rounds."""
        return self.config is not None and bool(getattr(self.make_selector(), "randomized", False))


def parse_methods(
    specs, pool: dict, selector_cfg, root: DictConfig | None = None, costs: Callable[[], dict] | None = None
) -> list[Method]:
    """``autoregressive`` | ``fixed:<arm>`` | ``fixed:*`` (every drafter) | ``tree:<a>+<b>[+...]`` (their drafts
    verified as one token tree each round) | ``tree:*`` (the whole pool's) | ``selector`` (the composed
    ``selector`` config) | ``selector:<name>`` (``conf/selector/<name>.yaml``, so one run can compare
    several selectors; ``root.selector_overrides`` is merged into each, but for its entries ``<name>: {...}``,
    which go to that option alone; a selector whose ``costs`` is ``profile`` gets ``costs()``, the start-up cost
    profile, measured once) | ``again:<spec>`` (the methods of
    ``<spec>`` run a second time, named ``again:<name>``: an A/A pair that measures run-to-run noise). The
    autoregressive baseline is always first."""
    arms = list(pool)
    names: list[str] = [AUTOREGRESSIVE]
    methods = [Method(AUTOREGRESSIVE, lambda: Fixed(arms, AUTOREGRESSIVE))]
    for spec in specs or []:
        spec = str(spec)
        if spec == AUTOREGRESSIVE:
            continue
        if spec.startswith(AGAIN):
            new = again_methods(spec, pool, selector_cfg, root, costs)
        elif spec == "selector" or spec.startswith("selector:"):
            new = selector_methods(spec, arms, selector_cfg, root, costs)
        elif spec.startswith("fixed:"):
            arm = spec.split(":", 1)[1]
            chosen = [a for a in arms if a != AUTOREGRESSIVE] if arm == "*" else [arm]
            for a in chosen:
                Fixed(arms, a)  # validates the arm name now, before any decoding
            new = [Method(f"fixed:{a}", lambda a=a: Fixed(arms, a)) for a in chosen]
        elif spec.startswith("tree:"):
            new = [tree_method(spec, arms)]
        elif spec.startswith(GOODPUT):  # batch-only (pipelines/waves.py): the drafter under the batch budget
            arm = spec[len(GOODPUT) :]
            Fixed(arms, arm)  # validates the drafter's name now
            new = [Method(spec, lambda a=arm: Fixed(arms, a), budget=True)]
        elif spec == HF_GENERATE:  # batch-only: Hugging Face's batched greedy decoding
            new = [Method(spec, lambda: Fixed(arms, AUTOREGRESSIVE), hf=True)]
        else:
            raise SpecbenchError(
                f"unknown method '{spec}'",
                "use autoregressive, fixed:<drafter>, fixed:*, tree:<a>+<b>, tree:*, selector, "
                f"selector:<name>, again:<method>, or (at decoding.batch_size above 1) {GOODPUT}<drafter> or "
                f"{HF_GENERATE} in methods",
            )
        for m in new:
            if m.name not in names:
                names.append(m.name)
                methods.append(m)
    return methods


def again_methods(spec: str, pool: dict, selector_cfg, root, costs) -> list[Method]:
    """``again:<spec>``: the methods of ``<spec>`` under the names ``again:<name>`` (an A/A pair)."""
    inner = spec[len(AGAIN) :]
    if not inner or inner.startswith(AGAIN):
        raise SpecbenchError(
            f"method '{spec}' names no method to run again",
            "use again:<method>, e.g. again:autoregressive or again:fixed:prompt_lookup",
        )
    found = parse_methods([inner], pool, selector_cfg, root, costs)
    return [
        Method(AGAIN + m.name, m.make_selector, m.config, m.budget, m.hf)
        for m in found
        if m.name != AUTOREGRESSIVE or inner == AUTOREGRESSIVE
    ]


def selector_methods(spec: str, arms: list[str], selector_cfg, root, costs) -> list[Method]:
    """``selector`` (the composed config; none when there is none) or ``selector:<name>`` (its option with
    ``selector_overrides`` merged), validated now; ``costs: profile`` replaced by ``costs()``."""
    # one config per spec: a selector:<name> before a plain `selector` must not stand in for the composed one
    chosen_cfg = selector_cfg
    if spec.startswith("selector:"):
        option = canonical_option("selector", spec.split(":", 1)[1])
        chosen_cfg = load_selector_config(option, root)
        extra = (root.get("selector_overrides") if root is not None else None) or {}
        # keys naming a selector option with a mapping are that option's own overrides; the rest apply to all
        common = {k: v for k, v in extra.items() if not isinstance(v, Mapping)}
        own = extra.get(option) if isinstance(extra.get(option), Mapping) else {}
        for more in (common, own):
            if more:
                chosen_cfg = OmegaConf.merge(chosen_cfg, more)
    elif chosen_cfg is None:
        return []
    name = str(chosen_cfg.get("name") or chosen_cfg._target_.rsplit(".", 1)[-1].lower())
    scfg = {k: v for k, v in OmegaConf.to_container(chosen_cfg, resolve=True).items() if k != "name"}
    if scfg.get("costs") == PROFILE and costs is not None:
        scfg["costs"] = costs()
    make_selector(scfg, arms)  # validates the config now, before any decoding
    return [Method(name, lambda scfg=scfg: make_selector(scfg, arms), scfg)]


def tree_method(spec: str, arms: list[str]) -> Method:
    """``tree:<a>+<b>`` (or ``tree:*``, the whole pool): their drafts verified as one token tree each round."""
    listed = spec.split(":", 1)[1]
    members = (
        [a for a in arms if a != AUTOREGRESSIVE]
        if listed == "*"
        else [m.strip() for m in listed.split("+") if m.strip()]
    )
    FixedTree(arms, members)  # validates the members now, before any decoding
    name = "tree:*" if listed == "*" else "tree:" + "+".join(members)
    return Method(name, lambda members=members: FixedTree(arms, members))


def make_selector(scfg: dict, arms: list[str]) -> Selector:
    """Instantiate a selector config, its values checked first against what its class declares
    (``validate.check_arguments``: a selector of ``methods=`` is not in the validated config); a ``SpecbenchError``
    inside surfaces as itself."""
    with contextlib.suppress(ImportError):  # a _target_ that does not import: instantiate names it below
        check_arguments(get_object(str(scfg.get("_target_"))), scfg, "selector")
    try:
        return instantiate(scfg, arms=arms)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, SpecbenchError):
            raise exc.__cause__ from None
        raise SpecbenchError(
            f"could not build selector '{scfg.get('_target_')}': {exc}",
            "check its keys against conf/selector/",
        ) from exc


def load_selector_config(name: str, root: DictConfig | None = None):
    """``conf/selector/<name>.yaml``, placed under ``root`` (the run's config) so that its
    interpolations (``${policy.checkpoint}``) resolve as they would for ``selector=<name>``."""
    loaded = load_option("selector", name)  # an unknown name is refused there, the options listed
    if root is None:
        return loaded
    ctx = OmegaConf.create(
        {k: v for k, v in OmegaConf.to_container(root, resolve=False).items() if k != "selector"}
    )
    ctx.selector = loaded
    return ctx.selector


def check_methods(cfg: DictConfig) -> None:
    """The methods of ``cfg`` against its pool's drafter names, before any model loads (a typo in a fixed arm, a tree
    member or a router's fallback is answered in about two seconds, not after the target loads): the command line
    calls it for every config that holds ``methods`` and a pool, before it imports the pipeline. Skipped where a
    policy plays (its pool may be the one kept in its checkpoint)."""
    from specbench.selection.base import context_aware

    methods = [str(m) for m in (cfg.get("methods") or [])]
    if "selector:policy" in methods or (
        "selector" in methods and context_aware(OmegaConf.select(cfg, "selector._target_", default=None))
    ):
        return
    drafters = (cfg.get("pool") or {}).get("drafters") or {}
    names = [AUTOREGRESSIVE, *drafters]
    methods = parse_methods(
        cfg.methods,
        {name: None for name in names},
        cfg.get("selector"),
        cfg,
        lambda: {"verify": [1.0, 0.0], "draft": {}},
    )  # costs: profile is measured later
    check_chains(cfg, methods, drafters)


def check_chains(cfg: DictConfig, methods: list[Method], drafters: Mapping) -> None:
    """A sampled run whose ``decoding.acceptance`` is not ``full`` verifies chains only: a method that may play a
    token tree (a tree selector, a plan, one of ``drafters`` whose config drafts trees) is refused by name."""
    dec = cfg.get("decoding") or {}
    rule = str(dec.get("acceptance", "full"))
    if rule == "full" or float(dec.get("temperature", 0.0) or 0.0) == 0.0:
        return
    tree_drafters = {n for n, d in drafters.items() if isinstance(d, Mapping | DictConfig) and d.get("tree")}
    for m in methods:
        if m.hf:
            continue
        selector = m.make_selector()
        trees = sorted(set(selector.playable()) & tree_drafters)
        if selector.trees or selector.plans or trees:
            what = f"its drafters {', '.join(trees)} draft trees" if trees else "it verifies token trees"
            raise SpecbenchError(
                f"method {m.name}: decoding.acceptance={rule} is defined for chains, and {what}",
                "use decoding.acceptance=full for this method, or set the drafters' tree to null (chains)",
            )
