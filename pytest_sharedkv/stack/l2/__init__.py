"""The L2 that the hosts topology's servers share: its backends (`backends.py`), the Redis
server the suite starts (`redis_server.py`), and what a server logs about it (`log.py`)."""
