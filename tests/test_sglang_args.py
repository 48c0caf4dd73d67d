"""The serving stack's real argument parser is importable where the test extras are installed
(SGLang with --no-deps), and enforces its own choices: the ground truth a serving emitter checks."""
import argparse

import pytest

server_args = pytest.importorskip("sglang.srt.server_args", reason="sglang not installed (pip install --no-deps sglang==0.5.23)")


def test_server_args_parse_parallel_flags():
    p = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(p)
    a = p.parse_args(["--model-path", "/nonexistent", "--tp-size", "2", "--ep-size", "2",
                      "--moe-a2a-backend", "deepep"])
    assert (a.tp_size, a.ep_size, a.moe_a2a_backend) == (2, 2, "deepep")
    with pytest.raises(SystemExit):
        p.parse_args(["--model-path", "/nonexistent", "--moe-a2a-backend", "no-such-backend"])
