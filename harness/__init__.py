"""Accuracy-regression service for sglang.

The packages follow the data flow (docs/design.md):

    suite -> run (scheduling, ray) -> engine (server) + benchmark (evaluator) -> gate -> results (sinks) -> analysis

`suite` validates a suite and expands it into cells, `run` schedules each cell on Ray and gates it,
`engine` launches and verifies a server (real sglang or the simulator in `sim`), `benchmark` asks and
scores its questions (GSM8K in `benchmark.gsm8k`), `gate` turns answers into verdicts, `results`
writes what people read (folder, MLflow, console), and `analysis` compares runs and draws the
dashboard; `cli` is the command line, `bisect` the commit search.
"""

__version__ = "0.1.0"
