"""Fault injection for rehearsing failures with the real code path (--fault-injection). Each fault fires at one
well-defined point of a hand-off; a crash is an immediate process exit, as a kill -9 or an OOM would be."""

from __future__ import annotations

import asyncio
import logging
import os

from shared.config.choices import Fault

log = logging.getLogger(__name__)

CRASH_EXIT_CODE = 137  # what a SIGKILLed process reports


class Faults:
    """The one fault this process injects (--fault-injection / --encoder-fault-injection; Fault.NONE: none).

    Every check takes a Fault: a name that is not one (a typo) raises ValueError instead of never firing."""

    def __init__(self, name: Fault | str, instance_id: str) -> None:
        self.fault = Fault(name)
        self.instance_id = instance_id

    def active(self, fault: Fault) -> bool:
        return self.fault is Fault(fault)

    def crash_if(self, fault: Fault) -> None:
        if self.active(fault):
            log.error("%s: fault injection %s: exiting now", self.instance_id, fault)
            logging.shutdown()
            os._exit(CRASH_EXIT_CODE)

    async def hang_if(self, fault: Fault, seconds: float) -> None:
        if self.active(fault):
            log.error("%s: fault injection %s: stalling %.1f s", self.instance_id, fault, seconds)
            await asyncio.sleep(seconds)
