"""A 16-cell mixed-tp run on a simulated 2-node Ray cluster (4 GPUs each), through the sglang engine
and the fake `sglang` package, with one Ray worker killed mid-cell. Runs in its own process (it owns
a Ray cluster) and prints one JSON object for tests/engine/test_cluster.py to check.

    python -m tests.scenarios.cluster_run WORKDIR
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import ray
import yaml
from ray.cluster_utils import Cluster
from typer.testing import CliRunner

from harness.cli import app
from harness.run.ray.cluster import start_local
from tests.helpers import INCIDENT_WORLD, ROOT

FAKE_SGLANG = ROOT / "tests" / "fixtures" / "fake_sglang"


def main(workdir: Path) -> None:
    record_dir = workdir / "record"
    record_dir.mkdir(parents=True)
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["bugs"] = []  # this scenario is about placement and cleanup, not accuracy
    world["models"]["example/dense-4gpu"] = {"accuracy": 0.9, "kind": "dense"}
    world["faults"] = [{"name": "worker-dies", "models": ["deepseek-ai/DeepSeek-V2-Lite-Chat"],
                        "when": {"attention_backend": "flashinfer", "enable_unified_memory": True},
                        "kill_parent_after_requests": 5, "once_file": str(workdir / "killed-once")}]
    world_path = workdir / "world.yaml"
    world_path.write_text(yaml.safe_dump(world))
    env = {"PYTHONPATH": f"{FAKE_SGLANG}:{ROOT}", "REGRESS_SIM_WORLD": str(world_path),
           "FAKE_SGLANG_RECORD_DIR": str(record_dir)}
    suite = {
        "suite": "cluster", "engine": "sglang", "num_questions": 20, "stop_grace_s": 2, "concurrency": 8,
        "gate": {"min_effect": 0.3},
        "models": [
            {"id": "dsv2", "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "tp": 1, "floor": 0.5, "env": env},
            {"id": "kimi", "path": "moonshotai/Kimi-Linear-48B-A3B-Instruct", "tp": 2, "floor": 0.5, "env": env,
             "extra_args": ["--mamba-radix-cache-strategy", "extra_buffer"]},
            {"id": "dense", "path": "example/dense-4gpu", "tp": 4, "floor": 0.5, "env": env}],
        "axes": {"attention_backend": ["triton", "fa3", "flashinfer", "flashmla"], "unified_memory": ["off", "on"]},
        "exclude": [{"model": ["kimi", "dense"], "unified_memory": "on", "reason": "keeps the matrix at 16 cells"}],
    }
    suite_path = workdir / "suite.yaml"
    suite_path.write_text(yaml.safe_dump(suite))
    cluster = start_local(two_nodes)  # tried again on a busy machine, as `regress run` starts its own
    try:
        result = CliRunner().invoke(app, ["run", str(suite_path), "--results-dir", str(workdir / "results"),
                                          "--no-tracking", "--quiet"], catch_exceptions=False)
    finally:
        ray.shutdown()
        cluster.shutdown()
    run_dir = next((workdir / "results").glob("cluster-*"))
    print(json.dumps({
        "exit_code": result.exit_code,
        "cells": [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()],
        "servers": [json.loads(p.read_text()) for p in record_dir.glob("*.json")],
        "killed_once": (workdir / "killed-once").exists(),
    }))


def two_nodes() -> Cluster:
    """A head and two nodes of 4 declared GPUs, the driver connected; a failed start shuts down what it started."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, num_gpus=4)
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


if __name__ == "__main__":
    main(Path(sys.argv[1]))
