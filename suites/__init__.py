"""The pytest-sharedkv regression suite (shipped as ``pytest_sharedkv.suites``).

Run it from a checkout with ``pytest -m <tier>``, or from an installed package with
``python -m pytest_sharedkv -m <tier>`` (which runs ``pytest --pyargs pytest_sharedkv.suites``).
"""
