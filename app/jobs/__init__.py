"""Long-running jobs: the task queue (Huey), the job runner and the kinds of job.

* :mod:`app.jobs.queue`: the Huey instance (a SQLite file by default, Redis when
  ``PRIORLY_REDIS_URL`` is set) with one task, ``priorly.run_job(job_id)``, and the
  consumers (``priorly worker``, or threads inside ``priorly serve``).
* :mod:`app.jobs.runner`: claims a job row, runs its kind with progress, heartbeat and
  cancellation, stores the result; finds jobs whose worker died and queues them again.
* :mod:`app.jobs.kinds`: the registry from job kind to the function that does the work.

The ``job`` table is the source of truth (state, progress, result); the queue only carries
job ids. A message delivered twice is harmless: a job is claimed by one atomic update.
"""
