"""The benchmarks a suite can name (`benchmark:`, default gsm8k) and their protocols (`protocol:`).

A new benchmark is one module with a `Benchmark` subclass and one `BENCHMARKS.add(name, instance)`;
`tests/benchmark/test_toy_benchmark.py` runs one through `regress run` into MLflow.
"""

from __future__ import annotations

from harness.benchmark.base import Benchmark
from harness.benchmark.gsm8k.benchmark import Gsm8kBenchmark
from harness.errors import ConfigError
from harness.registry import Registry, did_you_mean

BENCHMARKS: Registry[Benchmark] = Registry("benchmark")
BENCHMARKS.add("gsm8k", Gsm8kBenchmark())


def benchmark_named(name: str, protocol: str | None = None) -> Benchmark:
    """The benchmark, having checked that it has `protocol`; ConfigError naming what is available."""
    if name not in BENCHMARKS:
        raise ConfigError(f"benchmark: {BENCHMARKS.unknown(name)}")
    benchmark = BENCHMARKS.get(name)
    if protocol is not None and protocol not in benchmark.protocols:
        raise ConfigError(f"protocol: unknown protocol {protocol!r} of benchmark {name}; allowed: "
                          f"{', '.join(benchmark.protocols)}{did_you_mean(protocol, benchmark.protocols)}")
    return benchmark
