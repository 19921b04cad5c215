"""Accuracy-regression service for sglang.

The package follows the data flow:

    config -> matrix -> orchestration -> engine (server) + gsm8k (evaluator) -> gate -> sinks

`config` validates a suite, `matrix` expands it into cells, `orchestration` runs each cell on Ray,
`engine` launches and verifies a server (real sglang or the simulator in `sim`), `gsm8k` scores it,
`gate` turns scores into verdicts, and `store` / `tracking` / `report` write what people read.
"""

__version__ = "0.1.0"
