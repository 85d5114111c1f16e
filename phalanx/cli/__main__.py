"""``python -m phalanx.cli ARGS``: the command line, as the ``phalanx`` script runs it."""

from . import entry

entry()
