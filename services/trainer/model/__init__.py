"""The model and what keeps it: DLRM, losses, dense normalization, precision, the batch's
double-buffered staging to the GPU, pass metrics, the LR policy, checkpoints, saves, exports,
online publishing, the model's lineage and pass log.

Imports nothing of the runner or the agent (contract ``trainer-layers``).
"""
