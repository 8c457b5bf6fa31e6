"""Repository-level pytest configuration: the self-tests drive pytest through pytester.

The sharedkv plugin itself is loaded through its ``pytest11`` entry point (the package is
installed, editable, by the README's commands); registering it here too would load it twice.
"""

pytest_plugins = ["pytester"]
