"""A follower rank (1..tp-1): load this rank's shard, then run every step rank 0 broadcasts (and take part in the
page exchanges it announces on the same broadcast), until it says stop.

Run as `python -m shared.engine.parallel.follower '<RankArgs JSON>'` by rank 0 (ranks.py). Why the other ranks
follow a broadcast batch instead of running their own scheduler: a scheduler's decisions depend on timing (when a
request arrives, a cancel, a hand-off's pages) that only rank 0 sees, so replicated schedulers would drift and then
deadlock in a collective; a broadcast batch is the same on every rank by construction, and it costs two small
broadcasts per step.
"""

from __future__ import annotations

import ctypes
import signal
import sys

import torch

from shared.engine.model_runner import ModelRunner
from shared.engine.models import load_model_config
from shared.engine.parallel import batch_wire, kv_exchange
from shared.engine.parallel.batch_wire import PageCommand
from shared.engine.parallel.group import GroupAddress, join, leave
from shared.engine.parallel.ranks import RankArgs, ready_key
from shared.engine.parallel.shard import rank_shard

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when rank 0 dies (however it dies), so no orphan holds a GPU or cores."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the broken connections to rank 0 end this process instead


def run(args: RankArgs) -> None:
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(args.device))  # nccl runs on the current device
    joined = join(GroupAddress(args.port, args.size, args.backend, args.timeout_s), args.rank)
    runner = ModelRunner(
        args.model_dir,
        dtype=args.dtype,
        device=args.device,
        num_pages=args.num_pages,
        kv_budget_bytes=args.kv_budget_bytes,
        page_size=args.page_size,
        attention_backend=args.attention_backend,
        linear_backend=args.linear_backend,
        max_batch_tokens=args.max_batch_tokens,
        context_length=args.context_length,
        shard=rank_shard(load_model_config(args.model_dir), joined.handle),
    )
    joined.store.set(ready_key(args.rank), "1")
    while True:
        msg = batch_wire.receive(joined.control, runner.device)
        if msg is None:
            break
        if isinstance(msg, PageCommand):  # a hand-off's or the kvstore's pages, between steps (kv_exchange.py)
            kv_exchange.serve(msg, runner.kv, joined.control)
            continue
        runner.forward_batch(msg)  # the logits are rank 0's to sample; the collectives inside need every rank
    leave()


def main() -> None:
    _die_with_parent()
    run(RankArgs.decode(sys.argv[1]))


if __name__ == "__main__":
    main()
