"""Models generated offline from a seed or by construction (tiny, copy, geometry), the
27B geometry they borrow, and the copy model's answer rule and corruption matrix."""
