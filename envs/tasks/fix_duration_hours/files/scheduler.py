"""Job scheduler: each job has an interval string."""
from duration import parse_duration

JOBS = {"cleanup": "1h", "report": "1d", "heartbeat": "30s"}


def next_run(job, last_run):
    return last_run + parse_duration(JOBS[job])
