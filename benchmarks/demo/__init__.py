"""``make demo``: dense Horovod, then PacTrain, on an emulated link."""
