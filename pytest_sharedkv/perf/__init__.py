"""The performance tier: paired ON/OFF screenings of a replica pair (blocks OFF-ON-ON-OFF),
the physical floor of a cross-replica transfer, and the analysis and the pre-upgrade
compare that read what a screening recorded. Nothing here imports torch or matplotlib at
load."""
