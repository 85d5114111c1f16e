"""Using what was trained: ``evaluate``, ``predict`` and ``export`` from a checkpoint alone.

The checkpoint holds the run's configuration and what its data resolved to (classes, image size,
normalisation), so the model is rebuilt by name (user factories too, imported as in training),
its weights load with ``weights_only=True``, and images are prepared exactly as for validation.
"""
