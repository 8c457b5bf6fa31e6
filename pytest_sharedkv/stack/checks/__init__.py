"""The model-free checks on the real LMCache server, no engine: the transfer check
(`transfer_provider.py`), the L2 transfer and the two-writers write-failure cell across
hosts (`l2_transfer.py`), LMCache #4991's write race (`l2_write_race.py`) and the identity
tier's runs (`identity_transfer.py`)."""
