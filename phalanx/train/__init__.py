"""Training: one process's run from a ``RunConfig`` (``run``), the loop (``trainer``) and the parts
it holds and calls (``checkpointing``'s ``Checkpointer``, ``validation``'s ``Validator``, ``state``'s
registry of stateful parts, ``losses``, ``step_times``, ``best``), what the trainer lends a task
(``context``), optimizers and schedules (``optim``), divergence checks, progress, what rank 0 records
(``outputs``), graceful stops (``preempt``) and the checks before a run (``memory_plan``,
``single_rows``).

May import the tasks and every layer below them (models, checkpoint, distributed, data, records,
config); never the commands, inference, visualize or launch (``setup.cfg``'s import contracts).
"""
