"""PacTrain for Horovod: prune to a mask every rank shares, all-reduce only the survivors."""

__version__ = "0.1.0"
