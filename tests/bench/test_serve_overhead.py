"""bench.serve.overhead's command line: it builds on `pdrelay bench serve`'s flags and refuses a bad --repeat."""

from __future__ import annotations

import argparse

from bench.serve.overhead import add_arguments, run


def test_takes_the_serve_flags_and_its_own() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    ns = p.parse_args(["--random-input-len", "128", "--max-concurrency", "16", "--repeat", "2"])
    assert (ns.random_input_len, ns.max_concurrency, ns.repeat) == (128, 16, 2)


def test_refuses_a_repeat_below_one(capsys) -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert run(p.parse_args(["--repeat", "0"])) == 2
    assert "--repeat 0 must be >= 1" in capsys.readouterr().err
