"""What the examples, the benchmarks and the cluster check share, and the library never imports.

- ``data``: Fashion-MNIST and the King James text, read from installed packages.
- ``progress``: rank 0's progress bar / log lines.
- ``torch_reporting``: TensorBoard scalars and wire-byte tallies of the PyTorch examples.

``tests/unit/test_layout.py`` holds ``pactrain_hvd.core``, ``.torch`` and ``.tensorflow`` to that.
"""
