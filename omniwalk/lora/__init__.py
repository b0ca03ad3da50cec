"""LoRA adapters of the thinker: PEFT checkpoints read into host tensors (``adapters``), a fixed pool of
device slots they are swapped into (``pool``), and the batched op that applies them after a projection
(``ops.add_lora``; its Triton kernels in ``omniwalk/kernels/lora.py``)."""
