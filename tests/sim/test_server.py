"""The simulated server over HTTP, started through the same engine code as a real sglang."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import pytest

from harness.benchmark.evaluator import EvalSettings, evaluate
from harness.benchmark.gsm8k.protocol import build_plan
from harness.engine.server import ServerProcess
from tests.helpers import INCIDENT_WORLD, KIMI, machine_s, make_cell, sim_spec

INCIDENT_AXES = {"attention_backend": "fa3", "unified_memory": "on", "radix_cache": "on"}
KIMI_ARGS = ["--mamba-radix-cache-strategy", "extra_buffer"]


async def _get(url: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json(content_type=None) if response.status == 200 else None


def run(coroutine):
    return asyncio.run(coroutine)


def test_routes_and_resolved_config(tmp_path, gsm8k):
    cell = make_cell(INCIDENT_AXES, KIMI, tp=2, extra_args=KIMI_ARGS)

    async def scenario():
        async with ServerProcess(sim_spec(cell), tmp_path / "s.log") as server:
            status, info = await _get(server.base_url + "/server_info")
            assert status == 200 and info == (await _get(server.base_url + "/get_server_info"))[1]
            assert info["attention_backend"] == "fa3" and info["enable_unified_memory"] is True
            assert info["disable_radix_cache"] is False and info["tp_size"] == 2 and info["random_seed"] == 0
            assert (await _get(server.base_url + "/health"))[0] == 200
            assert (await _get(server.base_url + "/v1/models"))[1]["data"][0]["id"] == KIMI
            assert (await _get(server.base_url + "/get_model_info"))[1]["model_path"] == KIMI
            async with aiohttp.ClientSession() as session, session.post(server.base_url + "/flush_cache") as r:
                assert r.status == 200

    run(scenario())


def test_incident_cell_scores_low_and_healthy_cell_high_on_every_endpoint(tmp_path, gsm8k):
    async def score(axes, name):
        cell = make_cell(axes, KIMI, tp=2, extra_args=KIMI_ARGS)
        async with ServerProcess(sim_spec(cell), tmp_path / f"{name}.log") as server:
            results = {}
            for protocol in ("clean", "sglang-fewshot", "chat", "sgl-eval", "mixed-prefix"):
                s, _ = await evaluate(server.base_url, build_plan(gsm8k, protocol, 100, 0), EvalSettings(concurrency=32))
                results[protocol] = s.accuracy
            return results

    broken = run(score(INCIDENT_AXES, "broken"))
    healthy = run(score(INCIDENT_AXES | {"attention_backend": "triton"}, "healthy"))
    assert all(value <= 0.35 for value in broken.values()), broken
    assert all(value >= 0.8 for value in healthy.values()), healthy


def test_requests_that_miss_the_prefix_cache_are_not_corrupted(tmp_path, gsm8k):
    """Give every request its own few-shot prefix: nothing hits the cache, so nothing is corrupted."""
    cell = make_cell(INCIDENT_AXES, KIMI, tp=2, extra_args=KIMI_ARGS)
    plan = build_plan(gsm8k, "clean", 60, 0)

    async def scenario():
        async with ServerProcess(sim_spec(cell), tmp_path / "s.log") as server:
            correct = 0
            async with aiohttp.ClientSession() as session:
                for number, prompt in enumerate(plan.prompts):
                    body = {"prompt": f"({number})\n" + prompt.text, "max_tokens": 512, "temperature": 0,
                            "stop": ["Question:"]}
                    async with session.post(server.base_url + "/v1/completions", json=body) as response:
                        text = (await response.json())["choices"][0]["text"]
                    correct += plan.grade(text, prompt.gold).correct
            return correct / len(plan.prompts)

    assert run(scenario()) >= 0.8


def test_same_seed_gives_identical_answers(tmp_path, gsm8k):
    cell = make_cell(INCIDENT_AXES, KIMI, tp=2, extra_args=KIMI_ARGS)
    plan = build_plan(gsm8k, "clean", 50, 0)

    async def outputs(name):
        async with ServerProcess(sim_spec(cell), tmp_path / f"{name}.log") as server:
            _, records = await evaluate(server.base_url, plan, EvalSettings(concurrency=1))
            return [r.output for r in records]

    assert run(outputs("a")) == run(outputs("b"))


def test_radix_cache_is_quietly_disabled_without_the_strategy_flag(tmp_path):
    cell = make_cell(INCIDENT_AXES, KIMI, tp=2)

    async def scenario():
        async with ServerProcess(sim_spec(cell), tmp_path / "s.log") as server:
            return (await _get(server.base_url + "/server_info"))[1]

    assert run(scenario())["disable_radix_cache"] is True


def test_unknown_flag_is_rejected_like_argparse():
    result = subprocess.run([sys.executable, "-m", "harness.sim", "--model-path", KIMI, "--no-such-flag"],
                            capture_output=True, text=True, env={"REGRESS_SIM_WORLD": str(INCIDENT_WORLD),
                                                                 "PATH": "/usr/bin"}, timeout=machine_s(60))
    assert result.returncode == 2 and "unrecognized arguments: --no-such-flag" in result.stderr


@pytest.mark.parametrize("flag", [["--attention-backend", "fa33"], ["--tp-size", "two"]])
def test_invalid_flag_values_are_rejected(flag):
    result = subprocess.run([sys.executable, "-m", "harness.sim", "--model-path", KIMI, *flag],
                            capture_output=True, text=True, env={"REGRESS_SIM_WORLD": str(INCIDENT_WORLD),
                                                                 "PATH": "/usr/bin"}, timeout=machine_s(60))
    assert result.returncode == 2 and "invalid" in result.stderr


def test_a_model_loads_slower_on_a_node_whose_page_cache_lacks_it(tmp_path):
    """The warm-up the scheduler's `prefer_warm_nodes` aims at: the first load on a node is cold."""
    import dataclasses

    import yaml

    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    cell = make_cell({"attention_backend": "triton"})
    world["models"][cell.model.path].update(startup_s=0.1, cold_load_s=1.5)
    world["page_cache_dir"] = "page-cache"
    (tmp_path / "world.yaml").write_text(yaml.safe_dump(world))
    spec = sim_spec(cell, tmp_path / "world.yaml")

    def load_s(node: str) -> float:
        async def start() -> float:
            node_spec = dataclasses.replace(spec, env={**spec.env, "REGRESS_NODE_ID": node})
            async with ServerProcess(node_spec, tmp_path / f"{node}.log") as server:
                return server.startup_s
        return asyncio.run(start())

    cold, _, other_node = load_s("a"), load_s("a"), load_s("b")
    # Lower bounds only: a busy machine makes every load slower, never a cold one faster.
    assert cold >= 1.5 and other_node >= 1.5
    assert "[sim] cold load on node a" in (tmp_path / "a.log").read_text()
    assert "[sim] warm load on node a" in (tmp_path / "a.log").read_text()
    assert "[sim] cold load on node b" in (tmp_path / "b.log").read_text()


def test_teacher_forcing_sees_a_prefix_cache_bug_that_changes_no_answer(tmp_path, gsm8k):
    """A bug whose style is `unchanged` keeps every answer; the teacher-forced log-probabilities of
    the requests that hit the prefix cache move, and a healthy configuration's barely do."""
    world_text = INCIDENT_WORLD.read_text().replace("style: mixed", "style: unchanged")
    world = tmp_path / "quiet-bug.yaml"
    world.write_text(world_text)
    plan = build_plan(gsm8k, "clean", 30, 0)

    async def records(axes, name):
        cell = make_cell(axes, KIMI, tp=2, extra_args=KIMI_ARGS)
        async with ServerProcess(sim_spec(cell, world), tmp_path / f"{name}.log") as server:
            return await evaluate(server.base_url, plan, EvalSettings(concurrency=8))

    broken_score, broken = run(records(INCIDENT_AXES, "broken"))
    healthy_score, healthy = run(records(INCIDENT_AXES | {"attention_backend": "triton"}, "healthy"))
    assert broken_score.accuracy >= 0.8 and healthy_score.accuracy >= 0.8  # accuracy sees nothing
    for record in (*broken, *healthy):
        assert record.teacher is not None and record.teacher.error is None
        assert record.teacher.start > 0 and len(record.teacher.logprobs) == len(record.teacher.token_ids) > 10
        assert record.teacher.cached_tokens > 0  # the shots were served from the prefix cache
    from harness.gate.divergence import divergence_test

    _, other = run(records(INCIDENT_AXES | {"unified_memory": "off"}, "other-healthy"))
    assert divergence_test(broken, healthy, 0.1, 0.1).share > 0.5
    calm = divergence_test(other, healthy, 0.1, 0.1)
    assert calm.beyond == 0 and 0 < calm.nats < 0.02  # two healthy configurations: numerics only


def test_the_simulated_radix_cache_hits_mixed_prefixes_at_many_depths(tmp_path, gsm8k):
    """As a radix tree does: a prompt reuses the longest chain of examples an earlier one began with."""
    cell = make_cell({"attention_backend": "triton", "radix_cache": "on"}, KIMI, tp=2, extra_args=KIMI_ARGS)

    async def scenario():
        async with ServerProcess(sim_spec(cell), tmp_path / "s.log") as server:
            return await evaluate(server.base_url, build_plan(gsm8k, "mixed-prefix", 60, 0),
                                  EvalSettings(concurrency=1, teacher_forcing=False))

    _, records = run(scenario())
    cached = [r.cached_tokens for r in records]
    assert 0 in cached and len({c for c in cached if c}) >= 4, cached  # misses, and hits of several lengths


def test_the_simulator_reads_the_train_split_at_the_first_question_the_test_split_lacks(tmp_path, gsm8k):
    import json

    from harness.sim.server import AnswerBook

    folder = tmp_path / "gsm8k"
    folder.mkdir()
    for split, problems in (("test", gsm8k.test[:3]), ("train", gsm8k.train[:3])):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"question": p.question, "answer": p.solution}) + "\n" for p in problems))
    book = AnswerBook(str(folder))
    assert book.get(gsm8k.test[1].question.strip()).gold == gsm8k.test[1].gold and not book.train_read
    assert book.get(gsm8k.train[2].question.strip()).gold == gsm8k.train[2].gold and book.train_read
    assert book.get("a question in neither split") is None


def test_the_decode_check_reads_token_ids_and_decoded_rows_back_as_sglang_serves_them(tmp_path, gsm8k):
    """The decode self-check's three requests (harness.benchmark.decode_check) on the simulator: the
    prompt's ids come back from a request scored from position 0, `input_ids` are read back as the
    same text, the follow-up hits its answer's decoded rows (radix on) and none with radix off, and a
    healthy server's decoded numbers are its prefill's."""
    from harness.benchmark.decode_check import DECODED_TOKENS, FOLLOW_TOKENS, decode_check
    from harness.benchmark.evaluator import DECODE, parse_decoded

    prompt = build_plan(gsm8k, "clean", 1, 0).prompts[0]

    async def check(axes, name):
        cell = make_cell(axes, KIMI, tp=2, extra_args=KIMI_ARGS)
        async with ServerProcess(sim_spec(cell), tmp_path / f"{name}.log") as server, aiohttp.ClientSession() as session:
            async def post(body):
                async with session.post(server.base_url + "/generate", json=body) as response:
                    return parse_decoded(await response.json()) if response.status == 200 else await response.text()

            bad = await post({"input_ids": [10 ** 6], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True})
            return await decode_check(post, prompt.text), bad

    healthy = INCIDENT_AXES | {"attention_backend": "triton"}
    (on, bad), (off, _) = run(check(healthy, "on")), run(check(healthy | {"radix_cache": "off"}, "off"))
    assert DECODE == "decode" and "ids the simulator never gave out" in bad
    for found in (on, off):
        assert found.error is None and len(found.token_ids) == DECODED_TOKENS + FOLLOW_TOKENS, found
        assert found.follow_start == DECODED_TOKENS and found.decoded == found.prefilled  # bitwise: path_noise 0
    assert on.follow_cached > on.prompt_tokens and off.follow_cached == 0
