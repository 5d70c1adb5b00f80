"""Accuracy report: dense Horovod against PacTrain at several sparsities."""
