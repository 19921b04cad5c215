"""Shared fixtures: the GSM8K copy beside the checkout, one local Ray for the session, sim worlds."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


def gsm8k_folder() -> Path:
    configured = os.environ.get("REGRESS_GSM8K_PATH")
    folder = Path(configured) if configured else SHARED_GSM8K
    if not (folder / "test.jsonl").is_file():
        pytest.exit(f"GSM8K not found at {folder}; set REGRESS_GSM8K_PATH to a folder with test.jsonl and "
                    "train.jsonl", returncode=2)
    return folder


@pytest.fixture(scope="session", autouse=True)
def _gsm8k_env() -> Path:
    folder = gsm8k_folder()
    os.environ["REGRESS_GSM8K_PATH"] = str(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def _regress_cache(tmp_path_factory) -> Path:
    """One cache for the session (the MLflow schema template every fresh SQLite store is copied
    from), not the user's ~/.cache: built once by the first test that opens a store."""
    folder = tmp_path_factory.mktemp("regress-cache")
    os.environ["REGRESS_CACHE_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def gsm8k(_gsm8k_env: Path):
    from harness.benchmark.gsm8k.dataset import load_gsm8k

    return load_gsm8k(_gsm8k_env)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray with 8 declared GPUs for every test that needs one (start-up costs ~2.5 s)."""
    import logging

    import ray

    # 8 declared GPUs for the simulated suites, 2 CPU slots for the real-engine ones (cluster.platform: cpu).
    ray.init(address="local", num_cpus=2, num_gpus=8, resources={"regress_cpu_slot": 2}, include_dashboard=False,
             log_to_driver=False,
             logging_level=logging.WARNING, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


@pytest.fixture()
def python() -> str:
    return sys.executable


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
