"""Every process the suite starts, and how it dies with the run: the exec wrapper and
its watchdog, the launch records the next run reaps, managed sessions with logs and
readiness, and SIGTERM handled as Ctrl-C."""
