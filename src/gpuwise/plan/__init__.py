"""Plan: predict a training step's memory, FLOPs and time without a GPU."""
