"""``python -m pytest_sharedkv`` subcommands besides the suite itself."""
