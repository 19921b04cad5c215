"""Test-only plants in real sglang, opted into by the real-engine tests through PYTHONPATH (this
folder) and REGRESS_PLANT; with REGRESS_PLANT unset nothing is touched. Never on a product path.

- `scheduler_crash`: the scheduler raises in its first batch (the server's own warmup request), after
  the launcher has installed its running-phase handler: sglang then logs "Scheduler hit an
  exception", and its launcher waits ~60 s "for CUDA coredumps" before exiting, even on a CPU.
- `prefix_kv`: the incident's class of bug. A request that extends a prefix served from the radix
  cache reads the wrong KV rows for that prefix (position i reads the row of position i // 2: the
  first half of the prefix twice, the second half not at all; a permutation would not do, since
  attention over post-RoPE keys ignores their order, nor would one row: it moves the output little), in the
  torch_native backend's extend; a request without a cache hit, and every decode step's own
  attention call, are untouched. Nothing raises: the server answers, only the numbers are wrong.
- `warm_prompt`: right cold, wrong warm (sglang PR #16053: GSM8K 0.950 on a first run, 0.485 on a
  second). A request whose whole prompt but its last token is served from the cache (sglang always
  computes one) reads the prefix's rows as `prefix_kv` does; a request that extends a shorter
  prefix (a few-shot prompt's shared examples, a teacher-forced text) is untouched.
- `decode_kv`: a decode-cache hit reads wrong rows (the class of sglang's kl_test_utils
  decode-cache-hit test, where a hybrid model's state saved at a decode step, the whole history in
  one, was wrong). The rows each decode step writes are remembered (a prefill that reuses a row
  forgets it); a request whose cached prefix holds such rows reads its whole prefix as `prefix_kv`
  does (wrong rows at only a few decoded positions of a 1,000-token prompt moved the numbers
  little). A hit on rows a prefill wrote, and every decode step, are untouched.
- `co_batch`: cross-request contamination. A prefill (the torch_native backend's extend) that runs
  while other requests are in the server (in the same prefill batch, or decoding in its running
  batch) adds to each token's attention output that of the token before it in the batch (across a
  request's start, another request's). A request alone in the server is untouched.
"""

import importlib.abc
import importlib.machinery
import os
import sys

PLANT = os.environ.get("REGRESS_PLANT", "")
SCHEDULER, TORCH_NATIVE = "sglang.srt.managers.scheduler", "sglang.srt.layers.attention.torch_native_backend"
TARGETS = {"scheduler_crash": {SCHEDULER}, "prefix_kv": {TORCH_NATIVE}, "co_batch": {SCHEDULER, TORCH_NATIVE},
           "warm_prompt": {TORCH_NATIVE}, "decode_kv": {TORCH_NATIVE}}
PENDING = set(TARGETS.get(PLANT, ()))
CROWDED = [False]  # co_batch: whether the batch being run shares the server with other requests
DECODED_ROWS: set[int] = set()  # decode_kv: KV rows a decode step wrote and no prefill has reused since


def _rotated_prefixes(req_to_token, req_pool_indices, extend_prefix_lens, extend_seq_lens=None):
    """A copy of the request-to-KV-row map in which each cache-hit prefix reads, at position i, the
    row of position i // 2: every position (`prefix_kv`), only for requests that extend their last
    token alone (`warm_prompt`), or only for prefixes that hold rows a decode wrote (`decode_kv`)."""
    import torch

    rows = req_to_token.clone()
    extends = extend_seq_lens.tolist() if extend_seq_lens is not None else [None] * len(req_pool_indices)
    for pool_index, prefix, extend in zip(req_pool_indices.tolist(), extend_prefix_lens.tolist(), extends, strict=True):
        if prefix <= 1 or (PLANT == "warm_prompt" and extend != 1):
            continue
        if PLANT == "decode_kv" and DECODED_ROWS.isdisjoint(req_to_token[pool_index, :prefix].tolist()):
            continue
        halves = torch.arange(prefix, device=rows.device) // 2
        rows[pool_index, :prefix] = req_to_token[pool_index, halves]
    return rows


def _plant(module):
    if PLANT == "co_batch" and module.__name__ == SCHEDULER:
        original_run = module.Scheduler.run_batch

        def run_batch(self, batch, *args, **kwargs):
            others = len(self.running_batch.reqs) if self.running_batch is not None else 0
            CROWDED[0] = batch.forward_mode.is_extend() and (len(batch.reqs) > 1 or others > 0)
            try:
                return original_run(self, batch, *args, **kwargs)
            finally:
                CROWDED[0] = False

        module.Scheduler.run_batch = run_batch
    if PLANT == "co_batch" and module.__name__ == TORCH_NATIVE:
        original_extend = module.TorchNativeAttnBackend._run_sdpa_forward_extend

        def crowded_extend(self, query, output, *args, **kwargs):
            result = original_extend(self, query, output, *args, **kwargs)
            if CROWDED[0]:
                output.add_(output.roll(shifts=1, dims=0))
            return result

        module.TorchNativeAttnBackend._run_sdpa_forward_extend = crowded_extend
    if PLANT in ("prefix_kv", "warm_prompt", "decode_kv"):
        backend = module.TorchNativeAttnBackend
        original = backend._run_sdpa_forward_extend

        def extend(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                   extend_prefix_lens, extend_seq_lens, *args, **kwargs):
            if int(extend_prefix_lens.max()) > 1:
                req_to_token = _rotated_prefixes(req_to_token, req_pool_indices, extend_prefix_lens, extend_seq_lens)
            return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                            extend_prefix_lens, extend_seq_lens, *args, **kwargs)

        backend._run_sdpa_forward_extend = extend
    if PLANT == "decode_kv":
        original_metadata = module.TorchNativeAttnBackend.init_forward_metadata

        def init_forward_metadata(self, forward_batch):
            written = forward_batch.out_cache_loc
            if written is not None:
                rows = {int(row) for row in written.tolist()}
                if forward_batch.forward_mode.is_decode():
                    DECODED_ROWS.update(rows)
                else:
                    DECODED_ROWS.difference_update(rows)
            return original_metadata(self, forward_batch)

        module.TorchNativeAttnBackend.init_forward_metadata = init_forward_metadata
    if PLANT == "scheduler_crash":
        def run_batch(self, *args, **kwargs):
            raise RuntimeError("planted scheduler crash (REGRESS_PLANT=scheduler_crash)")

        module.Scheduler.run_batch = run_batch


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PENDING:
            return None
        PENDING.discard(name)
        if not PENDING:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _plant(module)

        loader.exec_module = exec_module
        return spec


if PENDING:
    sys.meta_path.insert(0, _AfterImport())
