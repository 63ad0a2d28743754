"""DLRM trainer workers: streaming passes, predict-then-train AUC, checkpoints."""
