"""Recapture the regression fixture one scenario at a time, showing what changed (only on purpose).

    python -m tests.regression.capture --scenario metasd_cpu/eval [--scenario ...]
    python -m tests.regression.capture --new      # only the scenarios the fixture lacks
    python -m tests.regression.capture --all      # every scenario (a change of results must be explained)

The fixture's ``_meta`` records the library versions of the last capture.
"""

import argparse
import difflib
import json

from specbench.pipelines.profile import cpu_name
from tests.regression.scenarios import FIXTURE, capture, sampled, unique_scenarios, versions


def diff(key: str, old, new) -> str:
    a = json.dumps(old, indent=1, sort_keys=True).splitlines() if old is not None else []
    b = json.dumps(new, indent=1, sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(a, b, f"fixture {key}", f"now {key}", lineterm="", n=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", default=[], help="a scenario key (repeatable)")
    ap.add_argument("--new", action="store_true", help="capture the scenarios the fixture does not have")
    ap.add_argument("--all", action="store_true", help="recapture every scenario")
    args = ap.parse_args(argv)
    recorded = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
    every = list(unique_scenarios())
    unknown = [k for k in args.scenario if k not in every]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; the scenarios are: {', '.join(every)}")
    keys = (
        every if args.all else args.scenario + ([k for k in every if k not in recorded] if args.new else [])
    )
    if not keys:
        raise SystemExit("nothing to capture: name --scenario KEY, --new or --all")
    got = capture(keys=keys)
    for key in keys:
        change = diff(key, recorded.get(key), got[key])
        print(change if change else f"{key}: unchanged")
        recorded[key] = got[key]
    for key in [k for k in recorded if not k.startswith("_") and k not in every]:
        print(f"{key}: no longer a scenario, dropped")
        del recorded[key]
    recorded["_meta"] = versions()
    if any(
        sampled(k) for k in keys
    ):  # sampled scenarios are compared only on the CPU model they were captured on
        recorded["_sampled_cpu"] = cpu_name()
    FIXTURE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} ({len(keys)} scenario(s) captured)")


if __name__ == "__main__":
    main()
