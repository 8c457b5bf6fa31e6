"""What a run reports: the records tiers emit, the run log built from pytest's reports,
and the terminal summary, Markdown tables, progress lines and JSON report made from it."""
