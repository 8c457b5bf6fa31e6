"""Loaded by launched processes whose PYTHONPATH starts with this directory: turns on
pytest-sharedkv's fault-sensitivity mode when SHAREDKV_INJECT_DELAY_CYCLES is set."""

import os

if os.environ.get("SHAREDKV_INJECT_DELAY_CYCLES"):
    from pytest_sharedkv.replicas.delay_hook import install

    install()
