"""The delivery-guarantees demo as a Celery task (started from the dashboard's demo page)."""
from celery import shared_task

from consumers.demo.runs import RUN_DEMO_TASK


@shared_task(name=RUN_DEMO_TASK, ignore_result=True)
def run_demo_task(run_id: str, records: int, crash_probability: float, seed: int):
    """Run the classic example through the demo pipelines with crashes; progress goes to Redis.
    Not retried: a half-finished demo is reported as failed and the user starts a new one."""
    from consumers.demo.runs import run

    state = run(run_id, records, crash_probability, seed)
    return {"run_id": run_id, "state": state.get("state")}
