"""Stand-ins for the CUDA-only packages sglang imports on a CPU machine but never calls there:
`torchvision` (no CPU wheel matching the pinned torch) and `sgl_kernel` (sglang's CUDA/AMX kernels).
Imported at interpreter start by `regress_stand_ins.pth` (the sglang environment's site-packages),
it stands in only for packages that cannot be imported, and for missing submodules of them.

With no op registered under `torch.ops.sgl_kernel`, sglang's `cpu_has_amx_support()` is false and
every layer takes its `forward_native` path. A stand-in used as a decorator passes the function
through; any other call is recorded (REGRESS_STAND_IN_LOG, one line per call) and raises, so a run
that needed a CUDA kernel fails loudly and the tests can assert that none ran.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import types
from pathlib import Path

ROOTS = ("torchvision", "sgl_kernel")
VERSIONS = {"torchvision": "0.28.0", "sgl_kernel": "0.0.0+stand-in"}


def _record(name: str) -> None:
    log = os.environ.get("REGRESS_STAND_IN_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()} {name}\n")


class _StandInType(type):
    def __getattr__(cls, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{cls.__name__}.{name}")


class _StandIn(types.ModuleType):
    """A module or attribute that is anything asked of it, until it is called."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        value: object = (_StandInType(name, (), {"__init__": lambda self, *a, **k: None}) if name[:1].isupper()
                         else _StandIn(f"{self.__name__}.{name}"))
        setattr(self, name, value)
        return value

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator at import time
        _record(self.__name__)
        raise NotImplementedError(f"{self.__name__} is a stand-in for a CUDA-only kernel; this code path needs "
                                  "the real package (README, 'Real sglang on a CPU')")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] in self.roots else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__version__ = VERSIONS.get(spec.name, "0")
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> list[str]:
    """Stand in for whichever of ROOTS cannot be imported; their names."""
    missing = {name for name in ROOTS if importlib.util.find_spec(name) is None}
    if not missing:
        return []
    sys.meta_path.append(_Finder(missing))
    folder = Path(tempfile.gettempdir()) / f"regress-stand-ins-{os.getuid()}"
    for name in missing:  # transformers asks for versions through package metadata
        dist = folder / f"{name}-{VERSIONS[name]}.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {VERSIONS[name]}\n")
    sys.path.append(str(folder))
    return sorted(missing)


if os.environ.get("REGRESS_STAND_INS", "1") != "0":
    install()
