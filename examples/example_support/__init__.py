"""What the examples, the benchmarks and the cluster check share, and the library never imports.

- ``data``: Fashion-MNIST and the King James text, read from installed packages.
- ``progress``: rank 0's progress bar / log lines.
- ``cli``: the examples' PacTrain flags and the schedule they ask for.
- ``torch_reporting``: TensorBoard scalars and wire-byte tallies of the PyTorch examples.

``tests/unit/test_layout.py`` holds ``pactrain_hvd.core``, ``.torch`` and ``.tensorflow`` to that.
Imported by name (``from example_support.data import ...``): an example run as a script finds it beside
itself; ``benchmarks`` and ``docker/cluster_check.py`` put ``examples/`` on ``sys.path``.
"""
