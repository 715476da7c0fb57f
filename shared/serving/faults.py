"""Fault injection for rehearsing failures with the real code path (--fault-injection). Each fault fires at one
well-defined point of a hand-off; a crash is an immediate process exit, as a kill -9 or an OOM would be."""

from __future__ import annotations

import asyncio
import logging
import os

log = logging.getLogger(__name__)

CRASH_EXIT_CODE = 137  # what a SIGKILLed process reports


class Faults:
    def __init__(self, name: str, instance_id: str) -> None:
        self.name = name
        self.instance_id = instance_id

    def active(self, name: str) -> bool:
        return self.name == name

    def crash_if(self, name: str) -> None:
        if self.name == name:
            log.error("%s: fault injection %s: exiting now", self.instance_id, name)
            logging.shutdown()
            os._exit(CRASH_EXIT_CODE)

    async def hang_if(self, name: str, seconds: float) -> None:
        if self.name == name:
            log.error("%s: fault injection %s: stalling %.1f s", self.instance_id, name, seconds)
            await asyncio.sleep(seconds)
