"""What training reads: the batch, the TSV and schema formats, a run's passes over the
streaming layout, negative sampling.

Imports nothing of ``streamrec.trainer.model``, the runner or the agent (contract
``trainer-layers``).
"""
