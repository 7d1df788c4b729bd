"""Step-time model: a predicted training step time from the traced ops (not a roofline bound).

    comm.py           NCCL all-reduce / reduce-scatter / all-gather time by bytes, ranks and link
"""
