"""Suite files: the validated description of one matrix run.

`load_suite(path)` reads YAML, validates it against `Suite`, and raises `ConfigError` with every
problem named by its key path (``models[0].tp``) and, where it helps, the allowed values and a
did-you-mean. Nothing is launched before a suite validates.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import ConfigError
from harness.registry import did_you_mean
from harness.suite.axes import AXES, SGLANG_ATTENTION_BACKENDS, backend_axes
from harness.suite.files import parse_yaml, read_text

# Suite and model ids name files (results/<run>/questions/<cell>.jsonl), MLflow runs and ids of cells that
# join them with axis values; 64 keeps a cell id well under a file name's 255 bytes.
MAX_NAME = 64


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, allow_inf_nan=False, strict=True)


class ModelSpec(Strict):
    """One model of the matrix and how its servers are launched."""

    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=MAX_NAME)]
    path: str
    tp: Annotated[int, Field(ge=1, le=64)] = 1
    # Significantly below it on the test questions is `fail`; 0: not tested. Left out with an
    # `accuracy` given: that accuracy minus gate.floor_margin.
    floor: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    # The model's accuracy on this protocol, measured (`regress calibrate`) or published (say where
    # in a comment): the floor follows it, and a floor far under it is warned about.
    accuracy: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    # One launch's accuracy spread (sd, a fraction) beyond its questions' sampling: another node,
    # autotuned kernels, a warm cache. `regress calibrate` measures it from consecutive runs; every
    # paired test adds both launches' share to its variance.
    launch_sd: Annotated[float, Field(ge=0.0, lt=0.2)] = 0.0
    trust_remote_code: bool = False
    extra_args: list[str] = []
    env: dict[str, str] = {}
    gpu_type: str | None = None
    startup_timeout_s: Annotated[float, Field(gt=0)] = 1200.0
    # Nats per token beyond which a question's teacher-forced divergence from the reference counts
    # (gate.divergence); null: the gate's. `regress calibrate` proposes one from measured runs.
    divergence_tolerance: Annotated[float, Field(gt=0.0)] | None = None


CPU_SLOT_RESOURCE = "regress_cpu_slot"
# Custom axes go into cell ids, which name files and MLflow runs: nothing that can leave a folder.
CUSTOM_AXIS_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
AXIS_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ClusterSpec(Strict):
    address: str | None = None
    # Where the servers run: `cuda` (a GPU per slot; Ray's GPU resource) or `cpu` (sglang's CPU
    # backend; a slot is Ray's custom resource `regress_cpu_slot`, a core's worth of serving).
    platform: Literal["cuda", "cpu"] = "cuda"
    gpus: Annotated[int, Field(ge=0, le=4096)] = 8  # slots per local node: GPUs, or on `cpu` the CPU slots
    cpus: Annotated[int, Field(ge=1, le=65536)] | None = None
    runtime_env: dict[str, Any] = {}
    # Between nodes that fit a cell equally well, prefer one that already loaded its model in this
    # run (the weights are still in its page cache): the warm-up knob.
    prefer_warm_nodes: bool = True
    # Cells that failed in the previous run go first, so a PR learns its verdict sooner. A nightly
    # may turn it off and let packing alone decide (those cells otherwise run as an extra phase).
    failed_first: bool = True
    # How long a cell may wait while no node of the cluster could ever hold it (nodes died, or an
    # autoscaler has not added them yet) before it is `error`.
    wait_for_nodes_s: Annotated[float, Field(gt=0)] = 600.0

    @property
    def slot_resource(self) -> str:
        """The Ray resource one slot holds: a GPU, or a CPU slot."""
        return CPU_SLOT_RESOURCE if self.platform == "cpu" else "GPU"


class DatasetSpec(Strict):
    path: str | None = None


class DivergenceSpec(Strict):
    """The teacher-forced divergence test against the reference cell (harness.gate.divergence)."""

    # Ask each question's teacher text teacher-forced (prefill only) and test it; false: neither.
    enabled: bool = True
    # Nats per token of mean |delta log-probability| beyond which a question counts as diverged.
    # Conservative: well above the bf16 differences between healthy backends; a model's own
    # `divergence_tolerance` (calibrated from its measured runs) replaces it.
    tolerance: Annotated[float, Field(gt=0.0)] = 0.1
    # The share of questions a healthy cell may have beyond the tolerance (the null hypothesis).
    healthy_share: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1


# 6 of 6 questions beyond the tolerance at a 10% healthy share is p = 1e-6, about the alpha a 72-cell
# run gives one self-check (1.3e-05 / 3): fewer questions can never reject.
MIN_SELF_CHECKS = 6


class SelfCheckSpec(Strict):
    """Each cell asks a sample of its questions again inside itself (harness.benchmark.self_checks,
    harness.gate.self_checks): alone, after a cache flush, and replayed warm."""

    # Questions sampled per cell, at most `max_share` of its planned questions (what they add to a
    # cell's evaluation: README, "Evidence inside each cell"); 0: no self-checks. Under MIN_SELF_CHECKS
    # none are asked: fewer cannot reject at the alpha a run gives one test. They need the protocol's
    # teacher texts (not chat, not sgl-eval).
    questions: Annotated[int, Field(ge=0, le=1024)] = 32
    max_share: Annotated[float, Field(gt=0.0, le=1.0)] = 0.1
    # The share of each cell's alpha the self-checks spend (at stage 1, split over those made).
    share: Annotated[float, Field(gt=0.0, lt=0.5)] = 0.1
    # Nats per token past which a sampled question counts against the co-batch, cache and decode checks
    # (how far a cell's own numbers may move between batches, warm and cold, or decode and prefill); null: each model's
    # divergence tolerance. `regress calibrate` proposes it from passing cells.
    tolerance: Annotated[float, Field(gt=0.0)] | None = None

    def count(self, planned: int) -> int:
        """How many of `planned` questions a cell samples (0: no self-checks)."""
        found = min(self.questions, int(self.max_share * planned))
        return found if found >= MIN_SELF_CHECKS else 0


class GateSpec(Strict):
    """How cells are judged (README, "Verdicts"; harness.gate). One budget: `alpha` is the chance
    that a healthy run has any `fail`, spread over cells, tests and looks (harness.gate.budget)."""

    alpha: Annotated[float, Field(gt=0.0, lt=0.5)] = 0.01
    # The largest drop against the reference configuration that is harmless (backends differ a
    # little in numerics): the reference test's null hypothesis is `drop <= tolerance`.
    tolerance: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.01
    # The largest drop against the cell's own earlier runs (the last run it was not a regression
    # in, the pinned run) that is harmless: a new build moves every cell a little. Their tests' null
    # hypothesis is `drop <= history_margin`; null: `tolerance`.
    history_margin: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    # The smallest drop the suite must catch: a cell passes only when it is confident (at
    # `pass_confidence`) that every paired drop is smaller; otherwise it is extended, else `inconclusive`.
    min_effect: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.03
    pass_confidence: Annotated[float, Field(gt=0.5, lt=1.0)] = 0.95
    extraction: Literal["strict", "flexible"] = "flexible"
    max_infra_failure_rate: Annotated[float, Field(ge=0.0, le=1.0)] = 0.02
    # Stop a cell clearly below its floor early (frees its GPUs), spending this share of the cell's
    # alpha over its looks. 0 turns it off.
    early_stop_share: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    # Undecided cells (and their references) are asked more questions up to this many in all: the
    # test questions not asked yet, then train questions (never the shots). null: no extension.
    extend_to: Annotated[int, Field(ge=1)] | None = None
    # The share of the cells' final alpha kept for the stages after the first (the extension, then
    # each relaunch), split evenly over them (harness.gate.budget).
    extension_share: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.7
    # Launch spread (what moves a cell between launches of its server) does not shrink with more
    # questions, only with more launches: a cell still undecided after its planned questions (and
    # the extension) is launched again, on other GPUs where there are, up to this many launches in
    # all, its reference once more beside it, and judged on every launch (harness.run.relaunch). 1: never.
    max_launches: Annotated[int, Field(ge=1, le=8)] = 1
    # Deciding undecided cells (the extension and the relaunches together) may add at most this share
    # to the GPU-seconds of the run's first pass: a night costs at most 1 + this. Cells left over
    # stay `inconclusive`, and the headline names them. null: no limit.
    undecided_budget: Annotated[float, Field(ge=0.0, le=8.0)] | None = None
    # Launch every reference a second time in each run, undecided cells or not: the night's own
    # measurement of launch spread (harness.gate.launches), and a reference twice as steady.
    measure_launch_spread: bool = False
    # One launch spread for all the suite's models: their samples pooled into one estimate (twice the
    # degrees of freedom with two models), for a fleet whose spread is common to them (the same
    # nodes, the same non-deterministic kernels). false: each model's own (harness.gate.launches).
    pool_launch_spread: bool = False
    # The history test pools the cell's answers in its newest earlier runs that were not a
    # regression, up to this many.
    history_runs: Annotated[int, Field(ge=1, le=30)] = 5
    # The share of alpha kept for the model-wide tests (every cell of a model against its history
    # and the pinned run, together: harness.gate.model_wide); 0 turns them off.
    model_wide_share: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.05
    # A run of this suite every cell is also paired with (besides its last run), so a slow drift
    # of a point a night cannot pass unseen. `auto`: the first finished run of this protocol that
    # was not red (no fail or mismatch; the job says which); a run id: that run (`regress calibrate
    # SUITE` proposes one); null: none.
    pinned_run: str | None = "auto"
    # A model's floor when it gives its `accuracy` but no floor: this far under it.
    floor_margin: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.03
    divergence: DivergenceSpec = DivergenceSpec()
    self_checks: SelfCheckSpec = SelfCheckSpec()

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "early_stop_alpha" in data:
            raise ValueError("early_stop_alpha was replaced by early_stop_share: the share of each cell's alpha "
                             "its early-stop looks spend (default 0.1; 0 turns early stop off)")
        return data

    @model_validator(mode="after")
    def _tolerance_below_effect(self) -> GateSpec:
        if self.tolerance >= self.min_effect:
            raise ValueError(f"tolerance ({self.tolerance}) must be below min_effect ({self.min_effect}): a drop "
                             "the gate tolerates cannot also be one it must catch")
        if self.history_margin is not None and self.history_margin >= self.min_effect:
            raise ValueError(f"history_margin ({self.history_margin}) must be below min_effect "
                             f"({self.min_effect}): a drop the gate tolerates cannot also be one it must catch")
        return self

    @property
    def own_margin(self) -> float:
        """The history and pinned tests' margin (`history_margin`, else `tolerance`)."""
        return self.tolerance if self.history_margin is None else self.history_margin


class Rule(Strict):
    """An include/exclude rule: every named factor must match (a value or a list of values)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    reason: str = ""

    def conditions(self) -> dict[str, tuple[str, ...]]:
        extra = self.model_extra or {}
        return {key: tuple(_as_str(v) for v in (value if isinstance(value, list) else [value]))
                for key, value in extra.items()}


def _as_str(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


class Suite(Strict):
    """A validated suite file (README, "Suites"; docs/design.md)."""

    suite: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=MAX_NAME)]
    # A registered engine (harness.engine.engines: sglang, sim), checked where the run is built.
    engine: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")] = "sim"
    sim_world: str | None = None
    python: str | None = None
    cluster: ClusterSpec = ClusterSpec()
    dataset: DatasetSpec = DatasetSpec()
    # A registered benchmark (harness.benchmark.registry) and one of its protocols, checked where the
    # run is built (harness.run.build), like the engine. Left out: the benchmark's own default protocol.
    benchmark: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")] = "gsm8k"
    protocol: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")] = ""
    # null: the whole test split; past its 1,319 (clean, chat): then train questions, for the paired tests.
    num_questions: Annotated[int, Field(ge=1)] | None = 200
    max_tokens: Annotated[int, Field(ge=1)] = 512
    # Also the servers' --random-seed, which numpy takes only below 2**32.
    seed: Annotated[int, Field(ge=0, lt=2**32)] = 0
    concurrency: Annotated[int, Field(ge=1, le=4096)] = 256
    request_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    request_attempts: Annotated[int, Field(ge=1, le=20)] = 6  # per question: timeouts, 5xx, 429, bad JSON
    # All of a question's attempts together: a server that trickles bytes cannot hold one for an hour.
    question_deadline_s: Annotated[float, Field(gt=0)] = 900.0
    stop_grace_s: Annotated[float, Field(ge=0)] = 30.0
    # No answer for this long, and /health_generate silent too: the server hung; the cell is `error`.
    stall_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    gate: GateSpec = GateSpec()
    models: Annotated[list[ModelSpec], Field(min_length=1)]
    axes: dict[str, Any] = {}
    baseline: dict[str, Any] = {}
    exclude: list[Rule] = []
    include: list[Rule] = []

    @field_validator("axes")
    @classmethod
    def _check_axes(cls, axes: dict[str, Any]) -> dict[str, Any]:
        normalised: dict[str, Any] = {}
        for name, values in axes.items():
            normalised[name] = normalise_axis(name, values)
        return normalised

    @model_validator(mode="after")
    def _benchmarks_default_protocol(self) -> Suite:
        if not self.protocol:
            from harness.benchmark.registry import BENCHMARKS

            benchmark = BENCHMARKS.find(self.benchmark)  # an unknown one is refused where the run is built
            object.__setattr__(self, "protocol", benchmark.default_protocol if benchmark else "")
        return self

    @model_validator(mode="after")
    def _floors_from_accuracy(self) -> Suite:
        models = [m.model_copy(update={"floor": round(m.accuracy - self.gate.floor_margin, 4)})
                  if m.accuracy is not None and "floor" not in m.model_fields_set else m for m in self.models]
        object.__setattr__(self, "models", models)
        return self

    def warnings(self) -> list[str]:
        """What validates but weakens the gate: a floor far under the model's accuracy lets a
        model-wide break (the reference down with its cells) through on a first night."""
        found = []
        for model in self.models:
            if model.accuracy is not None and model.floor < model.accuracy - 2 * self.gate.floor_margin:
                found.append(f"models.{model.id}.floor {model.floor:.2f} sits {(model.accuracy - model.floor) * 100:.0f}"
                             f" pts under its accuracy {model.accuracy:.2f}: a break of the whole model (its "
                             f"reference included) smaller than that is not red on a first night; leave the floor "
                             f"out (accuracy - gate.floor_margin) or run `regress calibrate`")
        return found

    @field_validator("models")
    @classmethod
    def _unique_models(cls, models: list[ModelSpec]) -> list[ModelSpec]:
        seen: set[str] = set()
        for model in models:
            if model.id in seen:
                raise ValueError(f"duplicate model id '{model.id}'; each model needs its own id")
            seen.add(model.id)
        return models

    @model_validator(mode="after")
    def _cross_checks(self) -> Suite:
        axis_names = list(self.axes)
        for key, value in self.baseline.items():
            if key not in self.axes:
                raise ValueError(f"baseline.{key}: not an axis of this suite; axes: {', '.join(axis_names)}"
                                 + did_you_mean(key, axis_names))
            allowed = axis_value_names(self.axes[key])
            if _as_str(value) not in allowed:
                raise ValueError(f"baseline.{key}: {value!r} is not a value of the axis; "
                                 f"allowed: {', '.join(allowed)}")
        factor_names = ["model", *axis_names]
        model_ids = [m.id for m in self.models]
        for kind in ("exclude", "include"):
            for index, rule in enumerate(getattr(self, kind)):
                for key, values in rule.conditions().items():
                    where = f"{kind}[{index}].{key}"
                    if key not in factor_names:
                        raise ValueError(f"{where}: unknown factor; allowed: {', '.join(factor_names)}"
                                         + did_you_mean(key, factor_names))
                    allowed = model_ids if key == "model" else axis_value_names(self.axes[key])
                    if key in backend_axes() and "auto" in allowed:
                        allowed = list(SGLANG_ATTENTION_BACKENDS)  # what `auto` may expand to
                    for value in values:
                        if value not in allowed:
                            raise ValueError(f"{where}: {value!r} is not a value of '{key}'; "
                                             f"allowed: {', '.join(allowed)}" + did_you_mean(value, allowed))
        return self

    def baseline_value(self, axis: str) -> str:
        """The reference value of an axis: the suite's `baseline`, else the axis's first value."""
        if axis in self.baseline:
            return _as_str(self.baseline[axis])
        return axis_value_names(self.axes[axis])[0]


def normalise_axis(name: str, values: Any) -> Any:
    """Check one axis and return its canonical form.

    A registered axis (`harness.suite.axes`) is a list of values; any other axis is a mapping from
    a value name to the server flags that value adds (a named flag set) and, optionally, the
    environment variables its server gets: canonical `{value: {"flags": [...], "env": {...}}}`.
    """
    axis = AXES.find(name)
    if axis is not None:
        if not isinstance(values, list) or not values:
            raise ValueError(f"axes.{name}: must be a non-empty list of values")
        out: list[str] = []
        for value in values:
            try:
                out.append(axis.value(value))
            except ValueError as error:
                raise ValueError(f"axes.{name}: {error}" + did_you_mean(value, axis.allowed())) from None
        if len(set(out)) != len(out):
            raise ValueError(f"axes.{name}: repeated values {out}")
        return out
    if not isinstance(values, dict) or not values:
        raise ValueError(f"axes.{name}: a custom axis must map value names to lists of server flags, "
                         f"e.g. {{none: [], tbo: [--enable-two-batch-overlap]}} (or to "
                         f"{{flags: [...], env: {{NAME: value}}}}); built-in axes: "
                         f"{', '.join(AXES)}" + did_you_mean(name, list(AXES)))
    if not CUSTOM_AXIS_NAME.fullmatch(name):
        raise ValueError(f"axes.{name!r}: a custom axis name is lowercase letters, digits and '_', starting with a "
                         "letter (it names MLflow params and cell ids)")
    out_values: dict[str, dict[str, Any]] = {}
    for value_name, setting in values.items():
        if not isinstance(value_name, str) or not AXIS_VALUE.fullmatch(value_name):
            raise ValueError(f"axes.{name}: value {value_name!r} must be letters, digits, '.', '_' or '-', starting "
                             "with a letter or digit, at most 64 characters (cell ids name files)")
        out_values[value_name] = _custom_value(f"axes.{name}.{value_name}", setting)
    return out_values


def _custom_value(where: str, setting: Any) -> dict[str, Any]:
    """One custom axis value in its canonical form `{"flags": [...], "env": {...}}`, from a flag list
    or a mapping with `flags` and/or `env` (sglang reads many switches from its environment:
    SGLANG_* variables)."""
    flags, env = setting, {}
    if isinstance(setting, dict):
        unknown = sorted(set(setting) - {"flags", "env"})
        if unknown:
            raise ValueError(f"{where}.{unknown[0]}: unknown key; allowed: flags, env"
                             + did_you_mean(unknown[0], ["flags", "env"]))
        flags, env = setting.get("flags", []), setting.get("env", {})
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise ValueError(f"{where}: must be a list of flag strings, or {{flags: [...], env: {{NAME: value}}}}")
    if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_NAME.fullmatch(k) and isinstance(v, str)
                                            for k, v in env.items()):
        raise ValueError(f"{where}.env: must map variable names (letters, digits, '_', not starting with a digit) "
                         "to strings (quote numbers and on/off)")
    return {"flags": list(flags), "env": dict(env)}


def axis_value_names(values: Any) -> list[str]:
    return list(values) if isinstance(values, dict) else [str(v) for v in values]


def _format_location(location: tuple[Any, ...]) -> str:
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in ("function-after", "literal") or str(part).startswith(("function-", "constrained-")):
            continue
        else:
            text += ("." if text else "") + str(part)
    return text or "(top level)"


_FIELDS_AT: dict[str, type[BaseModel]] = {
    "": Suite, "models": ModelSpec, "cluster": ClusterSpec, "dataset": DatasetSpec, "gate": GateSpec,
    "divergence": DivergenceSpec,
}


def describe_validation_error(error: ValidationError, source: str) -> str:
    """One line for one problem (`suite.yaml: gate.alpha: ...`); a header and a line each for several."""
    problems = []
    for item in error.errors():
        location = tuple(item["loc"])
        where = _format_location(location)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            parent = next((str(p) for p in reversed(location[:-1]) if isinstance(p, str)), "")
            known = list(_FIELDS_AT.get(parent, Suite).model_fields)
            message = (f"unknown key; allowed keys here: {', '.join(known)}"
                       + did_you_mean(str(location[-1]), known))
        elif item["type"] == "missing":
            message = "required key is missing"
        elif "input" in item and item["type"] not in ("value_error",):
            message += f" (got {_shortened(repr(item['input']))})"
        problems.append(f"{where}: {message}")
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return "\n".join([f"{source}: invalid suite ({len(problems)} problems)", *(f"  - {p}" for p in problems)])


def _shortened(text: str, limit: int = 80) -> str:
    """A value as an error quotes it: a 5 MB string pasted in a suite is not echoed whole."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def load_suite(path: str | Path) -> LoadedSuite:
    """Read and validate a suite file. Raises ConfigError naming every bad key."""
    path = Path(path)
    text = read_text(path, "suite file")
    data = parse_yaml(text, path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a suite must be a YAML mapping with keys such as suite, models, axes")
    try:
        suite = Suite.model_validate(data)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error, str(path))) from None
    return LoadedSuite(suite=suite, path=path.resolve(), sha256=hashlib.sha256(text.encode()).hexdigest())


class LoadedSuite(BaseModel):
    """A suite with where it came from (recorded in every run)."""

    model_config = ConfigDict(frozen=True)
    suite: Suite
    path: Path
    sha256: str

    def resolve_path(self, value: str) -> Path:
        """Paths in a suite are relative to the working directory, else to the suite file."""
        candidate = Path(value).expanduser()
        if candidate.is_absolute() or candidate.exists():
            return candidate.resolve()
        return (self.path.parent / candidate).resolve()
