"""Pure-CPU continuous-batching scheduler (schedule() / update_from_output())."""

from shared.engine.scheduler.budget import SchedulerCounters
from shared.engine.scheduler.kv import KVManager
from shared.engine.scheduler.policy import POLICIES, WaitingQueue, sort_key
from shared.engine.scheduler.scheduler import Scheduler

__all__ = ["POLICIES", "KVManager", "Scheduler", "SchedulerCounters", "WaitingQueue", "sort_key"]
