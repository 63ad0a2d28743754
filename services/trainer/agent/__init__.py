"""The trainer under the control plane: each rank's loop and steps, pool membership, the
command line, liveness (heartbeat, watchdog, SIGTERM), the job guard and the pod entry.

Nothing else in the trainer imports this package (import contract ``trainer-layers``).
"""
