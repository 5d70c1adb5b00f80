"""What the throughput and time-to-accuracy workers share: method names, DDP variants, models, phase timing."""
