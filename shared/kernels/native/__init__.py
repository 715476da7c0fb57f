"""Native (C) CPU kernels, compiled for the host on first use; see build.py."""
