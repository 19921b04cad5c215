"""Run cells' exact server argv through the *installed* sglang's own parser and resolution, without a
GPU: the plan-time oracle for "would this sglang start this cell at all, and with what settings?".

`python -m harness.engine.sglang_check` reads a JSON list of `{"cell_id", "argv"}` on stdin (argv as
`regress plan --json` lists it: `<python> -m sglang.launch_server --model-path ...`) and writes a JSON
list of `CheckedCell` on stdout. It is meant to run under the interpreter that will run the servers
(a worker's, or `regress check --python`), so it imports nothing of the harness beyond this module and
`harness.engine.stand_ins`.

What it does, per sglang release:
- argparse (`prepare_server_args`): every release. An unknown flag or an invalid choice is a refusal,
  with argparse's own message.
- the whole resolution (`ServerArgs.resolve_once()` then `check_server_args()`, what the server runs at
  startup; `resolved_dict()` is what `/server_info` reports): sglang 0.5.23 and later (guarded by
  the methods existing). It needs the GPU described (`--gpu`, default 8 x H200, sm90), each model's
  config.json in a local folder (`--models-dir`, a folder per model path), and stand-ins for the
  CUDA-only native modules sglang imports but never calls here (triton, sgl_kernel, torchvision).

Each cell is checked in a process forked after the import and one warm-up resolution (~10 s once,
~0.1 s per cell), so resolution hooks that change process state cannot leak from one cell into the
next; a pool keeps one such process per core busy, starting the next cell as each ends.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import sys
import time
import types
from multiprocessing import connection
from pathlib import Path

from harness.engine.stand_ins import CHECK_STAND_INS, install

CELL_TIMEOUT_S = 300.0  # one cell's parse and resolution: ~0.1 s of CPU once warm; minutes only if it hangs
GPUS = {"H200": ((9, 0), 143), "H100": ((9, 0), 80), "B200": ((10, 0), 180), "A100": ((8, 0), 80)}


def install_stand_ins() -> list[str]:
    """Stand in for the CUDA-only native modules this machine lacks, wholly or in part
    (`harness.engine.stand_ins`); which ones were missing whole."""
    return install(CHECK_STAND_INS, calls_allowed=True)


def describe_gpu(kind: str, count: int) -> None:
    """Tell torch there are `count` GPUs of `kind` (sglang picks defaults by capability and memory).
    Nothing to tell when there is no torch (a stand-in sglang)."""
    try:
        import torch
    except ImportError:
        return

    capability, memory_gib = GPUS.get(kind, GPUS["H200"])
    properties = types.SimpleNamespace(name=f"NVIDIA {kind}", total_memory=memory_gib * 2**30, major=capability[0],
                                       minor=capability[1], multi_processor_count=132, is_integrated=False,
                                       L2_cache_size=60 * 2**20, uuid="GPU-stand-in", gcnArchName="")
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: count
    torch.cuda.current_device = lambda: 0
    torch.cuda.set_device = lambda device: None
    torch.cuda.get_device_capability = lambda device=None: capability
    torch.cuda.get_device_name = lambda device=None: properties.name
    torch.cuda.get_device_properties = lambda device=None: properties
    torch.cuda.mem_get_info = lambda device=None: ((memory_gib - 3) * 2**30, memory_gib * 2**30)
    torch.cuda.is_bf16_supported = lambda *args, **kwargs: True
    torch.version.cuda = torch.version.cuda or "12.8"


def _server_flags(argv: list[str], models_dir: Path | None) -> list[str]:
    """The flags after `-m sglang.launch_server`, with the model path pointing at its local config."""
    flags = argv[argv.index("sglang.launch_server") + 1:] if "sglang.launch_server" in argv else argv[3:]
    flags = [flag.replace("{port}", "30000").replace("{nccl_port}", "30001") for flag in flags]
    if models_dir is not None and "--model-path" in flags:
        position = flags.index("--model-path") + 1
        local = models_dir / flags[position]
        if (local / "config.json").is_file():
            flags[position] = str(local)
    return flags


def _parse(flags: list[str]) -> object:
    """sglang's own argparse step: `prepare_server_args`, else (older or stand-in builds) its parser."""
    try:
        from sglang.srt.server_args import prepare_server_args
    except ImportError:
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        return parser.parse_args(flags)
    return prepare_server_args(flags)


def _config_available(flags: list[str]) -> bool:
    """Resolution reads the model's config.json: from a local folder, or the hub cache (offline)."""
    if "--model-path" not in flags:
        return False
    model = flags[flags.index("--model-path") + 1]
    if (Path(model) / "config.json").is_file():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(model, "config.json"), str)


def _check_one(flags: list[str], fields: tuple[str, ...]) -> dict[str, object]:
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            server_args = _parse(flags)
    except SystemExit:
        lines = [line for line in errors.getvalue().splitlines() if "error:" in line]
        return {"refused": (lines[-1] if lines else errors.getvalue().strip()[-500:]), "stage": "argparse"}
    if not hasattr(server_args, "resolve_once") or not _config_available(flags):
        why = None if not hasattr(server_args, "resolve_once") else (
            "no local config.json for the model (--models-dir, or the hub cache): resolution not checked")
        return {"refused": None, "stage": "argparse", "problem": why, "predicted": {}}
    stage = "argparse"
    try:
        if hasattr(server_args, "resolve_once"):
            stage = "resolution"
            server_args.resolve_once()
        if hasattr(server_args, "check_server_args"):
            stage = "check"
            server_args.check_server_args()
    except Exception as error:  # noqa: BLE001 - whatever sglang raises is its refusal, reported verbatim
        return {"refused": f"{type(error).__name__}: {error}"[:1000], "stage": stage}
    resolved = server_args.resolved_dict() if hasattr(server_args, "resolved_dict") else vars(server_args)
    return {"refused": None, "stage": stage,
            "predicted": {key: resolved.get(key) for key in fields if key in resolved}}


def _in_child(flags: list[str], fields: tuple[str, ...], pipe: object) -> None:
    try:
        pipe.send(_check_one(flags, fields))
    except BaseException as error:  # noqa: BLE001 - the child reports anything, then ends
        pipe.send({"refused": None, "stage": "harness", "problem": f"{type(error).__name__}: {error}"[:500]})


def _warm_up(flags: list[str], fields: tuple[str, ...]) -> None:
    """One check in this process, its answer dropped, before any child is forked: sglang imports
    ~1,300 modules (transformers' configs, its kernels' specs) at the first resolution, ~1.7 s of CPU,
    and a child forked from a cold parent paid it for every cell (2.3 s a cell instead of ~0.1 s).
    The environment variables the resolution sets are put back, so each child starts as before."""
    environment = dict(os.environ)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            _check_one(flags, fields)
    except Exception:  # noqa: BLE001 - a warm-up that fails costs time, never a verdict (each child checks anew)
        pass
    finally:
        os.environ.clear()
        os.environ.update(environment)


def check(cells: list[dict], models_dir: Path | None, gpu: str, gpus: int, fields: tuple[str, ...]) -> list[dict]:
    """Every cell's verdict from the installed sglang; see the module docstring."""
    from importlib import metadata

    stand_ins = install_stand_ins()
    if gpu == "cpu":  # sglang's CPU platform, as a CPU cell's server gets it
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    else:
        describe_gpu(gpu, gpus)
    import sglang.srt.server_args  # noqa: F401 - the import every forked check shares

    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        version = getattr(sys.modules["sglang"], "__version__", None)

    if cells:
        _warm_up(_server_flags(cells[0]["argv"], models_dir), fields)
    context = multiprocessing.get_context("fork")
    results: list[dict | None] = [None] * len(cells)
    width = max(1, os.cpu_count() or 1)  # as many checks at once as there are cores, a new one as each ends
    waiting = list(enumerate(cells))
    running: dict[object, tuple[int, object, float]] = {}  # the child's pipe -> (cell index, child, start)
    while waiting or running:
        while waiting and len(running) < width:
            index, cell = waiting.pop(0)
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=_in_child, args=(_server_flags(cell["argv"], models_dir), fields, send))
            child.start()
            send.close()  # the child's end only: a child that dies unheard reads as EOF, not a 300 s wait
            running[receive] = (index, child, time.monotonic())
        ready = set(connection.wait(list(running), timeout=1.0))
        for receive, (index, child, started) in list(running.items()):
            if receive in ready:
                try:
                    result = receive.recv()
                except EOFError:
                    child.join(5)
                    result = {"refused": None, "stage": "harness",
                              "problem": f"the check's process ended without an answer (exit {child.exitcode})"}
            elif time.monotonic() - started > CELL_TIMEOUT_S:
                child.kill()
                result = {"refused": None, "stage": "harness", "problem": f"the check took over {CELL_TIMEOUT_S:.0f} s"}
            else:
                continue
            child.join(5)
            receive.close()
            del running[receive]
            results[index] = {"cell_id": cells[index]["cell_id"], "sglang_version": version, "stand_ins": stand_ins,
                              **result}
    return [result for result in results if result is not None]


def main() -> int:
    parser = argparse.ArgumentParser(description="Check server argv against the installed sglang (JSON in, JSON out).")
    parser.add_argument("--models-dir", type=Path, default=None, help="a folder of <model path>/config.json")
    parser.add_argument("--gpu", default="H200", help=f"GPU kind to describe: {', '.join(GPUS)}; or cpu")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node to describe")
    parser.add_argument("--fields", required=True,
                        help="comma-separated resolved fields to report (the harness's axis registry names them)")
    options = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # config.json comes from --models-dir, never the hub
    cells = json.load(sys.stdin)
    output = sys.stdout
    sys.stdout = sys.stderr  # sglang logs to stdout; only the JSON answer goes there
    results = check(cells, options.models_dir, options.gpu, options.gpus, tuple(options.fields.split(",")))
    output.write(json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
