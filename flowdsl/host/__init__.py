"""The host side's contract, shared by the GPU runtime (:mod:`flowdsl.runtime`) and the simulator
(:mod:`flowdsl.sim`): argument checks, device arrays (PyTorch's included), what ``stream=`` means, and the wait limit.

Both sides import these and nothing of each other, so the same bad input gets the same error
on either, and neither layer reaches into the other (a test walks every import). Nothing here
imports numba, NCCL or a GPU framework at import time.
"""
