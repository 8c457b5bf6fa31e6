"""The launcher's test double, an OpenAI-compatible stub server (`stub_openai.py`,
launched as `python -m pytest_sharedkv.stack.stub.stub_openai`): its HTTP face and command
line, its cache model and its stand-ins for the LMCache server's hooks."""
