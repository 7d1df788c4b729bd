"""Deep models: the step of L identical blocks from traces of a few blocks.

`repeat.py` rebuilds the events of L blocks exactly from 3- and 4-block traces (`repeat_tags.py` says which
block each event belongs to); `scaled.py` extrapolates from 1 and 2 blocks for `fit`'s many variants.
"""
