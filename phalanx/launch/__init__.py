"""Starting processes: ``phalanx trainlaunch`` through torchrun, in process (``torchrun``), the program
each worker runs (``worker``), what phalanx adds to torchrun's rendezvous (``rendezvous``), and
``phalanx scale``'s measurements at several world sizes (``scale``).

May import training and every layer below it; never the commands, inference or visualize.
"""
