"""``from phalanx.fields import option``: where a task of your own written before the package was
rebuilt into folders took ``option`` from; ``from phalanx.tasks import option`` is the task API's
name for it now, and ``phalanx.config.fields`` holds it. Nothing in phalanx imports this module."""

from .config.fields import option

__all__ = ["option"]
