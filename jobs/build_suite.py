"""Write a copy of a suite whose workers install one sglang build (the Ray runtime_env's pip).

    python jobs/build_suite.py SUITE OUT REQUIREMENT

Used by the nightly (a ref of sglang) and PR (refs/pull/N/head) workflows; the name keeps the
suite's, so history and MLflow stay the suite's own.
"""

from __future__ import annotations

import sys

import yaml


def main(source: str, target: str, requirement: str) -> int:
    with open(source) as handle:
        suite = yaml.safe_load(handle)
    cluster = suite.setdefault("cluster", {})
    runtime_env = dict(cluster.get("runtime_env") or {})
    runtime_env["pip"] = [requirement]
    cluster["runtime_env"] = runtime_env
    with open(target, "w") as handle:
        yaml.safe_dump(suite, handle, sort_keys=False)
    print(f"{target}: {suite['suite']} with workers on {requirement}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
