"""EAGLE draft heads, both layouts in one package: ``head.py`` (the EAGLE-1 head module, ``HeadLogits``, the family
config; shared with the training wing and the small drafter), ``eagle1.py`` (the ``eagle`` drafter kind: EAGLE-1
checkpoints, drafting on the target's features, side observations) and ``eagle3.py`` (the ``eagle3`` kind: EAGLE-3 and
``speculators`` checkpoints, on top of ``eagle1``'s drafter). A head's checkpoint files are ``drafters/head_files.py``
and the shipped heads ``drafters/shipped.py`` (shared with the small drafter).

The EAGLE-1 names are importable from the package itself: pool configs and stored run settings name
``specbench.drafters.eagle.build``. EAGLE-3's builder is ``specbench.drafters.eagle.eagle3.build``.
"""

from specbench.drafters.eagle.eagle1 import EagleDrafter, HeadObservation, build, head_cost, load_head
from specbench.drafters.eagle.head import EagleHead, HeadLogits, family_config

__all__ = [
    "EagleDrafter",
    "EagleHead",
    "HeadLogits",
    "HeadObservation",
    "build",
    "family_config",
    "head_cost",
    "load_head",
]
