"""GSM8K from the hub when the hub is out of reach: straight to the cache, and when the cache is
empty too, an error that says where to get the files."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.engine.ports import free_port
from tests.helpers import ROOT, machine_s


def test_an_unreachable_hub_and_an_empty_cache_say_where_to_get_gsm8k(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("REGRESS_GSM8K_PATH", "HF_HUB_OFFLINE",
                                                            "HF_DATASETS_OFFLINE")}
    env |= {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # nobody listens
    probe = ("from harness.benchmark.gsm8k.dataset import load_gsm8k\n"
             "try:\n    load_gsm8k(None)\nexcept Exception as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=machine_s(300))
    assert "cannot load openai/gsm8k" in result.stdout, result.stdout + result.stderr
    assert "github.com/openai/grade-school-math" in result.stdout and "--gsm8k-path" in result.stdout
