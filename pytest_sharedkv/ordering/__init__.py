"""The ordering tier: does each KV copy path honour the current CUDA stream?

A trial queues an imposed delay and a producer on a non-default stream, then runs the copy
under test while that stream is current, and compares every byte. A raw ``cudaMemcpy``
(no stream) is the negative control: if it does not fail under the delay, the probe cannot
see ordering faults and the run is void.
"""
