"""`sglang.launch_server`'s command line, as far as the simulator honours it, and its resolution.

The flags keep sglang's spelling and destinations (`--tp-size` -> `tp_size`), so the server info the
simulator reports has the same keys as a real server's. Unknown flags are rejected as argparse does.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from harness.sim.world import World
from harness.suite.axes import AXES, SGLANG_ATTENTION_BACKENDS, flags_known


def build_parser(backends: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.sim",
        description="A simulated sglang server. Same flags as `python -m sglang.launch_server` for those the "
                    "regression matrix uses; behaviour from the world file in REGRESS_SIM_WORLD.",
        epilog="example: REGRESS_SIM_WORLD=configs/sim/incident.yaml python -m harness.sim "
               "--model-path moonshotai/Kimi-Linear-48B-A3B-Instruct --port 30000 --tp-size 2 --attention-backend fa3")
    add_arguments(parser, backends)
    return parser


def add_arguments(parser: argparse.ArgumentParser, backends: list[str] | None = None) -> None:
    """sglang's flags as far as the simulator honours them (`ServerArgs.add_cli_args` in spirit):
    every matrix axis's flag from the registry, then the fixed ones below that no axis defines (an
    axis registered for `--kv-cache-dtype` replaces the plain flag, never clashes with it)."""
    choices = backends or list(SGLANG_ATTENTION_BACKENDS)
    for axis in AXES.values():  # every matrix axis's flag, as sglang spells it
        axis.add_to_parser(parser, choices)
    from_axes = flags_known()

    def add(flag: str, *aliases: str, **kwargs: object) -> None:
        if flag not in from_axes:
            parser.add_argument(flag, *aliases, **kwargs)

    add("--model-path", required=True)
    add("--tokenizer-path", default=None)
    add("--served-model-name", default=None)
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    add("--dp-size", type=int, default=1)
    add("--random-seed", type=int, default=None)
    add("--trust-remote-code", action="store_true")
    add("--mamba-radix-cache-strategy", default=None)
    add("--enable-two-batch-overlap", action="store_true")
    add("--nccl-port", type=int, default=None)
    add("--dist-init-addr", default=None)
    add("--mem-fraction-static", type=float, default=None)
    add("--context-length", type=int, default=None)
    add("--max-running-requests", type=int, default=None)
    add("--cuda-graph-max-bs", type=int, default=None)
    add("--disable-cuda-graph", action="store_true")
    add("--kv-cache-dtype", default="auto")
    # sglang's CPU backend (a suite's `cluster.platform: cpu`, SglangCommandLine.platform_flags in harness.engine.engines).
    add("--device", default="cuda")
    add("--disable-overlap-schedule", action="store_true")
    add("--sleep-on-idle", action="store_true")
    add("--max-total-tokens", type=int, default=None)
    add("--enable-cache-report", action="store_true")
    add("--log-level", default="info")


def resolve(args: argparse.Namespace, world: World) -> dict[str, Any]:
    """Server arguments after defaults, as `/get_server_info` reports them."""
    resolved = dict(vars(args))
    model = world.model(args.model_path)
    if resolved["attention_backend"] is None:
        resolved["attention_backend"] = world.default_backend.get(model.kind, "triton")
    if resolved["random_seed"] is None:
        resolved["random_seed"] = random.randint(0, 2**30)
    if resolved["chunked_prefill_size"] is None:
        resolved["chunked_prefill_size"] = world.default_chunked_prefill_size
    if model.radix_cache_needs_extra_buffer and resolved["mamba_radix_cache_strategy"] != "extra_buffer":
        # What some sglang versions do for hybrid-linear models, without an error.
        resolved["disable_radix_cache"] = True
    resolved["tokenizer_path"] = resolved["tokenizer_path"] or args.model_path
    resolved["served_model_name"] = resolved["served_model_name"] or args.model_path
    return resolved
