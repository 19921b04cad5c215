"""An sglang-compatible simulated server, driven by a world file.

It takes `sglang.launch_server`'s argv, resolves defaults as sglang does (including sglang's quiet
surprises), serves sglang's HTTP routes, and answers GSM8K questions correctly or not according to
the world: per-model accuracy, per-configuration drift, bugs keyed on flag combinations and prefix
cache hits, a latency and capacity model, and injectable faults. It is the engine behind dry runs
and the tests; `python -m harness.sim --help` lists its flags.
"""
