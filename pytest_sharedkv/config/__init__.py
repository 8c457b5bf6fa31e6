"""What a run is asked to do: options and their ini twins, markers, tier membership,
the extension registries, and gating (a test's needs into a lease or a precise skip)."""
