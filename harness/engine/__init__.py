"""Launching and verifying a server for one cell: argv, process lifetime, resolved configuration.

The sglang engine and the simulator share everything here but the module they start
(`sglang.launch_server` or `harness.sim`) and the simulator's two environment variables.
"""
