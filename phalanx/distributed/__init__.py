"""Devices and process groups: where a process trains (``devices``, ``cluster``: torchrun's, SLURM's
and Open MPI's variables), one strategy per parallel mode with the same methods (``strategy``:
one device, DataParallel, DDP; ``fsdp``: sharded; ``strategies`` makes the one a plan asks for),
the collectives they lend (``gather_rows``, ``sync_norm``, ``rank_buffers``, ``comm_clock``), the
blocks FSDP shards apart (``blocks``), and processes that end cleanly (``processes``, ``failures``).

May import data, records, the configuration and the base modules; never the checkpoint format,
models, tasks or training above it (``setup.cfg``'s import contracts). Importing this package
imports no torch: ``visualize`` uses ``processes``.
"""
