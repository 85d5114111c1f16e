"""Using what was trained: ``evaluate``, ``predict`` and ``export`` from a checkpoint alone
(``evaluate``, ``predict``, ``export``; the checkpoint read back as a task and its networks:
``model``; where they may write: ``outputs``). May import training, the tasks and every layer
below; never the commands, ``launch`` or ``visualize``. What each task does is its own
(``Task.Inference``): the loops here are the same for every task.

The checkpoint holds the run's configuration and what its data resolved to (classes, image size,
normalisation), so the model is rebuilt by name (user factories too, imported as in training),
its weights load with ``weights_only=True``, and images are prepared exactly as for validation.
"""
