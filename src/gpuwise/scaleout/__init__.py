"""Data parallelism done the standard way: torchrun + DistributedDataParallel, with measured scaling.

launch.py     pick GPUs (or CPU ranks), compute torchrun's arguments and environment, run it
backend.py    the one seam to torchrun and torch.distributed
train.py      the built-in DDP training loop (run by worker.py on every rank)
checkpoint.py atomic checkpoints a restarted job resumes from
scale.py      samples/s and efficiency at 1, 2, 4... ranks; compute vs communication per step
job.py        parent side: write the job, launch torchrun, read rank 0's result
dataparallel.py  nn.DataParallel detection and why DDP is preferred
"""
