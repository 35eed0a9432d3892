"""``fixed``: the same arm for every round of every query (``autoregressive`` is the baseline)."""

from __future__ import annotations

from typing import Annotated

from specbench.errors import SpecbenchError
from specbench.selection.base import Selector
from specbench.validate import text


class Fixed(Selector):
    def __init__(self, arms: list[str], arm: Annotated[str, text()]):
        super().__init__(arms)
        if arm not in self.arms:
            raise SpecbenchError(
                f"fixed selector: no arm named '{arm}' in the pool", f"use one of: {', '.join(self.arms)}"
            )
        self.arm = arm

    def select(self) -> str:
        return self.arm

    def playable(self) -> list[str]:
        return [self.arm]
