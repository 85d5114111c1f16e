"""``python -m phalanx``, as ``python -m timm``-style scripts are run (``torchrun -m phalanx train ...``)."""

from .cli import entry

entry()
