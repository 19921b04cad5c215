"""The incident world's decisions, without HTTP: accuracy, agreement, bugs, determinism."""

from __future__ import annotations

from harness.sim.world import World, load_world
from tests.helpers import DEEPSEEK, INCIDENT_WORLD, KIMI

HEALTHY = {"attention_backend": "triton", "enable_unified_memory": False, "disable_radix_cache": False,
           "chunked_prefill_size": 8192, "tp_size": 2, "random_seed": 0}
INCIDENT = HEALTHY | {"attention_backend": "fa3", "enable_unified_memory": True}


def world() -> World:
    return load_world(INCIDENT_WORLD)


def accuracy(w: World, questions, resolved, model=KIMI, prefix_hit=True) -> float:
    return sum(w.decide(model, q, resolved, prefix_hit).kind == "right" for q in questions) / len(questions)


def test_healthy_cells_score_about_090(gsm8k):
    questions = [p.question for p in gsm8k.test]
    for model in (KIMI, DEEPSEEK):
        assert 0.87 <= accuracy(world(), questions, HEALTHY, model) <= 0.93


def test_healthy_cells_agree_on_95_to_98_percent(gsm8k):
    w = world()
    questions = [p.question for p in gsm8k.test]
    for other in (HEALTHY | {"attention_backend": "fa3"}, HEALTHY | {"disable_radix_cache": True},
                  HEALTHY | {"enable_unified_memory": True}):
        same = sum((w.decide(KIMI, q, HEALTHY, True).kind == "right") == (w.decide(KIMI, q, other, True).kind == "right")
                   for q in questions)
        assert 0.95 <= same / len(questions) <= 0.98


def test_incident_cells_are_corrupted_only_on_prefix_hits(gsm8k):
    w = world()
    questions = [p.question for p in gsm8k.test]
    for backend in ("fa3", "flashinfer", "flashmla"):
        resolved = INCIDENT | {"attention_backend": backend}
        assert 0.05 <= accuracy(w, questions, resolved) <= 0.31
        assert accuracy(w, questions, resolved, prefix_hit=False) >= 0.87
        assert all(w.decide(KIMI, q, resolved, False).bug is None for q in questions)


def test_the_bug_lives_in_the_wrappers_not_in_a_single_mla_backend(gsm8k):
    """sglang's fix forwarded the attribute through HybridLinearAttnBackend (Kimi-Linear) and
    HybridAttnBackend (prefill != decode backend): an unwrapped DeepSeek cell stayed correct."""
    w = world()
    questions = [p.question for p in gsm8k.test[:400]]
    for backend in ("fa3", "flashinfer", "flashmla"):
        assert accuracy(w, questions, INCIDENT | {"attention_backend": backend}, DEEPSEEK) >= 0.85
    split = INCIDENT | {"attention_backend": "triton", "prefill_attention_backend": "fa3",
                        "decode_attention_backend": "flashmla"}
    assert accuracy(w, questions, split, DEEPSEEK) <= 0.35  # HybridAttnBackend around an MLA decode backend
    same = split | {"prefill_attention_backend": "flashmla"}  # one backend: no wrapper
    assert accuracy(w, questions, same, DEEPSEEK) >= 0.85


def test_triton_and_radix_off_stay_correct(gsm8k):
    w = world()
    questions = [p.question for p in gsm8k.test[:400]]
    assert accuracy(w, questions, INCIDENT | {"attention_backend": "triton"}) >= 0.85
    assert accuracy(w, questions, INCIDENT | {"disable_radix_cache": True}) >= 0.85


def test_decisions_are_deterministic(gsm8k):
    questions = [p.question for p in gsm8k.test[:200]]
    first = [world().decide(KIMI, q, INCIDENT, True) for q in questions]
    assert first == [world().decide(KIMI, q, INCIDENT, True) for q in questions]
