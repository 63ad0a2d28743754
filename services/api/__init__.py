"""Control plane: FastAPI on Redis."""
