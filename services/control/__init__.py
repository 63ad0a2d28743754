"""The contract between the control plane (``streamrec.api``) and the trainers.

Both sides import this package and nothing of each other:

* :mod:`~streamrec.control.keys` every Redis key (jobs, passes, work, commands, reports, the
  trainer pool);
* :mod:`~streamrec.control.states` job, pass and trigger states;
* :mod:`~streamrec.control.records` the job hash, the pass record and the trigger, one codec
  each; :mod:`~streamrec.control.work` a pass handed out (the work stream);
  :mod:`~streamrec.control.commands` a command (the command stream);
  :mod:`~streamrec.control.reports` what a trainer group reports (the report stream);
  :mod:`~streamrec.control.codec` the typed field checks every codec shares;
* :mod:`~streamrec.control.channel` the trainers' side of the channel (work items, commands,
  reports, heartbeats); :mod:`~streamrec.control.pool` the trainer pool (registrations,
  assignments, namespaces to free);
* :mod:`~streamrec.control.trainer_config` the trainer config schema a job implies (the API
  validates a job's with it at create time; the trainer parses the same), its sections in
  :mod:`~streamrec.control.runner_config`, :mod:`~streamrec.control.model_config` and
  :mod:`~streamrec.control.runtime_config`, their bounds in
  :mod:`~streamrec.control.config_bounds`, the data's features in
  :mod:`~streamrec.control.feature_schema`;
* :mod:`~streamrec.control.redis_io` the typed Redis calls both sides make.
"""
