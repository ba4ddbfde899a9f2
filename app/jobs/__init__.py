"""Long-running jobs: the kinds of job, the task queue, the runner and the workers.

Producer side (the web app, :mod:`app.services.jobs`), which imports no job code:

* :mod:`app.jobs.registry`: the kinds of job (name → label, payload parameters).
* :mod:`app.jobs.queue`: the Huey instance (a SQLite file by default, Redis when
  ``PRIORLY_REDIS_URL`` is set) with one task, ``priorly.run_job(job_id)``.

Consumer side (``priorly worker``, or threads inside ``priorly serve``):

* :mod:`app.jobs.worker`: consumers and the reaper; connects the queue to the runner.
* :mod:`app.jobs.runner`: claims a job row, runs its function with progress, heartbeat
  and cancellation, stores the result; finds jobs whose worker died.
* :mod:`app.jobs.context`: :class:`~app.jobs.context.JobContext`, what a job function gets.
* :mod:`app.jobs.tasks`: the job functions (they call the services).

The ``job`` table is the source of truth (state, progress, result); the queue only carries
job ids. A message delivered twice is harmless: a job is claimed by one atomic update.
"""
