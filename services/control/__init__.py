"""The contract between the control plane (``streamrec.api``) and the trainers.

Both sides import this package and nothing of each other:

* :mod:`~streamrec.control.keys` every Redis key (jobs, passes, work, commands, reports, the
  trainer pool);
* :mod:`~streamrec.control.states` job, pass and trigger states;
* :mod:`~streamrec.control.channel` the trainers' side of the channel (work items, commands,
  reports, heartbeats);
* :mod:`~streamrec.control.trainer_config` the trainer config schema a job implies (the API
  validates a job's with it at create time; the trainer parses the same);
* :mod:`~streamrec.control.redis_io` the typed Redis calls both sides make.
"""
