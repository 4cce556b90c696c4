"""SCOPE-MARL: RL for LLM agents against populations of LLM user simulators."""

import os

# Large tensors (model weights, KV caches, the learner's activations) go on transparent huge pages:
# torch's CPU allocator asks for them (madvise) when this is set at its first large allocation,
# which comes after this import. A page fault then maps 2 MB instead of 4 KB. Where memory is
# costly to touch the first time (a VM whose host backs guest memory lazily), the first GRPO update
# of bench/train_step.py took 25 s instead of 33 s, with 9.6 instead of 22 CPU-seconds in the
# kernel. THP_MEM_ALLOC_ENABLE=0 in the environment turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
