"""What phalanx adds to torchrun's rendezvous and environment, where the user named nothing: a free
port on one node, the workers' CPU threads, and a way around a rendezvous bug of older torch."""

from __future__ import annotations

import argparse
import contextlib
import os
import uuid
from collections.abc import Iterator


@contextlib.contextmanager
def launch_environment(threads: int | None, rank_may_change: bool) -> Iterator[None]:
    """Variables the agent and its workers read, set only where the user left them unset, and taken
    back afterwards: a caller in this process (``phalanx.cli.main``, the tests) keeps its environment.
    ``threads``: CPU workers' threads, from their first instruction (torchrun would pick 1 and warn)."""
    wanted = {}
    if threads is not None:
        wanted["OMP_NUM_THREADS"] = str(threads)
    if rank_may_change and store_sharing_fails_on_a_new_rank_0(torch_version()):
        wanted["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    added = [name for name in wanted if name not in os.environ]
    os.environ.update({name: wanted[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def torch_version() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def store_sharing_fails_on_a_new_rank_0(version: tuple[int, int]) -> bool:
    """torch 2.11 and 2.12's c10d rendezvous fails with a bare AssertionError where a node that was
    not rank 0 becomes rank 0 in a later round (a node lost in an elastic run: seen on the GPU machine's
    2.11, reproduced here with 2.11's wheel), when the agent shares its store with the workers; 2.13
    fixed it (pytorch#182375). Without the sharing (the workers' rank 0 hosts their store) it works."""
    return version < (2, 13)


def on_a_free_port(args: argparse.Namespace) -> None:
    """What torch 2.14's torchrun does on one node where no port is named (its parser leaves the port
    None there; older ones default it to 29500): a rendezvous of this machine's at a port the store
    binds itself (port 0), so no other process can take it first."""
    if args.master_port is not None:
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
