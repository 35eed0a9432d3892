"""Rewrite the regression fixture (only when a change of results is intended and explained)."""

import json

from tests.regression.scenarios import FIXTURE, capture

if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(capture(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
