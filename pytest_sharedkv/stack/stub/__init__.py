"""The launcher's test double, an OpenAI-compatible stub server: its HTTP face and command
line (`stub_openai.py`, launched as `python -m pytest_sharedkv.stack.stub.stub_openai`),
its cache model (`cache.py`) and its stand-ins for the LMCache server's hooks
(`fault_standins.py`)."""
