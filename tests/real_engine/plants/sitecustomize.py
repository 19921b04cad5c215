"""Test-only plants in real sglang, opted into by the real-engine tests through PYTHONPATH (this
folder) and REGRESS_PLANT; with REGRESS_PLANT unset nothing is touched. Never on a product path.

- `scheduler_crash`: the scheduler raises in its first batch (the server's own warmup request), after
  the launcher has installed its running-phase handler: sglang then logs "Scheduler hit an
  exception", and its launcher waits ~60 s "for CUDA coredumps" before exiting, even on a CPU.
"""

import importlib.abc
import importlib.machinery
import os
import sys

PLANT = os.environ.get("REGRESS_PLANT", "")
TARGET = "sglang.srt.managers.scheduler"


def _plant(module):
    if PLANT == "scheduler_crash":
        def run_batch(self, *args, **kwargs):
            raise RuntimeError("planted scheduler crash (REGRESS_PLANT=scheduler_crash)")

        module.Scheduler.run_batch = run_batch


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _plant(module)

        loader.exec_module = exec_module
        return spec


if PLANT:
    sys.meta_path.insert(0, _AfterImport())
