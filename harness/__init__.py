"""Accuracy-regression service for sglang.

The packages follow the data flow (docs/design.md):

    suite -> run (scheduling, ray) -> engine (server) + gsm8k (evaluator) -> gate -> results (sinks) -> analysis

`suite` validates a suite and expands it into cells, `run` schedules each cell on Ray and gates it,
`engine` launches and verifies a server (real sglang or the simulator in `sim`), `gsm8k` scores it,
`gate` turns scores into verdicts, `results` writes what people read (folder, MLflow, console), and
`analysis` compares runs and draws the dashboard; `cli` is the command line, `bisect` the commit search.
"""

__version__ = "0.1.0"
