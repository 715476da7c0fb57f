"""Typed transfer errors: callers branch on the type, operators read the message (it names the value and the fix)."""

from __future__ import annotations


class TransferError(RuntimeError):
    """A transfer engine operation failed (base class of every error this package raises)."""


class TransferTimeout(TransferError):
    """`wait()` ran out of time; the transfer may still complete later (it is not cancelled)."""


class BackendUnavailable(TransferError):
    """The requested backend cannot be imported or started here; the message carries the install command."""


class PeerError(TransferError):
    """A peer endpoint is malformed, unreachable, of another backend, or was never connected."""


class RegionError(TransferError):
    """A descriptor points outside registered memory (never registered, deregistered, or out of bounds)."""
