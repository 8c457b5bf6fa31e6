"""Code that runs only inside processes the suite launched (engines, the LMCache server,
the stub), loaded there by ``inject/sitecustomize.py``: the delay, corrupt and KV-audit
hooks and the post-import wrapper they share. The launcher imports only their names."""
