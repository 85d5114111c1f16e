"""What phalanx asks of the system it runs on: files written atomically (``atomic``: readers never
see half a file), the cores a process may use (``cores``: its CPU affinity and its cgroup's quota),
and a user's modules imported by name (``plugins``: model factories, tasks, transfer functions;
the current directory first, never ``exec``).

Standard library only; imports nothing of phalanx but ``phalanx.errors`` (the base of the layers in
``setup.cfg``).
"""
