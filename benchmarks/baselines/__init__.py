"""Peer compressors over the same Horovod: Top-k and PowerSGD with residual memory."""
