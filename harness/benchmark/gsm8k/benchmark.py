"""GSM8K as a `Benchmark` (harness.benchmark.base): its four protocols over the data `dataset` loads."""

from __future__ import annotations

from pathlib import Path

from harness.benchmark.base import Benchmark, Dataset, ProtocolPlan
from harness.benchmark.gsm8k.dataset import Gsm8k, load_gsm8k
from harness.benchmark.gsm8k.protocol import ProtocolName, build_plan, extension_plan


class Gsm8kBenchmark(Benchmark):
    protocols = tuple(p.value for p in ProtocolName)
    default_protocol = ProtocolName.CLEAN.value

    def load(self, path: Path | None) -> Gsm8k:
        return load_gsm8k(path)

    def plan(self, data: Dataset, protocol: str, num_questions: int | None, seed: int,
             max_tokens: int) -> ProtocolPlan:
        assert isinstance(data, Gsm8k)
        return build_plan(data, protocol, num_questions, seed, max_tokens)

    def extension(self, data: Dataset, plan: ProtocolPlan, count: int) -> ProtocolPlan | None:
        assert isinstance(data, Gsm8k)
        return extension_plan(data, plan, count)
