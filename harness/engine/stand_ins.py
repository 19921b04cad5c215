"""Stand-ins for CUDA-only packages sglang imports but never calls on a CPU machine: the plan-time
check's (`sglang_check`, which describes a GPU) and a CPU server's (`regress_stand_ins.pth`, which
`make sglang-env` writes into the sglang environment, calls `for_servers()` at interpreter start). Like
`sglang_check`, this module imports nothing of the harness: it runs under the servers' interpreter.

A stand-in module is anything asked of it (a submodule, a class to subclass, a value). Used as a
decorator it passes the function through. Otherwise a call is the one thing that tells the two uses
apart: the check permits it (`@decorator(...)` at import time), a server records it
(REGRESS_STAND_IN_LOG, one line per call) and raises, so a run that needed a CUDA kernel fails
loudly and the real-engine tests can assert that none ran.

A package that cannot be imported is stood in for whole (a finder ahead of the others); one that
imports without its CUDA submodules (`sgl_kernel.quantization`) is completed by a finder after the
others, asked only for what no file provides.
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

VERSIONS = {"triton": "3.4.0", "sgl_kernel": "0.0.0+stand-in", "torchvision": "0.28.0"}  # what importers ask
CHECK_STAND_INS = ("triton", "sgl_kernel", "torchvision")
SERVER_STAND_INS = ("sgl_kernel", "torchvision")  # a CPU server runs the real triton (xgrammar brings it)


class _StandInType(type):
    def __getattr__(cls, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{cls.__name__}.{name}")


class _StandIn(types.ModuleType):
    """A module (or attribute) that is anything asked of it: a decorator, a base class, a value."""

    calls_allowed = True  # False: a call is recorded and raises (servers)

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        value: object = (_StandInType(name, (), {"__init__": lambda self, *a, **k: None}) if name[:1].isupper()
                         else type(self)(f"{self.__name__}.{name}"))
        setattr(self, name, value)
        return value

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # @decorator
        if self.calls_allowed:
            return lambda function: function  # @decorator(...)
        log = os.environ.get("REGRESS_STAND_IN_LOG")
        if log:
            with open(log, "a") as handle:
                handle.write(f"{os.getpid()} {self.__name__}\n")
        raise NotImplementedError(f"{self.__name__} is a stand-in for a CUDA-only kernel; this code path needs the "
                                  "real package (README, 'Real sglang on a CPU')")

    def __hash__(self) -> int:
        return hash(self.__name__)

    def __eq__(self, other: object) -> bool:
        return self is other


class _RaisingStandIn(_StandIn):
    calls_allowed = False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str], kind: type[_StandIn]) -> None:
        self.roots, self.kind = roots, kind

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] in self.roots else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = self.kind(spec.name)
        module.__version__ = VERSIONS.get(spec.name, "0")
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install(roots: tuple[str, ...], calls_allowed: bool = True) -> list[str]:
    """Stand in for whichever of `roots` cannot be imported, and for the missing submodules of those
    that can; the names stood in for whole."""
    kind = _StandIn if calls_allowed else _RaisingStandIn
    missing = {name for name in roots if importlib.util.find_spec(name) is None}
    sys.meta_path.append(_Finder(set(roots) - missing, kind))
    if not missing:
        return []
    sys.meta_path.insert(0, _Finder(missing, kind))
    folder = Path(tempfile.gettempdir()) / f"regress-stand-ins-{os.getuid()}"
    for name in missing & {"torchvision", "sgl_kernel"}:  # transformers asks for versions through metadata
        dist = folder / f"{name}-{VERSIONS[name]}.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {VERSIONS[name]}\n")
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    return sorted(missing)


def for_servers() -> list[str]:
    """What a CPU server's interpreter runs at start (REGRESS_STAND_INS=0 turns it off)."""
    if os.environ.get("REGRESS_STAND_INS", "1") == "0":
        return []
    return install(SERVER_STAND_INS, calls_allowed=False)
