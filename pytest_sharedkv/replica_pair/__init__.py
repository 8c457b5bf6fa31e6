"""The replica_pair tier: A cold, then B from the shared pool, exact answers and hits,
with the fault-sensitivity (delay) cells and the model-free transfer check."""
